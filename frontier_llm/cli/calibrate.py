"""flm calibrate: microbenchmarks -> fitted system YAML, and the closed loop over measured runs.

    flm calibrate run --nproc 4 --system cpu-local --out my-cpu.yaml     # measure here and fit
    flm calibrate submit --system frontier --nodes 2                    # the same as a SLURM job
    flm calibrate fit RESULTS.json --system frontier --out frontier-cal.yaml
    flm calibrate --from-runs --sweep S --system my-cpu.yaml [--db URL]  # refit from runs, k-fold
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from frontier_llm.cli.common import add_command, emit_frame, emit_json
from frontier_llm.cli.numbers import MAX_GPUS, MAX_LOCAL_RANKS, count, count_list, seconds
from frontier_llm.errors import UserError


def _err(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _size(text: str) -> int:
    """'1K', '16M', '1G' or a plain number of bytes, at most 1 TiB (a message no link sends)."""
    from frontier_llm.bench.memlimit import parse_bytes

    try:
        value = int(parse_bytes(text))
    except (UserError, ValueError, OverflowError):
        value = 0  # parse_bytes's message names --memory-limit; say it for this option
    if not 1 <= value <= 2**40:
        raise argparse.ArgumentTypeError(
            f"a size such as 16M or 1G, between 1 byte and 1T (got {text!r})")
    return value


def _ints(text: str) -> list[int]:
    return list(count_list(1, 2**20)(text))


def _on_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def _add_measure_args(p: argparse.ArgumentParser) -> None:
    """What the microbenchmark measures (the same flags for run, submit and the worker)."""
    m = p.add_argument_group("what to measure")
    m.add_argument("--model", default="small-gpt",
                   help="model whose block GEMMs are timed (default small-gpt)")
    m.add_argument("--tp", type=_ints, default=None, metavar="1,2,...",
                   help="tensor-parallel degrees whose GEMM shapes are timed (default: powers "
                   "of 2 up to the ranks per node)")
    m.add_argument("--widths", type=_ints, default=None, metavar="H,...",
                   help="model widths of the size ladder (default: the model's width x 1/4, "
                   "1/2, 1, 2)")
    m.add_argument("--dtype", choices=("fp32", "tf32", "bf16", "fp16"), default=None,
                   help="training dtype of the GEMMs (default bf16 on a GPU, fp32 on a CPU)")
    m.add_argument("--min-bytes", type=_size, default=1024, metavar="SIZE",
                   help="smallest message (default 1K)")
    m.add_argument("--max-bytes", type=_size, default=None, metavar="SIZE",
                   help="largest message (default 1G on GPUs, 16M on CPUs: gloo's ~1 GB/s makes "
                   "larger ones seconds each, and 16M is already bandwidth-bound)")
    m.add_argument("--no-mpi", action="store_true", help="skip the MPI (mpi4py) baseline")


def _measure_defaults(args: argparse.Namespace, ranks_per_node: int) -> None:
    from frontier_llm.calibrate.microbench import CPU_MAX_BYTES, GPU_MAX_BYTES

    gpu = _on_gpu() if args.dtype is None or args.max_bytes is None else False
    args.dtype = args.dtype or ("bf16" if gpu else "fp32")
    args.max_bytes = args.max_bytes or (GPU_MAX_BYTES if gpu else CPU_MAX_BYTES)
    if args.tp is None:
        args.tp = [t for t in (1, 2, 4, 8, 16) if t <= max(1, ranks_per_node)]
    if args.max_bytes < args.min_bytes:
        raise UserError(f"--max-bytes ({args.max_bytes}) is below --min-bytes ({args.min_bytes})")


def _worker_argv(args: argparse.Namespace) -> list[str]:
    argv = ["--model", args.model, "--system", args.system, "--dtype", args.dtype,
            "--tp", ",".join(map(str, args.tp)), "--min-bytes", str(args.min_bytes),
            "--max-bytes", str(args.max_bytes)]
    if args.widths:
        argv += ["--widths", ",".join(map(str, args.widths))]
    if args.no_mpi:
        argv.append("--no-mpi")
    return argv


def _gemms(args: argparse.Namespace):
    from frontier_llm.calibrate.shapes import gemm_set
    from frontier_llm.catalog import load_model

    model = load_model(args.model)
    widths = args.widths or [w for w in (model.hidden // 4, model.hidden // 2, model.hidden,
                                         2 * model.hidden)
                             if w >= model.head_dim and w % model.head_dim == 0]
    return gemm_set(model, args.tp, widths)


# --- worker: one rank of a calibration job ---------------------------------------------------
def _worker(args: argparse.Namespace) -> int:
    from frontier_llm.calibrate.microbench import WorkerConfig, run_worker
    from frontier_llm.catalog import load_system

    system = load_system(args.system)
    _measure_defaults(args, 1)
    cfg = WorkerConfig(gemms=_gemms(args), dtype=args.dtype, min_bytes=args.min_bytes,
                       max_bytes=args.max_bytes, gpus_per_package=system.gpus_per_package,
                       mpi=not args.no_mpi)
    out = Path(args.trace_dir) / f"{args.run_id}.calibration.json"
    return run_worker(cfg, out, args.model, system.name, progress=_err)


# --- results -> store, fit -> system YAML ----------------------------------------------------
def _store_results(path: Path, db: str | None) -> str:
    import json

    from frontier_llm.store import open_store
    from frontier_llm.store.calibration_tables import save_results

    try:
        raw = path.read_bytes()
        doc = json.loads(raw)
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:  # invalid UTF-8 (a binary) or not JSON
        kind = "not a text file" if isinstance(exc, UnicodeDecodeError) else "not JSON"
        raise UserError(f"{path}: {kind}; expected calibration results JSON") from None
    store = open_store(db)
    try:
        cid, new = save_results(store, doc, str(path), raw)
    finally:
        store.close()
    _err(f"flm calibrate: {'stored' if new else 'already stored'} calibration {cid[:12]} in "
         f"{store.url_redacted}")
    return cid


def _fit_and_write(results_path: Path, system: str, out: str | None, name: str | None,
                   db: str | None, fmt: str) -> int:
    from frontier_llm.calibrate.fit import fit_links, fit_matmul, links_table
    from frontier_llm.calibrate.results import load_results
    from frontier_llm.calibrate.system_file import (
        base_mapping,
        calibrated_mapping,
        provenance_line,
        write_system,
    )

    res = load_results(results_path)
    base = base_mapping(system)
    links = fit_links(res.collectives)  # refuses bad tables before anything is written
    matmul = fit_matmul(res.matmul, res.dtype)
    name = name or f"{base['name']}-calibrated"
    mapping = calibrated_mapping(base, res.provenance, links, matmul, name)
    _store_results(results_path, db)
    if out:
        write_system(mapping, out, [f"System {name}: {provenance_line(res.provenance)}",
                                    f"Fitted from {results_path} (docs/calibrate.md)."])
    table = links_table(links)
    summary = {"matmul_rate_flops": matmul.rate, "matmul_efficiency":
               mapping["efficiency"]["matmul"]["value"], "matmul_half_hidden":
               matmul.half_hidden, "matmul_rms_resid_pct": 100 * matmul.rms_rel_residual,
               "matmul_saturated": matmul.saturated, "dtype": matmul.dtype}
    if fmt == "json":
        emit_json({"system_file": out, "links": table.to_dict(orient="records"),
                   "matmul": summary, "provenance": res.provenance})
    else:
        print(f"link tiers (alpha-beta fit, {res.provenance.get('world_size')} ranks on "
              f"{res.provenance.get('node_count')} node(s)):")
        emit_frame(table.round(3), "table")
        print(f"matrix rate ({matmul.dtype}): {matmul.rate / 1e9:.2f} GFLOP/s at large width, "
              f"half-rate side {matmul.half_hidden:.1f}, efficiency "
              f"{summary['matmul_efficiency']:.3f} of peak; residual rms "
              f"{summary['matmul_rms_resid_pct']:.1f} % over widths "
              f"{', '.join(map(str, matmul.widths))}")
        if out:
            print(f"wrote {out}: flm plan --system {out} ...")
    return 0


def _run(args: argparse.Namespace) -> int:
    from frontier_llm.calibrate.local import mpi_available, spawn
    from frontier_llm.catalog import load_model, load_system

    if args.nproc < 2:
        raise UserError("--nproc must be at least 2: a link tier needs a group of 2 ranks")
    load_system(args.system)
    load_model(args.model)
    _measure_defaults(args, args.nproc)
    _gemms(args)  # refuses a tp that does not divide the model, before any rank starts
    if args.out and not Path(args.out).resolve().parent.is_dir():
        raise UserError(f"--out: folder {Path(args.out).parent} does not exist")
    run_id = f"calib-{time.strftime('%Y%m%d-%H%M%S')}"
    results = Path(args.results_dir) / f"{run_id}.calibration.json"
    use_mpi = not args.no_mpi and mpi_available()
    _err(f"flm calibrate: {args.nproc} ranks ({'mpiexec' if use_mpi else 'local processes'}), "
         f"{args.dtype} GEMMs of {args.model} at tp {args.tp}, messages "
         f"{args.min_bytes} B to {args.max_bytes} B")
    argv = [*_worker_argv(args), "--run-id", run_id, "--trace-dir", str(args.results_dir)]
    code = spawn(argv, args.nproc, use_mpi, args.timeout)
    if code != 0 or not results.exists():
        _err(f"flm calibrate: the microbenchmark failed (exit {code}); no system file written")
        return 1
    _err(f"flm calibrate: results in {results}")
    return _fit_and_write(results, args.system, args.out, args.name, args.db, args.format)


def _fit(args: argparse.Namespace) -> int:
    return _fit_and_write(Path(args.results), args.system, args.out, args.name, args.db,
                          args.format)


def _submit(args: argparse.Namespace) -> int:
    import os

    from frontier_llm.calibrate.submit import CPU_RANKS_PER_NODE, job_script, results_path
    from frontier_llm.catalog import load_system
    from frontier_llm.jobs import site_policy
    from frontier_llm.jobs.render import render
    from frontier_llm.jobs.slurm import SlurmClient
    from frontier_llm.specs.site import Site

    system = load_system(args.system)
    site = system.site or Site()
    if args.nodes < 1:
        raise UserError(f"--nodes must be at least 1 (got {args.nodes})")
    rpn = args.ranks_per_node or (system.gpus_per_node if site.gpus else CPU_RANKS_PER_NODE)
    if rpn < 1 or args.nodes * rpn < 2:
        raise UserError("a calibration needs at least 2 ranks (--nodes x --ranks-per-node)")
    _measure_defaults(args, rpn)
    _gemms(args)
    if args.out and not Path(args.out).resolve().parent.is_dir():
        raise UserError(f"--out: folder {Path(args.out).parent} does not exist")
    account = args.account or os.environ.get("FLM_ACCOUNT") or None
    directory = Path(args.dir).resolve()
    job, resources = job_script(system, args.nodes, rpn, _worker_argv(args), directory,
                                args.time, account, args.partition)
    site_policy.check(system.name, site, [(1, resources)])
    text = render(job)  # refuses a bad template or option before anything is written
    for sub in ("results", "logs"):
        (directory / sub).mkdir(parents=True, exist_ok=True)
    script = directory / f"calibrate-{system.name}-{time.strftime('%Y%m%d-%H%M%S')}.sh"
    script.write_text(text)
    script.chmod(0o755)
    if args.dry_run:
        print(f"wrote {script} (not submitted)")
        return 0
    client = SlurmClient()
    job_id = client.submit(script)
    results = results_path(directory, job_id)
    print(f"submitted calibration job {job_id} ({args.nodes} node(s) x {rpn} ranks): {script}",
          flush=True)
    if not args.wait:
        print(f"when it ends: flm calibrate fit {results} --system {args.system} --out FILE")
        return 0
    status = client.wait([job_id], timeout_s=args.wait_timeout)[job_id]
    if not status.terminal or not results.exists():
        _err(f"flm calibrate: job {job_id} {status.state}: no results at {results} "
             f"(log: {directory / 'logs' / (job_id + '.out')})")
        return 1
    return _fit_and_write(results, args.system, args.out, args.name, args.db, args.format)


def _from_runs(args: argparse.Namespace) -> int:
    from datetime import UTC, datetime

    from frontier_llm.calibrate.fromruns import (
        KNOBS,
        UNITS,
        closed_loop,
        load_runs,
        refitted_mapping,
    )
    from frontier_llm.calibrate.system_file import base_mapping, write_system
    from frontier_llm.catalog import load_system
    from frontier_llm.store import open_existing

    knobs = tuple(k.strip() for k in args.knobs.split(",") if k.strip())
    unknown = [k for k in knobs if k not in KNOBS]
    if unknown or not knobs:
        raise UserError(f"--knobs: unknown knob(s) {', '.join(unknown) or '(none given)'}; "
                        f"choose from {', '.join(KNOBS)}")
    system = load_system(args.fr_system)
    if args.fr_out and not Path(args.fr_out).resolve().parent.is_dir():
        raise UserError(f"--out: folder {Path(args.fr_out).parent} does not exist")
    if args.folds < 2:
        raise UserError(f"--folds must be at least 2 (got {args.folds})")
    store = open_existing(args.fr_db)
    dropped: list[str] = []
    repeated: list[str] = []
    try:
        runs = load_runs(store, args.sweep, dropped, repeated)
        test = load_runs(store, args.test_sweep, dropped, repeated) if args.test_sweep else None
    finally:
        store.close()
    if repeated:
        # A copied folder collected again: each measurement counts once, and the user hears
        # how many copies were found.
        print(f"flm: warning: left out {len(repeated)} run(s) that repeat another run's "
              f"measurement (the same per-step times: one log or trace collected twice): "
              f"{'; '.join(repeated[:5])}{' ...' if len(repeated) > 5 else ''}",
              file=sys.stderr)
    if dropped:
        # Never silent: a calibration fitted without them says which runs it left out, why.
        print(f"flm: warning: left out {len(dropped)} run(s) whose step time is not "
              f"plausible: {'; '.join(dropped[:5])}{' ...' if len(dropped) > 5 else ''}",
              file=sys.stderr)
    when = datetime.now(UTC).isoformat(timespec="seconds")
    source = (f"flm calibrate --from-runs {when}: refitted on {len(runs)} runs of sweep "
              f"{args.sweep} ({store.url_redacted}); knobs {', '.join(knobs)}")
    report = closed_loop(system, runs, knobs, args.folds, test, source)
    if args.fr_out:
        mapping = refitted_mapping(base_mapping(args.fr_system), report, source)
        write_system(mapping, args.fr_out, [f"System {mapping['name']} refitted from runs.",
                                            source])
    knob_rows = [{"knob": k, "unit": UNITS[k], "before": report.knobs_before[k],
                  "after": report.knobs_all[k]} for k in knobs]
    if args.fr_format == "json":
        emit_json({"summary": report.summary.to_dict(orient="records"),
                   "runs": report.per_run.to_dict(orient="records"), "knobs": knob_rows,
                   "system_file": args.fr_out,
                   # Copies of another run's measurement, left out (load_runs).
                   "repeated_runs_left_out": len(repeated)})
        return 0
    print(f"step time, predicted vs measured ({system.name}, sweep {args.sweep}"
          f"{', test sweep ' + args.test_sweep if args.test_sweep else ''}); "
          "error = (predicted - measured) / measured:")
    emit_frame(report.per_run.round({"measured_s": 4, "before_s": 4, "after_s": 4,
                                     "before_err_pct": 1, "after_err_pct": 1}), "table")
    print("\nknobs fitted on all runs of the sweep:")
    emit_frame(pd_frame(knob_rows), "table")
    print("\nmean absolute percentage error of the step time:")
    emit_frame(report.summary.round(1), "table")
    if repeated:
        print(f"{len(repeated)} run(s) left out as copies of another run's measurement")
    if args.fr_out:
        print(f"wrote {args.fr_out}")
    return 0


def pd_frame(rows: list[dict]):
    import pandas as pd

    return pd.DataFrame(rows).map(lambda v: f"{v:.4g}" if isinstance(v, float) else v)


def _top(args: argparse.Namespace) -> int:
    if args.from_runs:
        if not args.sweep:
            raise UserError("--from-runs needs --sweep NAME (the runs to learn from)")
        return _from_runs(args)
    raise UserError("flm calibrate needs an action (run, fit, submit) or --from-runs --sweep "
                    "NAME; see flm calibrate --help")


def register(sub: argparse._SubParsersAction) -> None:
    from frontier_llm.cli.common import db_parent

    db = db_parent()
    top = add_command(
        sub, "calibrate", "measure a system and fit the cost model's parameters",
        "Measure matrix multiplications (the GEMM shapes of a model's layouts, per tensor-"
        "parallel degree, in the training dtype) and collectives (all-reduce, all-gather, "
        "reduce-scatter, send-receive over message sizes and group shapes; torch.distributed "
        "plus an MPI baseline), fit latency and bandwidth per link tier and the achievable "
        "matrix rate with its size effect, and write a system YAML that 'flm plan --system "
        "FILE' uses. Results go to the store (--db) with their provenance.\n\n"
        "With --from-runs, refit the cost model's efficiency knobs from measured runs of a "
        "sweep in the database and report the step-time error before and after on runs held "
        "out of the fit (k-fold cross-validation). Details: docs/calibrate.md.",
        ["flm calibrate run --nproc 4 --system cpu-local --out cpu-cal.yaml",
         "flm calibrate submit --system frontier --nodes 2 --account PRJ123",
         "flm calibrate fit calibration/calib-123.calibration.json --system frontier "
         "--out frontier-cal.yaml",
         "flm calibrate --from-runs --sweep cpu-study --system cpu-cal.yaml --out cpu-fit.yaml"],
    )
    top.add_argument("--from-runs", action="store_true",
                     help="refit the efficiency knobs from measured runs (needs --sweep)")
    top.add_argument("--sweep", metavar="NAME", help="the sweep whose runs to learn from")
    top.add_argument("--system", dest="fr_system", default="cpu-local", metavar="S",
                     help="system (name or YAML) whose knobs are refitted (default cpu-local)")
    top.add_argument("--db", dest="fr_db", default=None, metavar="URL",
                     help="database URL (default: $FLM_DB, else sqlite:///flm.db here)")
    top.add_argument("--folds", type=count(2), default=5, metavar="K",
                     help="cross-validation folds (default 5; at most the number of runs)")
    top.add_argument("--knobs", default="matmul,layer_overhead_s,latency", metavar="A,B",
                     help="knobs to refit: matmul, layer_overhead_s, latency, network_latency, "
                     "collective, memory (default matmul,layer_overhead_s,latency)")
    top.add_argument("--test-sweep", metavar="NAME", default=None,
                     help="a second sweep, never fitted: its runs are only predicted, before "
                     "and after")
    top.add_argument("--out", dest="fr_out", default=None, metavar="FILE",
                     help="write the system refitted on all runs here")
    top.add_argument("--format", dest="fr_format", choices=("table", "json"), default="table")
    top.set_defaults(func=_top)
    actions = top.add_subparsers(dest="action", metavar="ACTION")

    p = add_command(
        actions, "run", "run the microbenchmarks here with several processes, then fit",
        "Start --nproc ranks on this machine (under mpiexec when it and mpi4py are installed, "
        "for the MPI baseline), time GEMMs and collectives, store the results, fit and write "
        "the system YAML (--out). On a CPU the ranks talk over gloo and messages stop at 16M "
        "unless --max-bytes says otherwise.",
        ["flm calibrate run --nproc 2 --out cpu-cal.yaml",
         "flm calibrate run --nproc 4 --model tiny-gpt --max-bytes 4M --no-mpi"],
        parents=[db],
    )
    p.add_argument("--nproc", type=count(1, MAX_LOCAL_RANKS), default=2,
                   help="ranks to start (default 2)")
    p.add_argument("--system", default="cpu-local",
                   help="base system (name or YAML): what is not measured comes from it")
    _add_measure_args(p)
    p.add_argument("--results-dir", default="calibration", metavar="DIR",
                   help="where the results JSON goes (default calibration/)")
    p.add_argument("--out", default=None, metavar="FILE", help="system YAML to write")
    p.add_argument("--name", default=None, help="system name (default BASE-calibrated)")
    p.add_argument("--timeout", type=seconds, default=1800.0, help="seconds before giving up")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.set_defaults(func=_run)

    p = add_command(
        actions, "fit", "fit a results file (e.g. from a SLURM job) into a system YAML",
        "Read a calibration results JSON, store it, fit link tiers and the matrix rate, and "
        "write the system YAML. Bad timings (too few sizes or ranks for a tier, non-positive "
        "times) are refused with one line and no file is written.",
        ["flm calibrate fit runs/calib/calib-42.calibration.json --system frontier "
         "--out frontier-cal.yaml"],
        parents=[db],
    )
    p.add_argument("results", metavar="RESULTS.json")
    p.add_argument("--system", default="cpu-local", help="base system (name or YAML)")
    p.add_argument("--out", default=None, metavar="FILE", help="system YAML to write")
    p.add_argument("--name", default=None, help="system name (default BASE-calibrated)")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.set_defaults(func=_fit)

    p = add_command(
        actions, "submit", "submit the microbenchmarks as a SLURM job from a job template",
        "Render a batch script from the system's job template (its site: section gives the "
        "launcher, binding, modules, partition) that runs one rank per GPU (or --ranks-per-node "
        "CPU ranks) on --nodes nodes, and sbatch it. When the job ends, 'flm calibrate fit' "
        "turns its results file into a system YAML (--wait does that here).",
        ["flm calibrate submit --system frontier --nodes 2 --account PRJ123 --time 00:20:00",
         "flm calibrate submit --system cpu-local --nodes 1 --ranks-per-node 2 --wait "
         "--out cpu-cal.yaml"],
        parents=[db],
    )
    p.add_argument("--system", required=True, help="system (name or YAML) with a site: section")
    p.add_argument("--nodes", type=count(1, MAX_GPUS), required=True)
    p.add_argument("--ranks-per-node", type=count(1, 1024), default=None,
                   help="default: the system's GPUs per node")
    _add_measure_args(p)
    p.add_argument("--dir", default="calibration", metavar="DIR",
                   help="folder of the script, log and results (default calibration/)")
    p.add_argument("--time", default="00:30:00", help="time limit (default 00:30:00)")
    p.add_argument("--account", default=None, help="SLURM account (default $FLM_ACCOUNT)")
    p.add_argument("--partition", default=None, help="default: the site's")
    p.add_argument("--dry-run", action="store_true", help="write the script, do not submit")
    p.add_argument("--wait", action="store_true", help="wait for the job, then fit (--out)")
    p.add_argument("--wait-timeout", type=seconds, default=3600.0, metavar="S")
    p.add_argument("--out", default=None, metavar="FILE", help="system YAML (with --wait)")
    p.add_argument("--name", default=None, help="system name (default BASE-calibrated)")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.set_defaults(func=_submit)

    p = actions.add_parser("worker", help="one rank of a calibration job (started by run or "
                           "by the job script)")
    p.add_argument("--system", default="cpu-local")
    _add_measure_args(p)
    p.add_argument("--run-id", required=True)
    p.add_argument("--trace-dir", required=True)
    p.set_defaults(func=_worker)
