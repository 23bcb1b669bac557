"""flm plan, flm predict: the cost model from the command line."""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import pandas as pd

from frontier_llm.catalog import load_model, load_system
from frontier_llm.cli import allocation as alloc_cli
from frontier_llm.cli.common import add_command, add_format, emit_frame, emit_json
from frontier_llm.cli.layout_args import add_layout_args, layout_from_args
from frontier_llm.cli.numbers import MAX_GPUS, count, count_list, gpus
from frontier_llm.costmodel import predict
from frontier_llm.planner import SearchSpace, plan
from frontier_llm.planner.explain import explain
from frontier_llm.specs.layout import DType, Engine, Recompute, zero_preset

DEFAULT_MODEL, DEFAULT_SYSTEM, DEFAULT_GPUS = "gpt-175b", "frontier", 1024

# What the table shows (the CSV and JSON formats carry every column).
TABLE_COLUMNS = {
    "rank": "rank", "tp": "tp", "pp": "pp", "dp": "dp", "micro_batch": "mb",
    "schedule": "schedule", "recompute": "recompute", "sequence_parallel": "sp",
    "sharding": "sharding", "step_time_s": "step_s", "tokens_per_s": "tokens/s",
    "model_tflops_per_gpu": "TFLOP/s/gpu", "mfu": "MFU", "peak_memory_gb": "mem_GB",
    "fits": "fits",
}


def _engine_list(text: str) -> tuple[str, ...]:
    words = tuple(w.strip() for w in text.split(",") if w.strip())
    bad = [w for w in words if w not in Engine.words()]
    if bad or not words:
        raise argparse.ArgumentTypeError(
            f"engines are a comma-separated list of {', '.join(Engine.words())} (got {text!r})")
    return tuple(dict.fromkeys(words))


def _display(df: pd.DataFrame, engines: int = 1) -> pd.DataFrame:
    df = df.copy()
    df["peak_memory_gb"] = df["peak_memory_bytes"] / 1e9
    df["schedule"] = [f"{s}:{v}" if s == "interleaved" else str(s)
                      for s, v in zip(df["schedule"], df["virtual_stages"], strict=True)]
    columns = dict(TABLE_COLUMNS)
    if engines > 1:  # the engine column only when the plan compares engines
        columns = {"rank": "rank", "engine": "engine", **columns}
    df = df[list(columns)].rename(columns=columns)
    return df.round({"step_s": 3, "tokens/s": 0, "TFLOP/s/gpu": 1, "MFU": 3, "mem_GB": 1})


def run_plan(args: argparse.Namespace) -> int:
    model, system = load_model(args.model), load_system(args.system)
    space = SearchSpace(
        tp=args.tp, pp=args.pp, micro_batch=args.micro_batch,
        recompute=tuple(args.recompute) if args.recompute else SearchSpace.recompute,
        sharding=tuple(zero_preset(z) for z in args.zero) if args.zero else None,
        flash_attention=(args.flash_attention,), dtype=args.dtype, engine=args.engine,
    )
    refused = alloc_cli.check(args)
    if refused:
        print(f"flm plan: {refused}", file=sys.stderr)
        return 2
    if args.min_gpus:
        return alloc_cli.run_min_gpus(args, model, system, space)
    if alloc_cli.wants_curve(args):
        return alloc_cli.run_curve(args, model, system, space)
    start = time.perf_counter()
    result = plan(model, system, args.gpus, args.global_batch, space)
    seconds = time.perf_counter() - start
    ranked = result.ranked(None if args.risk_aware else args.top,
                           fits_only=not args.include_oom, frontier=not args.all)
    ranked = alloc_cli.annotate(ranked, model, system, args, args.top)
    shown = "" if args.all else (
        f", {len(result.ranked_indices(None, frontier=True)):,} not dominated (no other is as "
        "fast with less memory; --all shows every one)")
    print(
        f"# {model.name} on {args.gpus} x {system.gpu} ({system.name}), global batch "
        f"{result.global_batch}: {len(result.reason):,} layouts evaluated in {seconds:.2f} s, "
        f"{int(np.sum(result.valid)):,} valid and fit{shown}",
        file=sys.stderr,
    )
    for line in alloc_cli.summary_lines(model, system, ranked, args):
        print(line, file=sys.stderr)
    if args.format == "table":
        emit_frame(alloc_cli.display_columns(_display(ranked, len(args.engine)), ranked, args),
                   "table")
    elif args.format == "csv":
        emit_frame(ranked, "csv")
    else:
        emit_json({"model": model.name, "system": system.name, "gpus": args.gpus,
                   "global_batch": result.global_batch, "evaluated": len(result.reason),
                   "interval_confidence": args.confidence, "tokens": args.tokens,
                   "rejected": result.rejections(),
                   "layouts": ranked.to_dict(orient="records")})
    if args.explain:
        print(explain(result), file=sys.stdout if args.format == "table" else sys.stderr)
    if ranked.empty:
        print(f"flm plan: no layout fits; rejected: {result.rejections()}; try more GPUs, "
              "--include-oom to see the closest, or a smaller global batch", file=sys.stderr)
        return 1
    return 0


