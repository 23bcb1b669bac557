"""The layouts tests/test_memcheck_grid.py measures with flm memcheck: flm bench's native engine
at the real models' shapes, 8B to 1T, dense and Mixture-of-Experts, one rank each.

Every tensor has its model's real size (hidden, heads, KV heads, MLP width, vocabulary,
sequence); the models keep fewer blocks (``layers``: one or two per pipeline rank), which
changes how many blocks a rank holds and nothing else. Fake tensors cost no memory but every
operator still runs through PyTorch's dispatcher: a full 405B stage schedule is minutes on two
cores, a grid of them too long for the suite. ``flm memcheck`` itself runs the whole model.
"""

from __future__ import annotations

import dataclasses

from frontier_llm.catalog import load_model
from frontier_llm.specs.layout import Layout, Sharding
from frontier_llm.specs.model import ModelSpec

# (name, model, seq_len or None, layers, layout fields).
GRID = [
    ("8b-single", "llama3-8b", None, 2, dict(global_batch=1)),
    ("8b-mb2", "llama3-8b", None, 2, dict(micro_batch=2, global_batch=4)),
    ("8b-pp2", "llama3-8b", None, 4, dict(pp=2, global_batch=4)),
    ("8b-pp4-gpipe", "llama3-8b", None, 4, dict(pp=4, global_batch=4, schedule="gpipe")),
    ("8b-tp2", "llama3-8b", None, 2, dict(tp=2, global_batch=1)),
    ("8b-tp2-pp2-mb2", "llama3-8b", None, 2, dict(tp=2, pp=2, micro_batch=2, global_batch=4)),
    ("8b-tp4-sp", "llama3-8b", None, 2, dict(tp=4, sequence_parallel=True, global_batch=2)),
    ("8b-fsdp", "llama3-8b", None, 2, dict(dp=4, global_batch=4, sharding="zero3")),
    ("8b-fsdp-mb2", "llama3-8b", None, 2, dict(dp=2, global_batch=4, sharding="zero3")),
    ("8b-fsdp-pp2", "llama3-8b", None, 2, dict(pp=2, dp=2, global_batch=8,
                                               sharding="zero3")),
    ("8b-zero2", "llama3-8b", None, 2, dict(dp=2, global_batch=2, sharding="zero2")),
    ("8b-keep", "llama3-8b", None, 2, dict(dp=2, global_batch=2, sharding="zero3",
                                           reshard_after_forward=False)),
    ("8b-hsdp", "llama3-8b", None, 2, dict(dp=4, global_batch=4,
                                           sharding="p=partial:2,g=partial:2,o=partial:2")),
    ("8b-zero1", "llama3-8b", None, 2, dict(dp=4, global_batch=8, sharding="zero1")),
    ("8b-full", "llama3-8b", None, 2, dict(micro_batch=4, global_batch=4, recompute="full")),
    ("8b-full-pp2", "llama3-8b", None, 2, dict(pp=2, micro_batch=2, global_batch=4,
                                               recompute="full")),
    ("8b-selective", "llama3-8b", None, 2, dict(micro_batch=2, global_batch=2,
                                                recompute="selective")),
    ("8b-op", "llama3-8b", None, 2, dict(micro_batch=2, global_batch=2,
                                         recompute="selective-op")),
    ("8b-cp2", "llama3-8b", None, 2, dict(cp=2, micro_batch=2, global_batch=2)),
    ("8b-128k-cp8", "llama3-8b", 131072, 2, dict(cp=8, tp=2, global_batch=1)),
    ("8b-mb8", "llama3-8b", None, 2, dict(micro_batch=8, global_batch=8)),
    ("8b-fp32", "llama3-8b", None, 2, dict(global_batch=1, dtype="fp32")),
    ("70b-tp8", "llama3-70b", None, 2, dict(tp=8, global_batch=1)),
    ("70b-sp-full", "llama3-70b", None, 2, dict(tp=8, sequence_parallel=True, micro_batch=2,
                                                global_batch=2, recompute="full")),
    ("70b-zero1-pp2", "llama3-70b", None, 2, dict(tp=4, pp=2, dp=2, global_batch=4,
                                                  sharding="zero1")),
    ("405b-tp8", "llama3-405b", None, 1, dict(tp=8, global_batch=1)),
    ("405b-sp-sel", "llama3-405b", None, 2, dict(tp=8, pp=2, sequence_parallel=True,
                                                 global_batch=2, recompute="selective")),
    ("175b-tp8", "gpt-175b", None, 2, dict(tp=8, global_batch=2)),
    ("175b-unfused", "gpt-175b", None, 2, dict(tp=8, global_batch=1, flash_attention=False,
                                               recompute="selective")),
    ("1t-tp8", "gpt-1t", None, 1, dict(tp=8, global_batch=1)),
    ("1t-zero1-pp2", "gpt-1t", None, 2, dict(tp=8, pp=2, dp=2, global_batch=4,
                                             sharding="zero1")),
    ("22b-fsdp-full", "gpt-22b", None, 2, dict(tp=2, dp=2, global_batch=4, sharding="zero3",
                                               recompute="full", micro_batch=2)),
    # FSDP2 with full recompute over 8 ranks: the optimizer step's sharded temporaries fall
    # under a block's backward (its gathered parameters, the root's, the block prefetched or
    # the reduce-scatter input kept, the rebuilt block), which is the peak: the last block to
    # run (2 blocks), a middle one holding both the prefetch and the reduce-scatter input (3).
    ("22b-fsdp-full-dp8", "gpt-22b", None, 2, dict(tp=2, dp=8, global_batch=16,
                                                   sharding="zero3", recompute="full",
                                                   micro_batch=2)),
    ("22b-fsdp-full-3blocks", "gpt-22b", None, 3, dict(tp=2, dp=8, global_batch=16,
                                                       sharding="zero3", recompute="full",
                                                       micro_batch=2)),
    ("mixtral-ep2", "mixtral-8x7b", None, 2, dict(dp=2, ep=2, micro_batch=4,
                                                  global_batch=8)),
    ("mixtral-ep4-tp2", "mixtral-8x7b", None, 2, dict(tp=2, dp=4, ep=4, global_batch=4)),
    ("mixtral22-ep8-sel", "mixtral-8x22b", None, 2, dict(dp=8, ep=8, micro_batch=2,
                                                         global_batch=16,
                                                         recompute="selective")),
]


def grid_case(name: str) -> tuple[ModelSpec, Layout]:
    """The model and layout of one grid entry (bf16 unless it says otherwise)."""
    _, model_name, seq, layers, fields = next(g for g in GRID if g[0] == name)
    model = dataclasses.replace(load_model(model_name), layers=layers)
    if seq is not None:
        model = dataclasses.replace(model, seq_len=seq)
    fields = {"dtype": "bf16", **fields}
    if "sharding" in fields:
        fields["sharding"] = Sharding.parse(fields["sharding"])
    return model, Layout(**fields)
