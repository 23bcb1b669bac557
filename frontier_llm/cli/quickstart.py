"""flm quickstart: plan, measure, store, search and report on this machine, in one command."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

from frontier_llm.cli.common import add_command
from frontier_llm.cli.numbers import count

DEFAULT_OUT = "flm-quickstart"
DEFAULT_SYSTEM = "cpu-local"  # frontier_llm.quickstart.settings.DEFAULT_SYSTEM (lazy import)


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "quickstart", "the whole loop on this machine: plan, sweep, store, tune, report",
        "Calibrate this machine (a few seconds of flm calibrate's GEMM and collective "
        "microbenchmarks on the 4 ranks, fitted into the --system file); plan a tiny GPT on 4 "
        "CPU ranks with that calibration and print the fastest predicted layouts; run a sweep of "
        "the fastest of each TP x PP shape (and a weak-scaling series) as real flm bench runs "
        "with the local executor, and store their traces in DIR/flm.db; refit the calibration "
        "on the sweep's runs (flm calibrate --from-runs) and print the step-time error and rank "
        "correlation of each system file; keep the refit or the microbenchmark file, whichever "
        "has the lower held-out error, and say which; run a short Optuna study warm-started by "
        "it; write the scaling, layout and error reports (measured beside predicted; the "
        "errors report compares the built-in, microbenchmark and refitted files) into "
        "DIR/reports; print where "
        "everything is and the commands to run next on a cluster. No cluster, GPU or "
        "configuration needed; about 1 minute on 2 idle cores with the defaults (57 to 69 s "
        "measured; 130 to 170 s while other work shared them; docs/quickstart.md).\n\n"
        "Ctrl-C leaves the database consistent; running it again with the same --out and "
        "options resumes: finished calibration files, completed jobs and told trials are kept, "
        "not run again. A folder "
        "made with other options is refused.",
        [f"flm quickstart                       # into ./{DEFAULT_OUT}",
         "flm quickstart --out /tmp/qs",
         "flm quickstart --out /tmp/qs-ci --layouts 2 --steps 2 --trials 1   # CI: ~1 minute",
         "flm quickstart --out /tmp/qs-mine --system my-cpu.yaml --no-calibrate   # your file"],
    )
    p.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                   help=f"folder for the database, files and reports (default ./{DEFAULT_OUT}); "
                        "run again with the same folder to resume")
    p.add_argument("--system", default=DEFAULT_SYSTEM, metavar="S",
                   help=f"base system (catalog name or YAML path; default {DEFAULT_SYSTEM}, the "
                        "catalog's estimates): the quickstart calibrates it on this machine "
                        "(flm calibrate's microbenchmarks, then a refit from the sweep's runs), "
                        "keeping what it does not measure (memory, site); with --no-calibrate "
                        "it predicts as it is")
    p.add_argument("--no-calibrate", action="store_true",
                   help="skip both calibrations: the plan, the sweep and the study predict with "
                        "--system as given (for a system file you calibrated yourself)")
    g = p.add_argument_group("size (smaller for CI; a folder keeps the sizes it was made with)")
    # Bounds at parse time, so an absurd size is refused before anything is written.
    g.add_argument("--layouts", type=count(1, 6, "--layouts"), default=4, metavar="N",
                   help="4-rank layouts to measure: the fastest predicted of each TP x PP "
                        "shape (default 4, at most the 6 shapes of 4 ranks; the weak-scaling "
                        "series adds 2 smaller runs)")
    g.add_argument("--steps", type=count(1, 10_000, "--steps"), default=4, metavar="N",
                   help="measured training steps per run, after one warm-up step (default 4, "
                        "at most 10,000)")
    g.add_argument("--trials", type=count(1, 1_000, "--trials"), default=4, metavar="N",
                   help="jobs the Optuna study may run (default 4, at most 1,000; its first "
                        "2 are the model's favourites)")
    p.set_defaults(func=_quickstart)


class _CliReporter:
    """Lines on stdout; rich bars on stderr at a terminal (frontier_llm.cli.progress)."""

    def say(self, line: str = "") -> None:
        print(line, flush=True)

    @contextlib.contextmanager
    def bar(self, description: str) -> Iterator:
        from frontier_llm.cli.progress import Progress

        with Progress(description) as bar:
            yield bar


def _quickstart(args: argparse.Namespace) -> int:
    from frontier_llm.quickstart import Quickstart, Settings
    from frontier_llm.quickstart.nextsteps import cluster_steps

    settings = Settings(out=Path(args.out), system=_system(args.system),
                        calibrate=not args.no_calibrate, layouts=args.layouts,
                        steps=args.steps, trials=args.trials, warm_start=min(2, args.trials))
    try:
        result = Quickstart(settings, _CliReporter()).run()
    except KeyboardInterrupt:
        print(f"flm quickstart: interrupted; the database is consistent. Run the same command "
              f"again to resume: flm quickstart --out {args.out}"
              + _size_flags(args), file=sys.stderr)
        raise
    out = result.out
    db = result.db_url
    print(f"\n7. where everything is ({out}):")
    rows = [
        ("flm.db", "the results database: job rows, runs, per-rank memory, the Optuna study"),
        *([("calibration/", "microbench.yaml, refit.yaml: this machine's system files "
            "(--system FILE)")] if result.systems.keys() - {"built-in"} else []),
        ("plan.csv", "every valid layout with the cost model's prediction"),
        ("quickstart-sweep.yaml, sweep/", "the sweep file; its job scripts, logs and traces"),
        ("quickstart-study.yaml, study/", "the study file; each trial's job folder"),
        ("reports/", ", ".join(p.name for p in result.reports if p.suffix == ".png")
         or "(no figure: see the messages above)"),
    ]
    for name, what in rows:
        print(f"   {name:<31} {what}")
    print("   look again:")
    print(f"     flm results --sweep quickstart --db {db}")
    print(f"     flm tune status quickstart-tune --db {db}")
    print(f"     flm report layouts --sweep quickstart --db {db} --out {out / 'reports'}")
    print("\nnext, on a cluster (Frontier here; files from the repository's sweeps/ folder):")
    for step in cluster_steps():
        print(f"   # {step.why}")
        print(f"   {step.line()}")
    return 0


def _system(name: str) -> str:
    """Check the system before anything is written (a bad name: one line, exit 2); a YAML path
    is made absolute, since the sweep and study files that name it live in the --out folder."""
    from frontier_llm.catalog import load_system

    load_system(name)
    path = Path(name)
    return str(path.resolve()) if path.suffix in (".yaml", ".yml") and path.is_file() else name


def _size_flags(args: argparse.Namespace) -> str:
    defaults = {"system": DEFAULT_SYSTEM, "layouts": 4, "steps": 4, "trials": 4}
    return "".join(f" --{k} {getattr(args, k)}" for k, v in defaults.items()
                   if getattr(args, k) != v) + (" --no-calibrate" if args.no_calibrate else "")
