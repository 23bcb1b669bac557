"""Measure every layout of a study's space with ``flm bench`` on this machine and write the table
that replays the study without rerunning it (tests/data/tune_replay.csv).

    python benchmarks/make_tune_replay.py [--study benchmarks/tune_replay_study.yaml]
                                          [--out tests/data/tune_replay.csv] [--limit N]

Every point the cost model accepts (valid and predicted to fit) is run once, one after the other,
with the study's flm bench arguments (steps, warmup, run settings). The file starts with comment
lines that record how it was made: the command, the date, the host, CPU count, load and the
versions of Python, torch and frontier_llm. Rows are appended as they are measured, so an
interrupted run resumes where it stopped. It ends with the ratio of measured to predicted
throughput per rank over the layouts it measured (the cost model being the in-run baseline).

``--quick`` (what tests/test_benchmarks.py runs, seconds): one layout, 2 steps after 1 warm-up,
into a temporary file unless --out is given; never the shipped table.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from frontier_llm import __version__  # noqa: E402
from frontier_llm.tune.spec import load_study  # noqa: E402

COLUMNS = ["key", "tp", "pp", "dp", "micro_batch", "schedule", "virtual_stages", "sharding",
           "bucket_mb", "status", "tokens_per_s", "throughput_per_gpu", "step_time_s",
           "peak_memory_bytes", "predicted_throughput_per_gpu", "wall_s"]


def header(argv: list[str]) -> list[str]:
    import torch

    return [
        f"# command: python benchmarks/make_tune_replay.py {' '.join(argv)}",
        f"# date: {datetime.now(UTC).isoformat(timespec='seconds')}",
        f"# host: {platform.node()} ({platform.machine()}, {os.cpu_count()} CPUs, load "
        f"{os.getloadavg()[0]:.1f} at start)",
        f"# versions: python {platform.python_version()}, torch {torch.__version__}, "
        f"frontier_llm {__version__}",
        "# each row: one flm bench run of the layout (OMP_NUM_THREADS=1, gloo on CPU); "
        "throughput_per_gpu = tokens_per_s / 4 ranks",
    ]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--study", default=str(REPO / "benchmarks" / "tune_replay_study.yaml"))
    ap.add_argument("--out", default=None,
                    help="the table to write or resume (default tests/data/tune_replay.csv; "
                         "with --quick a temporary file)")
    ap.add_argument("--limit", type=int, default=None, help="measure at most N layouts")
    ap.add_argument("--quick", action="store_true",
                    help="one layout, 2 steps after 1 warm-up (seconds): what "
                         "tests/test_benchmarks.py runs")
    args = ap.parse_args(argv)
    if not args.quick:
        return measure(args, argv, Path(args.out or REPO / "tests" / "data" / "tune_replay.csv"))
    # Fewer steps than the study's: a quick table cannot stand in for the shipped one, so it
    # goes to a temporary file unless --out names one.
    args.limit = 1
    with tempfile.TemporaryDirectory(prefix="flm-quick-replay-") as tmp:
        return measure(args, argv, Path(args.out or Path(tmp) / "tune_replay.csv"),
                       ["--steps", "2", "--warmup", "1"])


def measure(args: argparse.Namespace, argv: list[str], out: Path,
            extra: list[str] | None = None) -> int:
    """Run the layouts not yet in ``out`` (``extra``: flm bench arguments after the study's)."""
    study = load_study(args.study)
    cands = study.candidates.feasible()
    done = set()
    if out.is_file():
        with open(out) as fh:
            done = {r["key"] for r in csv.DictReader(line for line in fh
                                                     if not line.startswith("#"))}
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("\n".join(header(argv)) + "\n" + ",".join(COLUMNS) + "\n")
    todo = [c for c in cands if c.key not in done][:args.limit]
    print(f"{len(cands)} layouts, {len(done)} already measured, {len(todo)} to go",
          flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    ratios: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, c in enumerate(todo):
            job = study.trial_sweep(i, c.layout_entry()).jobs[0]
            cmd = [sys.executable, "-m", "frontier_llm.cli", "bench", *job.bench_args,
                   "--trace-dir", tmp, "--run-id", f"replay-{i}", *(extra or [])]
            t0 = time.monotonic()
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
            wall = time.monotonic() - t0
            summary = {}
            for line in reversed(proc.stdout.splitlines()):
                if line.startswith("{"):
                    summary = json.loads(line)
                    break
            lay = c.layout
            tps = summary.get("tokens_per_s")
            row = {
                "key": c.key, "tp": lay.tp, "pp": lay.pp, "dp": lay.dp,
                "micro_batch": lay.micro_batch, "schedule": lay.schedule,
                "virtual_stages": lay.virtual_stages, "sharding": lay.sharding.describe(),
                "bucket_mb": c.run.get("bucket_mb", ""),
                "status": summary.get("status", f"exit {proc.returncode}"),
                "tokens_per_s": tps, "throughput_per_gpu": tps / lay.world_size if tps else "",
                "step_time_s": summary.get("step_time_s"),
                "peak_memory_bytes": summary.get("peak_memory_bytes"),
                "predicted_throughput_per_gpu": c.prediction["throughput_per_gpu"],
                "wall_s": round(wall, 1),
            }
            with open(out, "a", newline="") as fh:
                csv.DictWriter(fh, COLUMNS).writerow(row)
            print(f"[{i + 1}/{len(todo)}] {c.describe()}: {row['status']} "
                  f"{row['throughput_per_gpu'] or 0:.1f} tokens/s/rank ({wall:.0f} s)",
                  flush=True)
            if tps:
                ratios.append(row["throughput_per_gpu"] / row["predicted_throughput_per_gpu"])
    if ratios:
        print(f"ratio measured / predicted throughput per rank ({study.system.name}): median "
              f"{statistics.median(ratios):.2f} over the {len(ratios)} layout(s) measured now")
    return 0


if __name__ == "__main__":
    sys.exit(main())
