"""Where the run setting ``p2p_overlap`` applies: Megatron-Core's ``overlap_p2p_comm``, an
interleaved schedule's pipeline sends and receives overlapped with the neighbouring chunks'
compute (priced in :func:`~frontier_llm.costmodel.steptime.stage_times`).

Megatron-LM acts on it only with virtual pipeline stages: ``validate_args`` sets
``args.overlap_p2p_comm = False`` "since non-interleaved schedule does not support overlapping
p2p communication" (NVIDIA/Megatron-LM core_v0.15.3, 309ffca, megatron/training/arguments.py).
flm's other engines (the native engine, DeepSpeed's PipelineEngine) have no such setting. One
rule, so ``flm predict``, the Python API and ``flm export`` refuse alike a layout the setting
could not change: a user who asks for it and gets the same number would believe it priced.
"""

from __future__ import annotations

import numpy as np

from frontier_llm.costmodel.layouts import LayoutTable
from frontier_llm.specs.layout import Layout
from frontier_llm.specs.vocab import Engine

# The flag flm plan, flm predict and flm export take (on/off, as --tp-comm-overlap).
P2P_OVERLAP_FLAG = "--overlap-p2p-comm"
WHERE = "Megatron-LM's interleaved schedule only (engine megatron, virtual stages > 1)"


def acts_on(t: LayoutTable) -> np.ndarray:
    """Per layout of ``t``, whether ``p2p_overlap`` can change it (Megatron, virtual stages)."""
    return (t.engine == Engine.MEGATRON.code) & (t.virtual_stages > 1)


def p2p_overlap_refusal(layout: Layout) -> str | None:
    """Why ``p2p_overlap`` cannot apply to ``layout`` (one line), or None where it does."""
    if layout.engine == Engine.MEGATRON and layout.virtual_stages > 1:
        return None
    return (f"{P2P_OVERLAP_FLAG} on applies to {WHERE}; this layout is engine "
            f"{layout.engine}, schedule {layout.schedule} with {layout.virtual_stages} virtual "
            "stage(s), whose pipeline sends it would not change (Megatron-LM turns "
            "overlap_p2p_comm off without virtual stages: validate_args, "
            "megatron/training/arguments.py at 309ffca)")


__all__ = ["P2P_OVERLAP_FLAG", "WHERE", "acts_on", "p2p_overlap_refusal"]
