"""flm plan, flm predict: the cost model from the command line."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import numpy as np
import pandas as pd

from frontier_llm.catalog import load_model, load_system
from frontier_llm.cli import allocation as alloc_cli
from frontier_llm.cli.common import add_command, add_format, emit_frame, emit_json
from frontier_llm.cli.layout_args import (
    add_layout_args,
    add_space_args,
    layout_from_args,
    space_from_args,
)
from frontier_llm.cli.moe_args import (
    DUALPIPE_NOTE,
    add_moe_args,
    moe_note,
    moe_run_from_args,
    with_router_balance,
)
from frontier_llm.cli.numbers import MAX_GPUS, count, gpus
from frontier_llm.cli.overlap_args import (
    add_p2p_overlap,
    add_tp_overlap,
    p2p_overlap_from_args,
    tp_overlap_from_args,
)
from frontier_llm.cli.run_settings import run_settings
from frontier_llm.costmodel import predict
from frontier_llm.costmodel.layouts import LayoutTable
from frontier_llm.costmodel.p2p_overlap import P2P_OVERLAP_FLAG, WHERE, p2p_overlap_refusal
from frontier_llm.costmodel.p2p_overlap import acts_on as p2p_acts_on
from frontier_llm.costmodel.tp_overlap import TP_OVERLAP_FLAG, tp_overlap_refusal
from frontier_llm.costmodel.tp_overlap import WHERE as TP_WHERE
from frontier_llm.costmodel.tp_overlap import acts_on as tp_acts_on
from frontier_llm.errors import UserError
from frontier_llm.planner import SearchSpace, plan
from frontier_llm.planner.allocation import format_tokens
from frontier_llm.planner.explain import explain
from frontier_llm.planner.plan import in_dtype
from frontier_llm.specs.engine_rules import CP_EXCHANGE, CP_EXCHANGES
from frontier_llm.specs.forms import display_layouts, label
from frontier_llm.specs.layout import DType, Engine
from frontier_llm.specs.model import MAX_DIMENSION, ModelSpec

DEFAULT_MODEL, DEFAULT_SYSTEM, DEFAULT_GPUS = "gpt-175b", "frontier", 1024

# The figures the table shows beside the layout columns that differ between its rows (the CSV
# and JSON formats carry every column).
# MFU in percent, as flm results, flm predict and --explain print it (the CSV and JSON keep
# the fraction, ``mfu``, as every frame of the API does).
TABLE_FIGURES = {"step_time_s": "step_s", "tokens_per_s": "tokens/s",
                 "model_tflops_per_gpu": "TFLOP/s/gpu", "mfu_pct": "MFU_%",
                 "peak_memory_gb": "mem_GB", "fits": "fits"}


def _display(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    df["peak_memory_gb"] = df["peak_memory_bytes"] / 1e9
    df["mfu_pct"] = df["mfu"] * 100
    out = pd.concat([df[["rank"]], display_layouts(df),
                     df[list(TABLE_FIGURES)].rename(columns=TABLE_FIGURES)], axis=1)
    # --fp8-speedup's columns: the same layout in the other precision.
    extra = [c for c in ("bf16_step_s", "fp8_step_s", "fp8_speedup") if c in df]
    out = pd.concat([out, df[extra]], axis=1)
    return out.round({"step_s": 3, "tokens/s": 0, "TFLOP/s/gpu": 1, "MFU_%": 1, "mem_GB": 1,
                      "bf16_step_s": 3, "fp8_step_s": 3, "fp8_speedup": 2})


def model_from_args(args: argparse.Namespace) -> ModelSpec:
    """The model of ``--model``, at ``--seq-len`` tokens when given (a long-context stage of
    the same model: every figure of the cost model follows the sequence length)."""
    model = load_model(args.model)
    if getattr(args, "seq_len", None):
        model = dataclasses.replace(model, seq_len=args.seq_len)
    return with_router_balance(model, args)


def _at_length(args: argparse.Namespace, model: ModelSpec) -> str:
    """' at N tokens' where --seq-len changed the model's length (else nothing: the catalog's
    model is what its name says)."""
    return f" at {model.seq_len:,} tokens" if getattr(args, "seq_len", None) else ""


def _add_seq_len(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seq-len", type=count(1, MAX_DIMENSION, "the sequence length"),
                   default=None, metavar="N",
                   help="tokens per sequence, overriding the model's (long-context training: "
                        "context parallelism, --cp, splits it)")


def _first_runs_where(model: ModelSpec, ranked: pd.DataFrame, p2p_overlap: bool = False,
                      tp_comm_overlap: bool = False) -> str | None:
    """A line when the ranking's #1 is a layout no trainer flm exports to can run (AMSP's
    partial sharding under the native engine, say): flm bench measures it, but a user who
    takes #1 to Megatron-LM or torchtitan would be refused (flm export --from-plan skips it)."""
    from frontier_llm.errors import UserError
    from frontier_llm.specs.forms import layout_from_row
    from frontier_llm.trainers import NAMES, get

    if ranked.empty:
        return None
    layout = layout_from_row(ranked.iloc[0])
    if (tp_comm_overlap and layout.engine == Engine.MEGATRON and layout.tp > 1
            and tp_overlap_refusal(layout)):
        # Priced as Megatron-LM runs it, without the overlap (which it asserts sequence
        # parallelism for): said, since the plan was asked for the overlap.
        return (f"# rank 1 ({label(layout)}) is priced without {TP_OVERLAP_FLAG}, which "
                "Megatron-LM runs only with sequence parallelism (validate_args asserts it): "
                "--sequence-parallel on restricts the plan to layouts it runs overlapped; flm "
                f"export --from-plan with {TP_OVERLAP_FLAG} on skips this one")
    runs = []
    for name in NAMES:
        trainer = get(name)
        run = trainer.run_settings(p2p_overlap, tp_comm_overlap)
        try:
            trainer.check(model, layout, **run)
        except UserError:
            continue
        runs.append(name)
    if runs:
        return None
    if not p2p_overlap and not p2p_overlap_refusal(layout):
        try:
            get("megatron-lm").check(model, layout, p2p_overlap=True,
                                     tp_comm_overlap=tp_comm_overlap)
        except UserError:
            pass
        else:  # refused only for its pipeline sends not overlapped (interleaved pp 2)
            return (f"# rank 1 ({label(layout)}) runs under megatron-lm only with its p2p "
                    "overlap (Megatron asserts pp > 2 for an interleaved schedule without "
                    f"it): {P2P_OVERLAP_FLAG} on prices that run")
    where = ("flm bench only" if not model.is_mla else
             "no tool flm drives (flm bench builds no multi-head latent attention)")
    return (f"# rank 1 ({label(layout)}) runs under {where}: none of "
            f"{', '.join(NAMES)} expresses it (flm export --from-plan names what it skips "
            "and takes the next one each trainer runs)")


