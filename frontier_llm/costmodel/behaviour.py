"""Each engine's scheduling behaviour as numpy arrays indexed by the layout table's ``engine``
codes, read from the one place that states it (``specs/engine_rules.py``, with sources there).

``BEHAVIOUR["prefetch"][t.engine]`` is the prefetch depth of every layout in table ``t``.
"""

from __future__ import annotations

import numpy as np

from frontier_llm.specs.engine_rules import RULES
from frontier_llm.specs.layout import Engine

FIELDS = ("prefetch", "prefetch_bucket_params", "gather_per_module", "reduce_bucket_params",
          "reshard_after_forward", "gradient_bucketing", "tp_comm_overlap",
          "reduce_fp32", "fused_elementwise", "replicated_grad_overlap",
          "sharded_grad_each_microbatch", "sharded_grad_all_reduce", "param_gather_overlap",
          "fsdp_grad_sync_each_microbatch")


def _arrays() -> dict[str, np.ndarray]:
    members = [Engine.from_code(c) for c in range(len(Engine.words()))]
    return {f: np.array([getattr(RULES[e], f) for e in members]) for f in FIELDS}


BEHAVIOUR = _arrays()


def behaviour(t, name: str) -> np.ndarray:
    """One behaviour field for every layout of table ``t`` (by its engine column)."""
    return BEHAVIOUR[name][t.engine]
