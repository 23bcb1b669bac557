"""What a study's run settings cost, on top of the cost model's prediction for the layout.

Run settings are ``flm bench`` options that are not layout knobs, so the cost model
(``frontier_llm.costmodel``) does not see them; without this, every setting of one layout is
predicted the same and the model cannot rank them (the warm start then picks among ties by the
order of the space).

``bucket_mb``: data-parallel gradients are averaged in flat buckets of at most this size, one
all-reduce per bucket (``bench/optim.py``'s ``allreduce_mean``, as PyTorch DDP's
``bucket_cap_mb``). The cost model prices the gradients as one all-reduce; ``n`` buckets pay the
all-reduce's start-ups ``n`` times, its bandwidth term once (the same bytes move). The start-up
is the system's link latency in the cost model's ring formula (``costmodel.comm``):
``2(dp-1)`` messages per all-reduce. ``n`` is ``ceil(gradient bytes / bucket)``, a lower bound
(tensors are not split across buckets).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from frontier_llm.costmodel import comm
from frontier_llm.costmodel.memory import STATE_BYTES
from frontier_llm.costmodel.params import stage_params_per_rank
from frontier_llm.specs.layout import Layout
from frontier_llm.specs.model import ModelSpec
from frontier_llm.specs.system import SystemSpec

MB = 2**20


def gradient_bytes(model: ModelSpec, layout: Layout) -> float:
    """Gradient bytes of the largest pipeline stage's rank (what one DP all-reduce moves)."""
    n = max(float(stage_params_per_rank(model, layout.tp, layout.pp, s))
            for s in (0, layout.pp - 1))
    return n * float(STATE_BYTES[layout.dtype.code][1])


def buckets(model: ModelSpec, layout: Layout, bucket_mb: float) -> int:
    return max(1, math.ceil(gradient_bytes(model, layout) / (bucket_mb * MB)))


def bucket_seconds(model: ModelSpec, system: SystemSpec, layout: Layout,
                   bucket_mb: float) -> float:
    """Seconds a step spends on the extra all-reduce start-ups of ``bucket_mb`` buckets."""
    if layout.shard_ranks < 2:
        return 0.0
    # The gradients are reduced over dp x cp (the cp ranks hold other tokens of the same
    # sequences); that group's ranks sit tp apart.
    startup = float(comm.all_reduce(system, layout.shard_ranks, layout.tp, 0.0))
    return (buckets(model, layout, bucket_mb) - 1) * startup


def run_seconds(model: ModelSpec, system: SystemSpec, layout: Layout,
                run: Mapping[str, Any]) -> float:
    """Seconds per step the run settings add to the layout's predicted step time."""
    extra = 0.0
    if run.get("bucket_mb") is not None:
        extra += bucket_seconds(model, system, layout, float(run["bucket_mb"]))
    return extra