def resolve_gpus(args: argparse.Namespace, system, command: str = "flm plan") -> str | None:
    """Set ``args.gpus`` from ``--nodes`` (whole nodes of the system) or ``--gpus`` (default
    :data:`DEFAULT_GPUS`); the refusal when they disagree, else None. A count past one node
    that is not whole nodes is planned with a warning on stderr: the scheduler gives whole nodes
    (Frontier and LUMI's standard-g are allocated by node), so the rest idle and are billed."""
    per_node = system.gpus_per_node
    nodes = getattr(args, "nodes", None)
    if nodes is not None:
        if args.gpus is not None and args.gpus != nodes * per_node:
            return (f"--nodes {nodes} is {nodes * per_node:,} GPUs of {system.name} "
                    f"({per_node} a node), --gpus says {args.gpus:,}: give one of them")
        args.gpus = nodes * per_node
    elif args.gpus is None:
        args.gpus = DEFAULT_GPUS
    if args.gpus > per_node and args.gpus % per_node:
        whole = -(-args.gpus // per_node)
        print(f"{command}: warning: {args.gpus:,} GPUs is {args.gpus / per_node:,.2f} nodes of "
              f"{system.name} ({per_node} GPUs each): a job gets whole nodes, so "
              f"{whole * per_node - args.gpus} GPUs would idle and be billed; --nodes {whole} "
              f"({whole * per_node:,} GPUs) or --gpus {(whole - 1) * per_node} plans whole "
              "nodes", file=sys.stderr)
    return None


def _compare_systems(args: argparse.Namespace) -> int:
    """``--system A,B``: each system's ranking, its top ``--top`` rows, in one table with a
    ``system`` column (and ``gpus``, which ``--nodes`` makes differ): one proposal's candidate
    machines side by side, each planned exactly as ``flm plan --system NAME`` plans it."""
    import copy

    if args.min_gpus or alloc_cli.wants_curve(args):
        print("flm plan: several --system values compare the rankings; --min-gpus and the "
              "curve take one system", file=sys.stderr)
        return 2
    model = model_from_args(args)
    frames = []
    for name in [n.strip() for n in args.system.split(",") if n.strip()]:
        one = copy.copy(args)
        one.system = name
        system = load_system(name)
        wrong = resolve_gpus(one, system)
        if wrong:
            print(f"flm plan: {wrong}", file=sys.stderr)
            return 2
        space = SearchSpace(dtype=args.dtype, **space_from_args(args))
        result = plan(model, system, one.gpus, args.global_batch, space, **run_settings(args))
        ranked = result.ranked(args.top, fits_only=not args.include_oom, frontier=not args.all)
        ranked = alloc_cli.annotate(ranked, model, system, one, args.top)
        nodes = -(-one.gpus // system.gpus_per_node)
        print(f"# {system.name}: {one.gpus:,} x {system.gpu} ({nodes:,} nodes), global batch "
              f"{result.global_batch:,}, {int(np.sum(result.valid)):,} layouts valid and fit",
              file=sys.stderr)
        frames.append(ranked.assign(system=system.name, gpus=one.gpus))
    both = pd.concat(frames, ignore_index=True)
    if args.format == "table":
        shown = alloc_cli.display_columns(_display(both), both, args)
        front = ["system", "gpus"]
        shown.insert(0, "gpus", both["gpus"].to_numpy())
        shown.insert(0, "system", both["system"].to_numpy())
        emit_frame(shown[front + [c for c in shown.columns if c not in front]], "table")
    elif args.format == "csv":
        emit_frame(both, "csv")
    else:
        emit_json({"model": model.name, "systems": sorted(set(both["system"])),
                   "layouts": both.to_dict(orient="records")})
    return 0


def run_plan(args: argparse.Namespace) -> int:
    if "," in args.system:
        return _compare_systems(args)
    model, system = model_from_args(args), load_system(args.system)
    space = SearchSpace(dtype=args.dtype, **space_from_args(args))
    wrong = resolve_gpus(args, system)
    if wrong:
        print(f"flm plan: {wrong}", file=sys.stderr)
        return 2
    refused = alloc_cli.check(args)
    if refused:
        print(f"flm plan: {refused}", file=sys.stderr)
        return 2
    if args.min_gpus:
        return alloc_cli.run_min_gpus(args, model, system, space)
    if alloc_cli.wants_curve(args):
        return alloc_cli.run_curve(args, model, system, space)
    start = time.perf_counter()
    result = plan(model, system, args.gpus, args.global_batch, space, **run_settings(args))
    seconds = time.perf_counter() - start
    ranked = result.ranked(None if args.risk_aware else args.top,
                           fits_only=not args.include_oom, frontier=not args.all)
    ranked = alloc_cli.annotate(ranked, model, system, args, args.top)
    if args.fp8_speedup:
        ranked = _with_speedup(ranked, result, model, system, args)
    shown = "" if args.all else (
        f", {len(result.ranked_indices(None, frontier=True)):,} not dominated (no other is as "
        "fast with less memory; --all shows every one)")
    print(
        f"# {model.name}{_at_length(args, model)} on {args.gpus} x {system.gpu} "
        f"({system.name}), global batch {result.global_batch:,} sequences = "
        f"{format_tokens(result.global_batch * model.seq_len)} tokens"
        f"{'' if args.global_batch else ' (the default: 4M tokens in whole sequences)'}"
        f"{', element-wise work priced eager (--eager)' if args.eager else ''}"
        f"{NO_OVERLAP_NOTE if args.deepspeed_overlap_comm == 'off' else ''}"
        f"{TP_OVERLAP_NOTE if tp_overlap_from_args(args) else ''}"
        f"{cp_exchange_note(args)}"
        f"{P2P_OVERLAP_NOTE if p2p_overlap_from_args(args) else ''}"
        f"{moe_note(args, model)}: "
        f"{len(result.reason):,} layouts evaluated in {seconds:.2f} s, "
        f"{int(np.sum(result.valid)):,} valid and fit{shown}",
        file=sys.stderr,
    )
    for line in alloc_cli.summary_lines(model, system, ranked, args):
        print(line, file=sys.stderr)
    if p2p_overlap_from_args(args) and not _any_interleaved_megatron(result.layouts):
        print(P2P_NO_EFFECT, file=sys.stderr)
    if tp_overlap_from_args(args) and not np.any(tp_acts_on(result.layouts)):
        print(TP_NO_EFFECT, file=sys.stderr)
    note = _first_runs_where(model, ranked, p2p_overlap_from_args(args),
                             tp_overlap_from_args(args))
    if note:
        print(note, file=sys.stderr)
    if moe_run_from_args(args).overlap == "dualpipe":
        print(DUALPIPE_NOTE, file=sys.stderr)
    if args.format == "table":
        emit_frame(alloc_cli.display_columns(_display(ranked), ranked, args), "table")
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


def _with_speedup(ranked: pd.DataFrame, result, model: ModelSpec, system, args
                  ) -> pd.DataFrame:
    """``ranked`` with the same layouts' step time in the other precision (bf16 for an fp8
    plan, fp8 for a bf16 one) and the fp8 speed-up over bf16 (bf16 step / fp8 step)."""
    if args.dtype not in ("bf16", "fp8"):
        raise UserError("--fp8-speedup compares bf16 with fp8: plan with --dtype bf16 or fp8")
    other = "bf16" if args.dtype == "fp8" else "fp8"
    idx = result.ranked_indices(None if args.risk_aware else args.top,
                                fits_only=not args.include_oom, frontier=not args.all)
    fig = in_dtype(model, system, result.layouts.take(idx), other, **run_settings(args))
    mine = result.figures["step_time_s"][idx]
    out = ranked.copy()
    # annotate() may drop or reorder rows (--risk-aware): align on the rank the plan gave.
    by_rank = dict(zip(range(1, len(idx) + 1), fig["step_time_s"], strict=True))
    mine_by_rank = dict(zip(range(1, len(idx) + 1), mine, strict=True))
    out[f"{other}_step_s"] = out["rank"].map(by_rank)
    bf16 = out[f"{other}_step_s"] if other == "bf16" else out["rank"].map(mine_by_rank)
    fp8 = out["rank"].map(mine_by_rank) if other == "bf16" else out[f"{other}_step_s"]
    out["fp8_speedup"] = bf16 / fp8
    return out


def run_predict(args: argparse.Namespace) -> int:
    model, system = model_from_args(args), load_system(args.system)
    layout = layout_from_args(args)
    if args.gpus is not None:
        layout.check_world(args.gpus)
    out = {"model": model.name, "system": system.name, "layout": layout.to_dict(),
           **predict(model, system, layout, moe_run=moe_run_from_args(args),
                     cp_exchange=args.cp_exchange, p2p_overlap=p2p_overlap_from_args(args),
                     tp_comm_overlap=tp_overlap_from_args(args))}
    extra = alloc_cli.predict_extras(out, layout, model, system, args)
    out.update(extra)
    if args.format == "json":
        emit_json(out)
        return 0
    bd = out["breakdown"]
    print(f"{model.name}{_at_length(args, model)} on {layout.world_size} x {system.gpu} "
          f"({system.name})")
    print(f"layout      {label(layout)}"
          f"{P2P_OVERLAP_NOTE.replace(',', ';', 1) if p2p_overlap_from_args(args) else ''}"
          f"{TP_OVERLAP_NOTE.replace(',', ';', 1) if tp_overlap_from_args(args) else ''}")
    if layout.cp > 1 and layout.engine == Engine.NATIVE:
        exchange = args.cp_exchange or CP_EXCHANGE["flm-bench"]
        print(f"cp exchange {exchange} ("
              f"{'flm bench' if exchange == 'gather' else 'PyTorch context_parallel'}"
              "; --cp-exchange)")
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


NO_OVERLAP_NOTE = ", DeepSpeed ZeRO-1/2 without overlap_comm (--deepspeed-overlap-comm off)"
CP_EXCHANGE_HELP = (
    "how the native engine's context parallelism (cp > 1) exchanges K/V, priced in time and "
    "memory: gather (default, the engine's rule: flm bench's own CP, one K/V all-gather and one "
    "attention over the whole sequence under an (s/cp) x s mask kept for the step, the gathered "
    "K/V saved for backward; what flm bench and flm memcheck run) or ring (PyTorch's "
    "context_parallel as torchtitan runs it: cp partial flash attentions merged in fp32, the "
    "gather hidden behind the first, no mask and no gathered K/V kept; what flm export --to "
    "torchtitan writes). Megatron layouts keep TransformerEngine's ring "
    "(docs/costmodel.md 'Context parallelism')")


def add_cp_exchange(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cp-exchange", choices=CP_EXCHANGES, default=None, help=CP_EXCHANGE_HELP)


def cp_exchange_note(args: argparse.Namespace) -> str:
    """The plan header's words for a --cp-exchange other than the engine's rule."""
    if args.cp_exchange in (None, CP_EXCHANGE["flm-bench"]):
        return ""
    return ", native context parallelism as PyTorch's context_parallel ring (--cp-exchange ring)"
TP_OVERLAP_NOTE = ", Megatron-LM with --tp-comm-overlap (--tp-comm-overlap on)"
P2P_OVERLAP_NOTE = (", Megatron-LM's interleaved pipeline sends overlapped with compute "
                    f"({P2P_OVERLAP_FLAG} on)")
# flm plan: the flag asked for where the search holds no layout it acts on (a restricted
# engine or schedule): said, so an unchanged ranking is not taken for the overlap's verdict.
P2P_NO_EFFECT = (f"flm plan: note: {P2P_OVERLAP_FLAG} on has no effect here: it applies to "
                 f"{WHERE}, and no layout searched is one")


# The same for --tp-comm-overlap: no layout searched has Megatron-LM's TP collectives.
TP_NO_EFFECT = (f"flm plan: note: {TP_OVERLAP_FLAG} on has no effect here: it applies to "
                f"{TP_WHERE}, and no layout searched is engine megatron with tp > 1 and "
                "sequence parallelism")


def _any_interleaved_megatron(layouts: LayoutTable) -> bool:
    """Whether any layout of the plan is one ``p2p_overlap`` acts on."""
    return bool(np.any(p2p_acts_on(layouts)))


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
         "flm plan --model gpt-175b --system frontier --gpus 1024 --seq-len 131072",
         "flm plan --model gpt-1t --system frontier --tokens 20T --deadline 120d "
         "--engine megatron"],
    )
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"catalog name or YAML path (default {DEFAULT_MODEL}; see flm models)")
    p.add_argument("--system", default=DEFAULT_SYSTEM,
                   help=f"catalog name or YAML path (default {DEFAULT_SYSTEM}; see flm systems)"
                        "; several, comma-separated, compare their rankings in one table "
                        "(--nodes N: the same node count of each)")
    _add_seq_len(p)
    p.add_argument("--gpus", type=gpus, default=None,
                   help=f"number of GPUs (Frontier: GCDs) (default {DEFAULT_GPUS}; at most "
                        f"{MAX_GPUS:,}); past one node, not whole nodes is planned with a "
                        "warning")
    p.add_argument("--nodes", type=count(1, MAX_GPUS, "the node count"), default=None,
                   help="number of whole nodes instead of --gpus (x the system's "
                        "gpus_per_node: 128 Frontier nodes are 1,024 GCDs)")
    p.add_argument("--global-batch", type=count(1), default=None,
                   help="sequences per iteration (default: 4M tokens in whole sequences, "
                        "rounded up to a multiple of the largest divisor of the GPU count that "
                        "is at most that many sequences: 2,048 of gpt-175b on 1,024 or 4,096 "
                        "GPUs, 3,060 on 1,020)")
    p.add_argument("--top", type=count(1), default=20, help="rows to print (default 20)")
    p.add_argument("--explain", action="store_true",
                   help="say why the winner wins and how many layouts each rule rejected")
    p.add_argument("--include-oom", action="store_true",
                   help="also rank layouts that do not fit in memory (after those that do)")
    p.add_argument("--eager", action="store_true",
                   help="price element-wise work as un-compiled PyTorch runs it, one kernel "
                        "per op (measured traffic, about 4x the fused kernels': "
                        "docs/costmodel.md section 5): flm bench's engines and torchtitan "
                        "without [compile] run so; Megatron-LM layouts keep their fused "
                        "kernels. Default: fused (torch.compile, TransformerEngine, XLA)")
    p.add_argument("--deepspeed-overlap-comm", choices=("on", "off"), default="on",
                   help="DeepSpeed's zero_optimization.overlap_comm for its ZeRO-1/2 layouts. "
                        "on (default): the config flm writes (flm bench, flm export), "
                        "gradients reduced behind backward; off: a ds_config that leaves the "
                        "key unset (DeepSpeed's default below stage 3, as Megatron-DeepSpeed's "
                        "example recipes do), reductions on the compute stream, exposed. "
                        "ZeRO-3 keeps its default, on (docs/costmodel.md 'DeepSpeed')")
    add_tp_overlap(p)
    add_p2p_overlap(p)
    p.add_argument("--all", action="store_true",
                   help="rank every layout; by default a layout is left out when another is at "
                        "least as fast with no more memory (it is dominated)")
    g = p.add_argument_group("restrict the search", "one flag per layout knob; a knob not "
                             "given is searched over its default list")
    add_space_args(g)
    g.add_argument("--dtype", choices=DType.words(), default="bf16",
                   help="training precision (default bf16); fp8: bf16 training whose linear "
                        "layers multiply in FP8 (--fp8-recipe; docs/costmodel.md 'FP8'), on "
                        "GPUs with FP8 tensor cores only (not A100 or MI250X)")
    p.add_argument("--fp8-speedup", action="store_true",
                   help="with --dtype fp8 (or bf16): also predict each ranked layout in the "
                        "other precision and show the fp8 speed-up over bf16 for the same "
                        "layout (columns bf16_step_s or fp8_step_s, and fp8_speedup)")
    add_moe_args(p)
    add_cp_exchange(p)
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
    _add_seq_len(p)
    p.add_argument("--gpus", type=gpus, default=None,
                   help="check that tp x cp x pp x dp uses exactly this many GPUs")
    add_layout_args(p)
    add_p2p_overlap(p, "; refused for any other layout")
    add_tp_overlap(p, "; refused for any other layout")
    add_moe_args(p)
    add_cp_exchange(p)
    alloc_cli.add_predict_arguments(p)
    add_format(p, choices=("table", "json"))
    p.set_defaults(func=run_predict)

