"""Planner speed: plan gpt-1t on 3072 Frontier GCDs over the full search space, every engine
(native, megatron, deepspeed) and the uneven pipeline splits included; then the whole scaling
curve, gpt-1t on every power-of-two GPU count from 8 to 65,536, in one call.

Prints the layouts evaluated, seconds, layouts per second, and the speed-up over evaluating the
same layouts one at a time through the scalar entry point (``costmodel.predict``) in the same run.
The scalar baseline runs on an evenly spaced sample of the valid layouts (``--scalar-sample``,
0 = all of them) and is extrapolated to the whole space (and to the curve); the sample size is
printed. Targets: the full space in under 1 s on 2 cores, at least 1,000,000 layouts/s (issues 2
and 10); the whole curve in under 1 s (issue 10).

    python benchmarks/bench_planner.py [--repeat 5] [--scalar-sample 3000] [--engine native]
    python benchmarks/bench_planner.py --quick   # seconds: what tests/test_benchmarks.py runs
    python benchmarks/bench_planner.py --model gpt-175b --gpus 1024 --seq-len 131072  # with cp

``--quick`` plans the same space once (no repeats), samples 200 layouts for the scalar baseline
and curves 8..512 GPUs: it proves the benchmark runs; one repeat is not a figure to quote.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import numpy as np

from frontier_llm.catalog import load_model, load_system
from frontier_llm.costmodel import predict
from frontier_llm.planner import SearchSpace, plan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gpt-1t")
    ap.add_argument("--system", default="frontier")
    ap.add_argument("--gpus", type=int, default=3072)
    ap.add_argument("--seq-len", type=int, default=None,
                    help="override the model's sequence length (long context: the open cp "
                         "list grows with it, docs/planner.md)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--scalar-sample", type=int, default=3000)
    ap.add_argument("--engine", default="native,megatron,deepspeed",
                    help="engines to plan for, comma-separated (default all three)")
    ap.add_argument("--curve", default="8-65536",
                    help="power-of-two GPU counts LO-HI of the scaling curve ('' for none)")
    ap.add_argument("--quick", action="store_true",
                    help="one repeat, a 200-layout scalar sample, the curve 8-512 (seconds)")
    args = ap.parse_args()
    if args.quick:
        args.repeat, args.scalar_sample, args.curve = 1, 200, "8-512"
    model, system = load_model(args.model), load_system(args.system)
    if args.seq_len:
        model = dataclasses.replace(model, seq_len=args.seq_len)
    space = SearchSpace(engine=tuple(args.engine.split(",")))

    plan(model, system, args.gpus, space=space)  # warm-up: imports, numpy first-call costs
    times = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        result = plan(model, system, args.gpus, space=space)
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

    uneven = int(np.sum(model.layers % (result.layouts.pp * result.layouts.virtual_stages) != 0))
    print(f"plan {model.name} on {args.gpus} x {system.gpu} ({system.name}), engines "
          f"{args.engine}")
    print(f"layouts in the space          {layouts:>12,}")
    print(f"  with an uneven pipeline     {uneven:>12,}")
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
    if args.curve:
        curve(model, system, space, args.curve, args.repeat, scalar_each)


def curve(model, system, space: SearchSpace, counts: str, repeat: int,
          scalar_each: float) -> None:
    """The whole scaling curve in one call, timed (median of ``repeat``), against evaluating its
    layouts one at a time with the scalar predict() measured above."""
    lo, hi = (int(x) for x in counts.split("-"))
    gpus = [2**k for k in range(lo.bit_length() - 1, hi.bit_length()) if lo <= 2**k <= hi]

    def run() -> list:
        return [plan(model, system, g, space=space) for g in gpus]

    run()  # warm-up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        plans = run()
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    layouts = sum(len(p.reason) for p in plans)
    evaluated = sum(int(np.isfinite(p.figures["step_time_s"]).sum()) for p in plans)
    print(f"\nscaling curve: {model.name} on {len(gpus)} GPU counts {gpus[0]:,}..{gpus[-1]:,} "
          "in one call")
    for g, p in zip(gpus, plans, strict=True):
        best = p.ranked_indices(1)
        tps = (f"best {p.figures['tokens_per_s'][best[0]]:>11,.0f} tokens/s" if len(best)
               else "none fits")
        print(f"  {g:>6,} GPUs  {len(p.reason):>9,} layouts  {int(p.valid.sum()):>7,} fit  {tps}")
    print(f"curve seconds (median of {repeat})      {seconds:>8.3f}  (min {min(times):.3f}, "
          f"max {max(times):.3f}); {layouts:,} layouts, {layouts / seconds:,.0f} layouts/s")
    scalar = scalar_each * evaluated
    print(f"scalar predict() baseline       ~{scalar:>8.1f} s for its {evaluated:,} cost-model "
          f"evaluations; ratio {scalar / seconds:,.0f}x")
    print(f"target (curve < 1 s): {'met' if seconds < 1.0 else 'NOT met'}")


if __name__ == "__main__":
    main()
