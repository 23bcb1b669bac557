"""flm bench: run the distributed GPT training benchmark for one layout and write its trace.

Only the options live here; configuration, run ids and local spawning are frontier_llm.bench's.
"""

from __future__ import annotations

import argparse
import sys

from frontier_llm.cli.common import add_command
from frontier_llm.cli.layout_args import add_layout_args
from frontier_llm.cli.numbers import MAX_LOCAL_RANKS, count, positive_float


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "bench", "run the distributed training benchmark for one layout",
        "Train a GPT with PyTorch-native tensor, pipeline and (sharded) data parallelism (or "
        "with DeepSpeed: --engine deepspeed) for a few steps and write "
        "<trace-dir>/<run-id>.trace.json: per-step times and losses, "
        "per-rank memory, tokens/s, TFLOP/s and MFU, beside the cost model's prediction.\n\n"
        "Inside torchrun, srun or mpiexec it joins the job's ranks; otherwise it starts --nproc "
        "local ranks itself (default tp x cp x pp x dp). Exit status: 0 completed, 3 out of "
        "memory, 1 other failure, 2 bad input (refused before any process starts).",
        [
            "flm bench --model tiny-gpt --tp 2 --dp 2 --dtype fp32 --steps 5",
            "flm bench --model tiny-gpt-8l --pp 2 --virtual-stages 2 --micro-batch 1 "
            "--global-batch 4 --dtype fp32",
            "flm bench --model tiny-gpt --dp 4 --zero 3 --global-batch 8 --trace-dir traces",
            "flm bench --model tiny-gpt --dp 2 --zero 2 --global-batch 4 --engine deepspeed",
            "flm bench --config layout.yaml --trace-dir traces --label sweep=demo",
            "srun -n 8 flm bench --model gpt3-1.3b --system dgx-h100 --tp 2 --dp 4 "
            "--global-batch 64",
        ],
    )
    p.add_argument("--model", default=None, help="catalog model name or model YAML path")
    p.add_argument("--system", default=None,
                   help="catalog system or YAML path (default: cpu-local without a GPU)")
    p.add_argument("--config", default=None, metavar="layout.yaml",
                   help="YAML with layout fields (and optionally model, system, steps, ...); "
                        "flags given on the command line override it")
    # Every layout default is None ("not given"), so --config values are only overridden by
    # explicit flags.
    add_layout_args(p, required=False)
    r = p.add_argument_group("run")
    r.add_argument("--steps", type=count(1), default=None, help="measured steps (default 10)")
    r.add_argument("--warmup", type=count(0), default=None,
                   help="warm-up steps, recorded but not measured (default 2)")
    r.add_argument("--seed", type=count(0, 2**63 - 1), default=None,
                   help="weights and data seed (default 0)")
    r.add_argument("--trace-dir", default="traces", help="where the trace goes (default traces)")
    r.add_argument("--run-id", default=None, help="trace name (default: generated)")
    r.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                   help="tag the trace (repeatable); sweeps set sweep=NAME and job_key=KEY")
    r.add_argument("--memory-limit", default=None, metavar="SIZE",
                   help="per-rank memory limit (e.g. 512M); exceeding it ends in an oom trace")
    r.add_argument("--data", default=None, metavar="tokens.bin",
                   help="memory-mapped token file (uint16 ids, uint32 above 65536 tokens) "
                        "instead of synthetic tokens")
    r.add_argument("--bucket-mb", type=positive_float(1e6), default=None, metavar="MB",
                   help="gradient all-reduce bucket of the DDP and ZeRO-1 paths in MiB "
                        "(default 64; a run setting flm tune can search)")
    r.add_argument("--grad-sync-each-microbatch", action="store_true",
                   help="FSDP2 reduce-scatters gradients after every micro-batch (torchtitan's "
                        "accumulation) instead of only after the last (default)")
    r.add_argument("--nproc", type=count(1, MAX_LOCAL_RANKS), default=None,
                   help="local ranks to start when not inside a launcher (default "
                        f"tp x cp x pp x dp; at most {MAX_LOCAL_RANKS})")
    r.add_argument("--fault", choices=("crash", "hang"), default=None,
                   help="inject a failure on the last rank (tests of failure handling)")
    r.add_argument("--fault-step", type=count(0), default=0, help="step of the injected fault")
    p.set_defaults(func=run)


# A prediction off by this factor or more is not a model error to read but a system file that
# does not describe this machine (cpu-local is a generic CPU: 190x off was seen).
OFF_BY = 2.0


def run(args: argparse.Namespace) -> int:
    from frontier_llm.bench.config import build_config
    from frontier_llm.bench.start import run as run_bench

    cfg = build_config(args)
    code = run_bench(cfg, args.nproc)
    # Under a launcher each rank ends inside run_bench; here the run was started locally.
    note = calibration_hint(cfg) if code == 0 else None
    if note:
        print(f"flm bench: {note}", file=sys.stderr)
    return code


def calibration_hint(cfg) -> str | None:
    """One line when the prediction in the finished run's trace is ``OFF_BY`` or more off the
    measured step time: the system file does not describe this machine, and flm calibrate
    measures one that does. None when the run left no such trace or the prediction is near."""
    from frontier_llm.bench.trace import read_trace, trace_path

    path = trace_path(cfg.trace_dir, cfg.run_id) if cfg.run_id else None
    if path is None or not path.is_file():
        return None
    trace = read_trace(path)
    measured = (trace.get("summary") or {}).get("step_time_s")
    predicted = (trace.get("prediction") or {}).get("step_time_s")
    if not measured or not predicted:
        return None
    ratio = measured / predicted
    if 1 / OFF_BY < ratio < OFF_BY:
        return None
    how = f"{ratio:.0f}x too fast" if ratio > 1 else f"{1 / ratio:.0f}x too slow"
    base = cfg.system_ref or cfg.system.name
    nproc = max(2, cfg.layout.world_size)  # flm calibrate run needs two ranks to time links
    return (f"the prediction ({predicted:.3g} s a step) is {how} against the measured "
            f"{measured:.3g} s: {cfg.system.name} does not describe this machine; measure it "
            f"with `flm calibrate run --nproc {nproc} --system {base} --out here.yaml` and "
            "pass --system here.yaml (docs/calibrate.md)")
