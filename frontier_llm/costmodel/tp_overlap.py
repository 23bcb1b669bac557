"""Where the run setting ``tp_comm_overlap`` applies: Megatron-LM's ``--tp-comm-overlap``
(TransformerEngine's userbuffers pipeline the TP all-gathers and reduce-scatters with the
GEMMs; priced in :func:`~frontier_llm.costmodel.steptime.block_times`, up to the system's
``tp_overlap`` fraction of the GEMM time).

Megatron-LM runs it only beside sequence parallelism: ``validate_args`` turns sequence
parallelism off at tp 1 and then asserts "Tensor parallel communication/GEMM overlap can happen
only when sequence parallelism is enabled" (NVIDIA/Megatron-LM core_v0.15.3, 309ffca,
megatron/training/arguments.py). So the cost model changes it on those layouts only (engine
megatron, tp > 1, sequence parallelism: :func:`acts_on`; a plan's other layouts are priced
as Megatron-LM runs them, without it), and ``flm predict``, the Python API and ``flm export``
refuse it for a layout without it (:func:`tp_overlap_refusal`): one Megatron-LM would not
start with the flag. flm's other engines have no such setting (torchtitan's async TP is
another mechanism, not priced).
"""

from __future__ import annotations

import numpy as np

from frontier_llm.costmodel.layouts import LayoutTable
from frontier_llm.specs.layout import Layout
from frontier_llm.specs.vocab import Engine

# The flag flm plan, flm predict, flm report plan and flm export take (on/off), and the one
# Megatron-LM takes (store_true, _add_training_args at 309ffca).
TP_OVERLAP_FLAG = "--tp-comm-overlap"
WHERE = "Megatron-LM with sequence parallelism only (engine megatron, tp > 1)"


def acts_on(t: LayoutTable) -> np.ndarray:
    """Per layout of ``t``, whether ``tp_comm_overlap`` can change its price (Megatron, tp > 1,
    sequence parallelism: the layouts whose TP collectives steptime.block_times hides)."""
    return (t.engine == Engine.MEGATRON.code) & (t.tp > 1) & t.sequence_parallel.astype(bool)


def tp_overlap_refusal(layout: Layout) -> str | None:
    """Why ``tp_comm_overlap`` cannot apply to ``layout`` (one line), or None where it does:
    Megatron-LM with sequence parallelism (which the layout allows only at tp > 1)."""
    if layout.engine == Engine.MEGATRON and layout.tp > 1 and layout.sequence_parallel:
        return None
    return (f"{TP_OVERLAP_FLAG} on applies to {WHERE}; this layout is engine "
            f"{layout.engine}, tp {layout.tp}, sequence parallelism "
            f"{'on' if layout.sequence_parallel else 'off'} (Megatron-LM's validate_args "
            "asserts \"Tensor parallel communication/GEMM overlap can happen only when sequence "
            "parallelism is enabled\", and turns sequence parallelism off at tp 1: "
            "megatron/training/arguments.py at 309ffca)")


__all__ = ["TP_OVERLAP_FLAG", "WHERE", "acts_on", "tp_overlap_refusal"]
