"""flm report scaling|layouts|errors: tables (CSV, Markdown) and figures (PNG, PDF) from the
results database, from the cost model, or both side by side."""

from __future__ import annotations

import argparse

from frontier_llm.cli import allocation as alloc_cli
from frontier_llm.cli.common import add_command, db_parent
from frontier_llm.cli.numbers import gpus

_SWEEP_HELP = ("a sweep name in the database, or a sweep file (sweeps/NAME.yaml): its points "
               "are predicted by the cost model and joined with the database's runs of that "
               "sweep, so points with no run show as missing")


def _written(paths) -> None:
    for p in paths:
        print(f"wrote {p}")


def _scaling(args: argparse.Namespace) -> int:
    from frontier_llm.report.render import scaling_report
    from frontier_llm.report.sources import sweep_report_frame

    frame, name = sweep_report_frame(args.sweep, args.db, model_only=args.model_only)
    source = "predicted" if args.model_only else "both" if args.predicted else "measured"
    table, paths = scaling_report(frame, args.out, f"{name}-scaling", source=source,
                                  mode=args.mode, gpu_label=args.gpu_label)
    _written(paths)
    for series, t in table.groupby("series", sort=False):
        last = t.iloc[-1]
        if t["gpus"].nunique() < 2:
            times = [f"{c.split('_')[0] if c != 'step_time_s' else 'measured'} "
                     f"{last[c]:.3g} s" for c in ("step_time_s", "predicted_step_time_s")
                     if c in t and last[c] == last[c]]
            print(f"{series}: one point ({int(last['gpus'])} {args.gpu_label}), no scaling "
                  f"efficiency; step time {', '.join(times) or 'not measured'}")
            continue
        parts = [f"{c.split('_')[0]} {last[c]:.1f} %" for c in (
            "measured_efficiency_pct", "predicted_efficiency_pct") if c in t and last[c] == last[c]]
        mark = last.get("efficiency_mark") or ""
        print(f"{series}: {t['mode'].iloc[0]}-scaling efficiency at {int(last['gpus'])} "
              f"{args.gpu_label}: {', '.join(parts) or 'not measured'}"
              + (f" (measured: {mark})" if isinstance(mark, str) and mark else ""))
    return 0


def _layouts(args: argparse.Namespace) -> int:
    from frontier_llm.report.frames import at_world_size
    from frontier_llm.report.render import layouts_report
    from frontier_llm.report.sources import rank_memory, sweep_report_frame

    frame, name = sweep_report_frame(args.sweep, args.db, model_only=args.model_only)
    report = f"{name}-layouts"
    if args.gpus is not None:
        frame = at_world_size(frame, args.gpus)
        report += f"-{args.gpus}gpus"  # beside the report of every size, not over it
    ranks = None if args.model_only else rank_memory(args.db, name)
    table, paths = layouts_report(frame, args.out, report,
                                  require_measured=not args.model_only, rank_memory=ranks,
                                  log=args.log)
    _written(paths)
    print(f"{len(table)} layouts, {int(table['completed'].sum())} completed runs")
    return 0


