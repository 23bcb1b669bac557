"""One rank of tests/test_tp_layers.py: the plain-tensor TP layers against the whole model.

Run as ``python tests/tp_layers_ranks.py OUT MODELS VOCAB`` (MODELS comma-separated) with RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT set. For each model builds the reference and a copy split
by ``tp_layers.shard_model`` over all ranks, runs forward and backward on one batch, and writes
OUT/rank<N>.json: per model both losses and the largest difference between each sliced gradient
and the same slice of the reference's.
Teardown as machine-notes: barrier, destroy_process_group, flush, os._exit.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from datetime import timedelta
from pathlib import Path


def main(out: Path, models: list[str], vocab: int) -> int:
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    results = {name: one_model(name, vocab, rank, world) for name in models}
    (out / f"rank{rank}.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()
    return 0


def one_model(model_name: str, vocab: int, rank: int, world: int) -> dict:
    import torch
    import torch.distributed as dist

    from frontier_llm.bench.model import build_model, loss_fn
    from frontier_llm.bench.tp_layers import TPGroup, shard_model, vocab_parallel_loss
    from frontier_llm.catalog import load_model

    spec = dataclasses.replace(load_model(model_name), vocab=vocab)
    ref = build_model(spec, seed=0)
    tp = TPGroup(rank, world, dist.group.WORLD)
    split = shard_model(build_model(spec, seed=0), tp)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, vocab, (2, spec.seq_len + 1), generator=gen)
    x, y = tokens[:, :-1], tokens[:, 1:]
    want = loss_fn(ref(x), y)
    want.backward()
    got = vocab_parallel_loss(split(x), y, tp, vocab)
    got.backward()
    refs = dict(ref.named_parameters())
    worst, padding = 0.0, 0.0
    for name, p in split.named_parameters():
        g, whole = p.grad, refs[name].grad
        if getattr(p, "tensor_model_parallel", False):
            dim = p.partition_dim
            per = p.shape[dim]
            part = whole.narrow(dim, rank * per, max(0, min(per, whole.shape[dim] - rank * per)))
            padding = max(padding, float(g.narrow(dim, part.shape[dim],
                                                  per - part.shape[dim]).abs().max())
                          if per > part.shape[dim] else 0.0)
            g = g.narrow(dim, 0, part.shape[dim])
            whole = part
        worst = max(worst, float((g - whole).abs().max()))
    return {"want": float(want), "got": float(got), "grad_diff": worst, "padding_grad": padding,
            "held": sum(p.numel() for p in split.parameters())}


if __name__ == "__main__":
    from rank_exit import run_rank  # tests/, this script's folder, is on sys.path

    run_rank(main, Path(sys.argv[1]), sys.argv[2].split(","), int(sys.argv[3]))