def run_predict(args: argparse.Namespace) -> int:
    model, system = load_model(args.model), load_system(args.system)
    layout = layout_from_args(args)
    if args.gpus is not None:
        layout.check_world(args.gpus)
    out = {"model": model.name, "system": system.name, "layout": layout.to_dict(),
           **predict(model, system, layout)}
    extra = alloc_cli.predict_extras(out, layout, model, system, args)
    out.update(extra)
    if args.format == "json":
        emit_json(out)
        return 0
    bd = out["breakdown"]
    print(f"{model.name} on {layout.world_size} x {system.gpu} ({system.name})")
    print(f"layout      tp={layout.tp} pp={layout.pp} dp={layout.dp} mb={layout.micro_batch} "
          f"gb={layout.global_batch} {layout.schedule}"
          f"{f':{layout.virtual_stages}' if layout.virtual_stages > 1 else ''} "
          f"recompute={layout.recompute}{' sp' if layout.sequence_parallel else ''} "
          f"{layout.sharding.describe()} {layout.dtype} engine={layout.engine}")
    print(f"step time   {out['step_time_s']:.4g} s   ({out['tokens_per_s']:,.0f} tokens/s)")
    print(f"throughput  {out['model_tflops_per_gpu']:.1f} model TFLOP/s/GPU, "
          f"{out['hardware_tflops_per_gpu']:.1f} hardware; MFU {out['mfu']:.1%}, "
          f"HFU {out['hfu']:.1%}")
    fits = "fits" if out["fits"] else "DOES NOT FIT"
    print(f"memory      {out['peak_memory_bytes'] / 1e9:.2f} GB peak (stage "
          f"{bd['peak_memory_stage']}) of {system.memory_bytes / 1e9:.0f} GB: {fits}")
    total = out["step_time_s"]
    print("time        " + ", ".join(f"{k} {v:.3g} s ({v / total:.0%})"
                                      for k, v in bd["time_s"].items() if v > 0))
    print("memory      " + ", ".join(f"{k} {v / 1e9:.2f} GB"
                                      for k, v in bd["memory_bytes"].items() if v > 0))
    for line in alloc_cli.predict_lines(extra):
        print(line)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "plan", "rank every valid layout of a model on N GPUs",
        "Enumerate every tensor x pipeline x data-parallel layout of MODEL on GPUS GPUs of SYSTEM "
        "(micro-batch, schedule and virtual stages, recompute, sequence parallelism, ZeRO and "
        "AMSP sharding), predict each one's memory and step time with the cost model, reject "
        "those that break a rule or do not fit, and print the fastest first. Without options: "
        f"{DEFAULT_MODEL} on {DEFAULT_GPUS} {DEFAULT_SYSTEM} GCDs.",
        ["flm plan", "flm plan --model gpt-1t --system frontier --gpus 3072 --top 20 --explain",
         "flm plan --model llama3-70b --system frontier --gpus 768 --engine megatron,deepspeed",
         "flm plan --model llama3-70b --system dgx-h100 --gpus 64 --tp 8 --format csv",
         "flm plan --model my-model.yaml --system my-system.yaml --gpus 128",
         "flm plan --model gpt-1t --system frontier --tokens 20T --deadline 120d "
         "--engine megatron"],
    )
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"catalog name or YAML path (default {DEFAULT_MODEL}; see flm models)")
    p.add_argument("--system", default=DEFAULT_SYSTEM,
                   help=f"catalog name or YAML path (default {DEFAULT_SYSTEM}; see flm systems)")
    p.add_argument("--gpus", type=gpus, default=DEFAULT_GPUS,
                   help=f"number of GPUs (Frontier: GCDs) (default {DEFAULT_GPUS}; at most "
                        f"{MAX_GPUS:,})")
    p.add_argument("--global-batch", type=count(1), default=None,
                   help="sequences per iteration (default: the smallest multiple of --gpus "
                        "holding 4M tokens)")
    p.add_argument("--top", type=count(1), default=20, help="rows to print (default 20)")
    p.add_argument("--explain", action="store_true",
                   help="say why the winner wins and how many layouts each rule rejected")
    p.add_argument("--include-oom", action="store_true",
                   help="also rank layouts that do not fit in memory (after those that do)")
    p.add_argument("--all", action="store_true",
                   help="rank every layout; by default a layout is left out when another is at "
                        "least as fast with no more memory (it is dominated)")
    g = p.add_argument_group("restrict the search")
    g.add_argument("--tp", type=count_list(1, MAX_GPUS), help="tensor-parallel degrees, e.g. 4,8")
    g.add_argument("--pp", type=count_list(1, MAX_GPUS), help="pipeline degrees, e.g. 8,16")
    g.add_argument("--micro-batch", type=count_list(1), help="micro-batch sizes, e.g. 1,2")
    g.add_argument("--recompute", nargs="+", choices=Recompute.words())
    g.add_argument("--zero", type=int, nargs="+", choices=(0, 1, 2, 3),
                   help="only these ZeRO presets (default: ZeRO-0..3 and AMSP partial ones)")
    g.add_argument("--no-flash-attention", dest="flash_attention", action="store_false",
                   help="assume unfused attention")
    g.add_argument("--dtype", choices=DType.words(), default="bf16")
    g.add_argument("--engine", type=_engine_list, default=(Engine.NATIVE.value,),
                   metavar="ENGINE[,ENGINE]",
                   help="training engines to plan for, comma-separated, of "
                        f"{', '.join(Engine.words())} (default native); each engine's rules "
                        "(specs/engine_rules.py) reject what it cannot run")
    alloc_cli.add_arguments(p)
    add_format(p)
    p.set_defaults(func=run_plan)

    p = add_command(
        sub, "predict", "predict memory and step time of one layout",
        "Predict one layout's step time (with its breakdown: compute, TP/PP/DP communication, "
        "pipeline bubble, optimizer), throughput, MFU/HFU and per-rank peak memory (with its "
        "breakdown), and whether it fits.",
        ["flm predict --model gpt-175b --system frontier --tp 8 --pp 16 --dp 8 --micro-batch 1 "
         "--global-batch 1024",
         "flm predict --model gpt-1t --system dgx-a100 --tp 8 --pp 64 --micro-batch 1 "
         "--global-batch 512 --recompute selective --sequence-parallel --format json"],
    )
    p.add_argument("--model", required=True, help="catalog name or YAML path")
    p.add_argument("--system", required=True, help="catalog name or YAML path")
    p.add_argument("--gpus", type=gpus, default=None,
                   help="check that tp x pp x dp uses exactly this many GPUs")
    add_layout_args(p)
    alloc_cli.add_predict_arguments(p)
    add_format(p, choices=("table", "json"))
    p.set_defaults(func=run_predict)