def _errors(args: argparse.Namespace) -> int:
    from frontier_llm.report.render import errors_report
    from frontier_llm.report.sources import validation_runs

    validation = validation_runs(args.db, args.sweep, args.costmodel_version)
    name = f"{args.sweep}-errors" if args.sweep else "errors"
    table, paths = errors_report(validation, args.out, name)
    _written(paths)
    overall = table.iloc[-1]
    print(f"{int(overall['runs'])} runs compared: step-time MAPE "
          f"{overall['step_time_mape_pct']:.1f} %, memory MAPE {overall['memory_mape_pct']:.1f} %")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "report", "scaling, layout and error reports: CSV, Markdown, PNG and PDF",
        "Reports from the results database, the cost model, or both side by side. Each writes "
        "NAME.csv (every column), NAME.md (the main ones) and NAME.png / NAME.pdf into --out. "
        "A sweep without completed runs, a database without the sweep, or a single point "
        "(no scaling to compute) is refused with one line and exit 2; nothing is written.",
        ["flm report scaling --sweep frontier-175b-weak --predicted --out reports/",
         "flm report scaling --sweep sweeps/frontier-1t-strong.yaml --model-only --out r/",
         "flm report layouts --sweep tiny-cpu --out reports/",
         "flm report errors --out reports/"],
    )
    actions = p.add_subparsers(dest="report_command", metavar="REPORT")
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])  # `flm report` alone: its help
    db = db_parent()

    def common(q: argparse.ArgumentParser, sweep_required: bool = True) -> None:
        q.add_argument("--sweep", required=sweep_required, metavar="NAME|FILE.yaml",
                       help=_SWEEP_HELP if sweep_required else "only runs of this sweep")
        q.add_argument("--out", required=True, metavar="DIR", help="folder for the report files")

    s = add_command(
        actions, "scaling", "weak- or strong-scaling efficiency of a sweep",
        "One row per model-parallel recipe and GPU count: the median step time of its runs "
        "and their spread, throughput per GPU and the efficiency against the smallest GPU "
        "count, measured and (--predicted) the cost model's beside it. Weak scaling (global "
        "batch grows with the GPUs) or strong (fixed global batch) is read from the runs "
        "unless --mode says. Failed runs and missing points are shown, not dropped.",
        ["flm report scaling --sweep frontier-175b-weak --out reports/",
         "flm report scaling --sweep sweeps/frontier-175b-strong.yaml --db runs/flm.db "
         "--predicted --out reports/"],
        parents=[db])
    common(s)
    s.add_argument("--predicted", action="store_true",
                   help="draw the cost model's prediction for the same layouts beside the "
                        "measurements")
    s.add_argument("--model-only", action="store_true",
                   help="predictions only, no database (needs a sweep file)")
    s.add_argument("--mode", choices=("auto", "weak", "strong"), default="auto",
                   help="weak or strong scaling (default: from the global batches)")
    s.add_argument("--gpu-label", default="GPUs",
                   help="what a GPU is called on the x axis (e.g. GCDs on Frontier)")
    s.set_defaults(func=_scaling)

    q = add_command(
        actions, "layouts", "throughput and memory per layout, measured beside predicted",
        "One row per layout of the sweep: its runs and their status, median throughput per "
        "GPU, measured peak memory, the predictions and their errors; a second figure breaks "
        "the predicted memory per rank into parameters, gradients, optimizer states, "
        "activations and buffers. --gpus keeps the layouts of one world size, so that "
        "layouts are compared on equal footing (NAME-layouts-Ngpus files).",
        ["flm report layouts --sweep frontier-22b-explore --out reports/",
         "flm report layouts --sweep tiny-cpu --gpus 4 --out reports/",
         "flm report layouts --sweep sweeps/frontier-22b-explore.yaml --model-only --out r/"],
        parents=[db])
    common(q)
    q.add_argument("--gpus", type=gpus, default=None, metavar="N",
                   help="only the layouts on N GPUs in all (tp x cp x pp x dp; Frontier: GCDs); "
                        "a size no layout of the sweep uses is refused, naming those it uses")
    q.add_argument("--model-only", action="store_true",
                   help="predictions only, no database (needs a sweep file)")
    q.add_argument("--log", action="store_true",
                   help="throughput on a log axis: measured and predicted bars stay readable "
                        "together when the model is off by a large factor (an uncalibrated "
                        "system) or the layouts are an order of magnitude apart")
    q.set_defaults(func=_layouts)

    e = add_command(
        actions, "errors", "predicted against measured, per system and engine",
        "Every completed run with a prediction: the signed error of the predicted step time "
        "and peak memory; per system and engine the MAPE, bias and largest error, and a "
        "predicted-vs-measured figure.",
        ["flm report errors --out reports/", "flm report errors --sweep tiny-cpu --out r/"],
        parents=[db])
    common(e, sweep_required=False)
    e.add_argument("--costmodel-version", metavar="V",
                   help="compare with this cost-model version's predictions (default: the one "
                        "each run's trace carried)")
    e.set_defaults(func=_errors)

    a = add_command(
        actions, "plan", "time to train and node-hours for a token budget, with error bands",
        "For a token budget, the planner's best layout at each power-of-two GPU count: days to "
        "train and node-hours against the GPU count with their intervals (the cost model's "
        "out-of-sample error), the deadline line if given: NAME.csv, NAME.md, NAME.png and "
        "NAME.pdf, NAME = MODEL-SYSTEM-plan (docs/planner.md, 'Planning an allocation').",
        ["flm report plan --model gpt-1t --system frontier --tokens 20T --deadline 120d "
         "--out reports/",
         "flm report plan --model gpt-175b --system dgx-h100 --tokens 300B --curve 64-4096 "
         "--out r/"])
    alloc_cli.add_report_arguments(a)
    a.set_defaults(func=alloc_cli.run_report_plan)
