"""``python -m frontier_llm.gpucheck STEP --work DIR [--tiny] [--limit S]``: one step of the check.

``require`` exits 2 with one line when the mode's device is missing (no CUDA for the GPU mode),
before anything else runs and without a traceback; ``summarize --out OUTDIR`` writes the
results. scripts/gpu-check.sh calls these one by one, each under its own ``timeout``.
Only the standard library is imported before a step runs: ``require`` must answer even where
the project's dependencies are not installed yet.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def require(gpu: bool) -> int:
    """0 when the mode can run here, else one line on stderr and 2."""
    try:
        import torch
    except Exception as exc:  # no torch at all: say which Python lacks it
        print(f"gpu-check: needs PyTorch; {sys.executable} cannot import torch "
              f"({type(exc).__name__}: {exc})", file=sys.stderr)
        return 2
    if gpu and not torch.cuda.is_available():
        print(f"gpu-check: needs a CUDA GPU visible to PyTorch (torch {torch.__version__} "
              f"at {sys.executable} sees none); run it on the GPU node, or with --tiny for the "
              "CPU self-test", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m frontier_llm.gpucheck")
    p.add_argument("step", choices=("require", "preflight", "mfu", "memory", "calibrate",
                                    "deepspeed", "attention", "fp8", "summarize"))
    p.add_argument("--work", type=Path, help="folder of the steps' results")
    p.add_argument("--out", type=Path, help="summarize: OUTDIR")
    p.add_argument("--tiny", action="store_true", help="the CPU self-test mode")
    p.add_argument("--limit", type=float, default=60.0, help="seconds this step may take")
    p.add_argument("--total-limit", type=float, default=None, help="summarize: the budget")
    args = p.parse_args(argv)
    if args.step == "require":
        return require(gpu=not args.tiny)
    from frontier_llm.gpucheck.modes import GPU, TINY

    mode = TINY if args.tiny else GPU
    if args.work is None:
        p.error("--work is required")
    args.work.mkdir(parents=True, exist_ok=True)
    if args.step == "summarize":
        from frontier_llm.gpucheck.summary import write

        if args.out is None:
            p.error("summarize needs --out")
        import json

        for path in write(mode, args.work, args.out, args.total_limit):
            print(path)
        # 1 when anything failed: the caller sees it without reading the summary.
        return 1 if json.loads((args.out / "summary.json").read_text())["failures"] else 0
    from frontier_llm.gpucheck.steps import STEPS, end_runs_on_sigterm

    end_runs_on_sigterm()
    return STEPS[args.step](mode, args.work, args.limit)


if __name__ == "__main__":
    sys.exit(main())
