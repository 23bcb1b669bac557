"""The layout options shared by every command that takes one layout (flm predict, flm bench)."""

from __future__ import annotations

import argparse

from frontier_llm.errors import UserError
from frontier_llm.specs.layout import Layout, Sharding


def add_layout_args(parser: argparse.ArgumentParser, required: bool = True) -> None:
    g = parser.add_argument_group("layout")
    g.add_argument("--tp", type=int, default=None if required else 1, required=required,
                   help="tensor-parallel degree")
    g.add_argument("--pp", type=int, default=1, help="pipeline-parallel degree (default 1)")
    g.add_argument("--dp", type=int, default=1, help="data-parallel degree (default 1)")
    g.add_argument("--micro-batch", type=int, default=1,
                   help="sequences per micro-batch (default 1)")
    g.add_argument("--global-batch", type=int, default=None,
                   help="sequences per iteration (default micro-batch x dp)")
    g.add_argument("--schedule", choices=("gpipe", "1f1b", "interleaved"), default=None,
                   help="pipeline schedule (default 1f1b; interleaved when --virtual-stages > 1)")
    g.add_argument("--virtual-stages", type=int, default=1,
                   help="model chunks per pipeline rank for the interleaved schedule")
    g.add_argument("--sequence-parallel", action="store_true",
                   help="shard norms and dropout over the TP ranks (needs tp >= 2)")
    g.add_argument("--recompute", choices=("none", "selective", "full"), default="none",
                   help="activation recomputation (default none)")
    shard = g.add_mutually_exclusive_group()
    shard.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=None,
                       help="ZeRO stage preset for sharding model states over DP (default 0)")
    shard.add_argument("--sharding", default=None, metavar="p=..,g=..,o=..",
                       help="per-component sharding (AMSP): params, grads, optim each "
                            "replicate | full | partial:K, e.g. p=replicate,g=full,o=partial:8")
    g.add_argument("--no-flash-attention", dest="flash_attention", action="store_false",
                   help="model unfused attention (keeps the softmax scores)")
    g.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default=None,
                   help="training precision")


def parse_sharding(text: str) -> Sharding:
    names = {"p": "params", "params": "params", "g": "grads", "grads": "grads",
             "o": "optim", "optim": "optim"}
    parts = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key not in names:
            raise UserError(f"--sharding takes p=..,g=..,o=.. (got {item!r})")
        parts[names[key]] = value
    return Sharding.parse(parts)


def layout_from_args(args: argparse.Namespace, default_dtype: str = "bf16") -> Layout:
    """A validated Layout from the layout options (SpecError names the broken rule)."""
    schedule = args.schedule or ("interleaved" if args.virtual_stages > 1 else "1f1b")
    if args.sharding is not None:
        sharding = parse_sharding(args.sharding)
    else:
        sharding = Sharding.parse(args.zero or 0)
    return Layout(
        tp=args.tp, pp=args.pp, dp=args.dp, micro_batch=args.micro_batch,
        global_batch=args.global_batch or args.micro_batch * args.dp,
        schedule=schedule, virtual_stages=args.virtual_stages,
        sequence_parallel=args.sequence_parallel, recompute=args.recompute,
        flash_attention=args.flash_attention, dtype=args.dtype or default_dtype,
        sharding=sharding,
    )
