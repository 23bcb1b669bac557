"""Each engine's scheduling behaviour as numpy arrays indexed by the layout table's ``engine``
codes, read from the one place that states it (``specs/engine_rules.py``, with sources there).

``BEHAVIOUR["prefetch"][t.engine]`` is the prefetch depth of every layout in table ``t``.
"""

from __future__ import annotations

import numpy as np

from frontier_llm.specs.engine_rules import RULES, check_cp_exchange
from frontier_llm.specs.layout import Engine

FIELDS = ("prefetch", "prefetch_bucket_params", "gather_per_module", "reduce_bucket_params",
          "reshard_after_forward", "gradient_bucketing", "tp_comm_overlap",
          "reduce_fp32", "fused_elementwise", "replicated_grad_overlap",
          "sharded_grad_each_microbatch", "sharded_grad_all_reduce", "param_gather_overlap",
          "fsdp_grad_sync_each_microbatch", "cp_exchange")


def _arrays() -> dict[str, np.ndarray]:
    members = [Engine.from_code(c) for c in range(len(Engine.words()))]
    return {f: np.array([getattr(RULES[e], f) for e in members]) for f in FIELDS}


BEHAVIOUR = _arrays()


def behaviour(t, name: str) -> np.ndarray:
    """One behaviour field for every layout of table ``t`` (by its engine column)."""
    return BEHAVIOUR[name][t.engine]


def cp_ring(t, cp_exchange: str | None = None) -> np.ndarray:
    """Whether each layout's context parallelism is PyTorch's ``context_parallel`` ring (native
    layouts with cp > 1 whose exchange, ``cp_exchange`` or else the engine's rule, is "ring");
    False for flm bench's single gather, for Megatron's ring (its engine's own) and at cp 1.
    specs/engine_rules.py ``CP_EXCHANGE``."""
    rule = behaviour(t, "cp_exchange")
    setting = rule if check_cp_exchange(cp_exchange) is None else np.full(len(t), cp_exchange)
    return (t.engine == Engine.NATIVE.code) & (np.asarray(t.cp) > 1) & (setting == "ring")


def cp_gather(t, cp_exchange: str | None = None) -> np.ndarray:
    """Whether each layout's context parallelism is flm bench's single K/V all-gather (native,
    cp > 1, not :func:`cp_ring`)."""
    native = (t.engine == Engine.NATIVE.code) & (np.asarray(t.cp) > 1)
    return native & ~cp_ring(t, cp_exchange)
