"""Expert parallelism in ``flm bench``'s native engine, on CPU: what the all-to-alls cost.

One Mixture-of-Experts model at the same data parallelism, once with every rank holding every
expert (ep 1) and once with the experts split over the ranks (ep N), alternating, through the
real ``flm bench`` command (its local launcher, gloo ranks). Printed per run: the median step time
(barrier-bracketed, warm-up steps left out), the slowest rank's median dispatch and combine
seconds per step (forward plus the backward of each all-to-all), the worst block's expert
imbalance (busiest over mean expert) and the assignments dropped at capacity; then the ep N / ep 1
step-time ratio, and whether the two runs' losses agree (fp32: within 1e-5, as they must: the
routing is the same).

    python benchmarks/bench_moe.py [--model tiny-moe] [--dp 2] [--ep 2] [--steps 10] [--warmup 2]
    python benchmarks/bench_moe.py --quick   # 2 steps: the tests
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def run(model: str, dp: int, ep: int, steps: int, warmup: int, out: Path, run_id: str) -> dict:
    cmd = [sys.executable, "-m", "frontier_llm.cli", "bench", "--model", model, "--dp", str(dp),
           "--ep", str(ep), "--global-batch", str(2 * dp), "--dtype", "fp32", "--steps",
           str(steps), "--warmup", str(warmup), "--trace-dir", str(out), "--run-id", run_id]
    proc = subprocess.run(cmd, capture_output=True, text=True,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    if proc.returncode:
        sys.exit(f"ep {ep} failed:\n{proc.stderr[-3000:]}")
    return json.loads((out / f"{run_id}.trace.json").read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-moe")
    ap.add_argument("--dp", type=int, default=2)
    ap.add_argument("--ep", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="2 steps, 1 warm-up: the tests")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.warmup = 2, 1
    with tempfile.TemporaryDirectory() as tmp:
        traces = {ep: run(args.model, args.dp, ep, args.steps, args.warmup, Path(tmp),
                          f"ep{ep}") for ep in (1, args.ep)}
    print(f"{args.model}, dp {args.dp}, fp32, global batch {2 * args.dp}, "
          f"{args.steps} steps after {args.warmup} warm-up")
    print(f"{'ep':>4} {'step ms':>9} {'dispatch ms':>12} {'combine ms':>11} "
          f"{'imbalance':>10} {'dropped':>8}")
    for ep, trace in traces.items():
        s, moe = trace["summary"], trace["moe"]
        print(f"{ep:>4} {s['step_time_s'] * 1e3:>9.2f} {moe['dispatch_s'] * 1e3:>12.2f} "
              f"{moe['combine_s'] * 1e3:>11.2f} {moe['imbalance_max']:>10.3f} "
              f"{moe['dropped']:>8}")
    base, split = traces[1], traces[args.ep]
    ratio = split["summary"]["step_time_s"] / base["summary"]["step_time_s"]
    print(f"step-time ratio ep {args.ep} / ep 1: {ratio:.2f}")
    same = all(abs(a["loss"] - b["loss"]) <= 1e-5 * abs(b["loss"])
               for a, b in zip(split["steps"], base["steps"], strict=True))
    print(f"losses agree within 1e-5: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
