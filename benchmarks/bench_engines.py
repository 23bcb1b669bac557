"""The same layouts on both engines of ``flm bench`` (native and DeepSpeed), in one run on CPU.

Each layout runs through the real ``flm bench`` command (its local launcher, gloo ranks) once
per engine, native and deepspeed alternating layout by layout so that drift of the machine hits
both alike. Printed per layout: the median step time of each engine (barrier-bracketed, warm-up
steps left out), the largest per-rank peak memory (on CPU: model states + saved activations, as
the trace's ``summary.peak_memory_bytes``; and the peak resident set, which includes each
library's own buffers) and the deepspeed / native ratios, as a table; and whether the two
engines' losses agree (fp32: within 1e-5).

    python benchmarks/bench_engines.py [--model small-gpt] [--steps 10] [--warmup 2]
        [--only dp2-zero1,...]
    python benchmarks/bench_engines.py --quick   # dp2-zero1 of tiny-gpt, 2 steps: the tests

DeepSpeed JIT-builds its comm op once (kept in TORCH_EXTENSIONS_DIR, default
~/.cache/torch_extensions): run it once before timing on a fresh machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

LAYOUTS = {
    "dp2-zero0": ["--dp", "2", "--zero", "0", "--global-batch", "8"],
    "dp2-zero1": ["--dp", "2", "--zero", "1", "--global-batch", "8"],
    "dp2-zero2": ["--dp", "2", "--zero", "2", "--global-batch", "8"],
    "dp2-zero3": ["--dp", "2", "--zero", "3", "--global-batch", "8"],
    "pp2-zero1": ["--pp", "2", "--zero", "1", "--global-batch", "8"],
    "tp2xdp2-zero1": ["--tp", "2", "--dp", "2", "--zero", "1", "--global-batch", "8"],
    # DeepSpeed: PipelineModule stages of Megatron-style TP layers (bench/tp_layers.py).
    "pp2xtp2-zero1": ["--pp", "2", "--tp", "2", "--zero", "1", "--global-batch", "8"],
    "dp2xpp2xtp2-zero1": ["--dp", "2", "--pp", "2", "--tp", "2", "--zero", "1",
                          "--global-batch", "8"],
}


def run(model: str, engine: str, flags: list[str], steps: int, warmup: int, out: Path,
        run_id: str) -> dict:
    cmd = [sys.executable, "-m", "frontier_llm.cli", "bench", "--model", model, "--engine",
           engine, "--dtype", "fp32", "--steps", str(steps), "--warmup", str(warmup),
           "--trace-dir", str(out), "--run-id", run_id, *flags]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode:
        sys.exit(f"{engine} {' '.join(flags)} failed:\n{proc.stderr[-3000:]}")
    return json.loads((out / f"{run_id}.trace.json").read_text())


def figures(trace: dict) -> dict:
    return {"step": trace["summary"]["step_time_s"],
            "peak": trace["summary"]["peak_memory_bytes"],
            "rss": max(m["host_rss_peak_bytes"] for m in trace["memory"]),
            "losses": [s["loss"] for s in trace["steps"]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="small-gpt")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--only", default=None, help="comma-separated layout names")
    ap.add_argument("--quick", action="store_true",
                    help="one layout (dp2-zero1) of tiny-gpt, 2 steps after 1 warm-up (seconds "
                         "once DeepSpeed's op is built): what tests/test_benchmarks.py runs")
    args = ap.parse_args()
    if args.quick:
        args.model, args.steps, args.warmup, args.only = "tiny-gpt", 2, 1, "dp2-zero1"
    names = args.only.split(",") if args.only else list(LAYOUTS)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            got = {}
            for engine in ("native", "deepspeed"):
                got[engine] = figures(run(args.model, engine, LAYOUTS[name], args.steps,
                                          args.warmup, Path(tmp), f"{name}-{engine}"))
                print(f"  {name} {engine}: {got[engine]['step'] * 1e3:.1f} ms", file=sys.stderr,
                      flush=True)
            n, d = got["native"], got["deepspeed"]
            same = all(abs(a - b) <= 1e-5 * abs(a) for a, b in zip(n["losses"], d["losses"],
                                                                    strict=True))
            rows.append((name, n, d, same))
    mb = 2**20
    print(f"model {args.model}, fp32, {args.steps} measured steps (+{args.warmup} warm-up), "
          f"CPU gloo, {os.cpu_count()} cores")
    print("| layout | native step ms | deepspeed step ms | ratio | native peak MiB | "
          "deepspeed peak MiB | ratio | native RSS MiB | deepspeed RSS MiB | ratio | "
          "losses equal |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for name, n, d, same in rows:
        print(f"| {name} | {n['step'] * 1e3:.1f} | {d['step'] * 1e3:.1f} | "
              f"{d['step'] / n['step']:.2f} | {n['peak'] / mb:.1f} | {d['peak'] / mb:.1f} | "
              f"{d['peak'] / n['peak']:.2f} | {n['rss'] / mb:.0f} | {d['rss'] / mb:.0f} | "
              f"{d['rss'] / n['rss']:.2f} | {'yes' if same else 'NO'} |")
    step = statistics.median(d["step"] / n["step"] for _, n, d, _ in rows)
    print(f"ratio deepspeed / native step time: median {step:.2f} over {len(rows)} layout(s); "
          f"losses equal in {sum(same for *_, same in rows)} of {len(rows)}")


if __name__ == "__main__":
    main()
