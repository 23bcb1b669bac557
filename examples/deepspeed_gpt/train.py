"""A tiny GPT trained with DeepSpeed: the kind of script a user brings to a sweep with
``workload: deepspeed`` (docs/export.md, "A real run here").

It is the user's code, not flm's: it imports torch and deepspeed only. DeepSpeed reads the
layout from the ``ds_config.json`` that ``flm export --to deepspeed`` writes (ZeRO stage,
micro-batch, accumulation, precision, ``steps_per_print``), passed as ``--deepspeed
--deepspeed_config PATH`` (``deepspeed.add_config_arguments``); the model's shape comes from
this script's own flags (DeepSpeed's config holds none), spelled as Megatron spells them. The
data are random tokens from a fixed seed: nothing is downloaded.

Run one process per rank with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set (torchrun, or srun
with the variables exported); on CPU DeepSpeed picks gloo by itself. What it prints is
DeepSpeed's own logging (its version, its configuration block, the ``steps_per_print`` step and
throughput lines): those lines are what ``flm collect --from-logs --trainer deepspeed`` reads.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import deepspeed
import torch
import torch.distributed as dist
from torch import nn


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-layers", type=int, default=4)
    ap.add_argument("--hidden-size", type=int, default=64)
    ap.add_argument("--num-attention-heads", type=int, default=4)
    ap.add_argument("--seq-length", type=int, default=32)
    ap.add_argument("--vocab-size", type=int, default=256)
    ap.add_argument("--train-iters", type=int, default=20, help="optimizer steps")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--log-level", default="info",
                    help="DeepSpeed's logger level (the `deepspeed` launcher's default is info)")
    ap.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
    deepspeed.add_config_arguments(ap)  # --deepspeed, --deepspeed_config
    return ap.parse_args(argv)


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention and a 4x MLP."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(),
                                 nn.Linear(4 * hidden, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=-1)
        q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2) for t in (q, k, v))
        att = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, h))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, a: argparse.Namespace) -> None:
        super().__init__()
        self.tok = nn.Embedding(a.vocab_size, a.hidden_size)
        self.pos = nn.Embedding(a.seq_length, a.hidden_size)
        self.blocks = nn.ModuleList(Block(a.hidden_size, a.num_attention_heads)
                                    for _ in range(a.num_layers))
        self.ln = nn.LayerNorm(a.hidden_size)
        self.head = nn.Linear(a.hidden_size, a.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # DeepSpeed's logger starts at WARNING; its `deepspeed` launcher sets info by default, which
    # is what a log from a run it started holds. srun or torchrun set nothing, and the version
    # line is printed before the ds_config's log_level is read.
    deepspeed.utils.set_log_level_from_string(args.log_level)
    torch.manual_seed(args.seed)
    model = GPT(args)
    # A torch optimizer: DeepSpeed's own (from the config) would JIT-build FusedAdam on CPU.
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    engine, _, _, _ = deepspeed.initialize(args=args, model=model, optimizer=optimizer)
    dtype = torch.bfloat16 if engine.bfloat16_enabled() else \
        torch.float16 if engine.fp16_enabled() else torch.float32
    micro = engine.train_micro_batch_size_per_gpu()
    accumulation = engine.gradient_accumulation_steps()
    # Each data-parallel rank draws its own micro-batches (seed + rank): random tokens, a
    # next-token target, so the loss is a real loss of a real model on meaningless data.
    gen = torch.Generator().manual_seed(args.seed + dist.get_rank())
    for _ in range(args.train_iters):
        for _ in range(accumulation):
            tokens = torch.randint(0, args.vocab_size, (micro, args.seq_length + 1),
                                   generator=gen)
            with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
                loss = engine(tokens[:, :-1], tokens[:, 1:])
            engine.backward(loss)
            engine.step()  # DeepSpeed steps the optimizer at the accumulation boundary
    if not math.isfinite(loss.item()):
        print(f"loss is {loss.item()}", file=sys.stderr, flush=True)
    # End cleanly: a barrier, then no gloo thread left to abort the interpreter at exit.
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
