"""Planner speed: plan gpt-1t on 3072 Frontier GCDs over the full search space.

Prints the layouts evaluated, seconds, layouts per second, and the speed-up over evaluating the
same layouts one at a time through the scalar entry point (``costmodel.predict``) in the same run.
The scalar baseline runs on an evenly spaced sample of the valid layouts (``--scalar-sample``,
0 = all of them) and is extrapolated to the whole space; the sample size is printed.
Target (issue 2): the full space in under 1 s on 2 cores, at least 1,000,000 layouts/s.

    python benchmarks/bench_planner.py [--repeat 5] [--scalar-sample 3000]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from frontier_llm.catalog import load_model, load_system
from frontier_llm.costmodel import predict
from frontier_llm.planner import plan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gpt-1t")
    ap.add_argument("--system", default="frontier")
    ap.add_argument("--gpus", type=int, default=3072)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--scalar-sample", type=int, default=3000)
    args = ap.parse_args()
    model, system = load_model(args.model), load_system(args.system)

    plan(model, system, args.gpus)  # warm-up: imports, numpy first-call costs
    times = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        result = plan(model, system, args.gpus)
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    layouts = len(result.reason)
    evaluated = np.flatnonzero(np.isfinite(result.figures["step_time_s"]))

    sample = evaluated
    if args.scalar_sample and len(evaluated) > args.scalar_sample:
        sample = evaluated[np.linspace(0, len(evaluated) - 1, args.scalar_sample).astype(int)]
    configs = [result.layout(int(i)) for i in sample]
    start = time.perf_counter()
    for cfg in configs:
        predict(model, system, cfg)
    scalar_each = (time.perf_counter() - start) / len(configs)
    scalar_total = scalar_each * len(evaluated)
    vector_each = seconds / layouts

    print(f"plan {model.name} on {args.gpus} x {system.gpu} ({system.name})")
    print(f"layouts in the space          {layouts:>12,}")
    print(f"  rejected by a rule          {layouts - len(evaluated):>12,}")
    print(f"  evaluated by the cost model {len(evaluated):>12,}")
    print(f"  valid and fit               {int(result.valid.sum()):>12,}")
    print(f"planner seconds (median of {args.repeat})  {seconds:>8.3f}  "
          f"(min {min(times):.3f}, max {max(times):.3f})")
    print(f"layouts per second            {layouts / seconds:>12,.0f}")
    print(f"scalar predict()              {1 / scalar_each:>12,.0f} layouts/s "
          f"(sample of {len(configs):,}); whole space one at a time ~ {scalar_total:.1f} s")
    print(f"speed-up vectorized / scalar  {scalar_each / (seconds / len(evaluated)):>12,.0f}x "
          f"per cost-model evaluation ({scalar_each / vector_each:,.0f}x per layout "
          "in the space)")
    ok = seconds < 1.0 and layouts / seconds >= 1e6
    print(f"target (< 1 s, >= 1,000,000 layouts/s): {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
