"""Op-level selective activation checkpointing (``recompute: selective-op``): what a block keeps.

PyTorch's selective activation checkpointing (``torch.utils.checkpoint`` with a policy from
``create_selective_checkpoint_contexts``) decides op by op whether an output is kept for
backward or recomputed. torchtitan's policy (``torchtitan/distributed/activation_checkpoint.py``,
``_custom_policy``; used by its ``llama3_8b.toml``: ``mode = 'selective'``,
``selective_ac_option = 'op'``) keeps the outputs of the attention kernel and of every matrix
multiply except every second one, counted from the start of each checkpointed block; everything
else (norms, rotary embedding, activations, residual adds, dropout, the other matrix multiplies)
is recomputed in backward from the block's input, which the checkpoint keeps.

The block's matrix multiplies, in the order flm bench's model (and torchtitan's Llama) calls
them: ``wq``, ``wk``, ``wv`` (separate projections), ``wo``, then ``w1``, ``w3`` (SwiGLU's gate)
and ``w2``. Kept: the 1st, 3rd, 5th and 7th of them, i.e. ``wq``, ``wv``, ``w1`` and (SwiGLU)
``w2``; a GeLU MLP has 6 and keeps ``wq``, ``wv``, ``w1``. Functions work on scalars and numpy
arrays of TP degrees alike.
"""

from __future__ import annotations

import numpy as np

from frontier_llm.costmodel.params import kv_width_per_rank
from frontier_llm.specs.model import ModelSpec


def block_matmuls(model: ModelSpec, tp=1) -> list[tuple[str, object, object]]:
    """(name, input width, output width) of each weight matrix multiply of one block on one TP
    rank, in call order (column-parallel outputs and row-parallel inputs are split over ``tp``;
    a row-parallel output is whole before its reduction)."""
    tp = np.asarray(tp)
    h, f = model.hidden, model.ffn_hidden
    q, kv, f_rank = model.q_dim // tp, kv_width_per_rank(model, tp), f // tp
    mlp = [("w1", h, f_rank)] + ([("w3", h, f_rank)] if model.mlp_matrices == 3 else [])
    if model.is_mla:  # column outputs and row inputs split over tp, the down-projections whole
        attention = [(name, i // tp if split == "row" else i, o // tp if split == "column" else o)
                     for name, i, o, split in model.attention_matrices()]
        return [*attention, *mlp, ("w2", f_rank, h)]
    return [("wq", h, q), ("wk", h, kv), ("wv", h, kv), ("wo", q, h), *mlp, ("w2", f_rank, h)]


def kept_matmuls(model: ModelSpec, tp=1) -> list[tuple[str, object, object]]:
    """The matrix multiplies whose outputs ``selective-op`` keeps: every second one, from the
    first (torchtitan's policy recomputes the 2nd, 4th, ...)."""
    return block_matmuls(model, tp)[0::2]


def kept_bytes_per_token(model: ModelSpec, tp, act_bytes, flash) -> np.ndarray:
    """Bytes one block keeps per token under ``selective-op``, beside its input: the kept
    matrix multiplies' outputs and, with a fused attention kernel (SDPA), its output and fp32
    log-sum-exp per head (the unfused core is made of batched matmuls and a softmax, none of
    them kept)."""
    tp = np.asarray(tp)
    out = sum(width for _, _, width in kept_matmuls(model, tp)) * act_bytes
    attention = (model.out_dim // tp) * act_bytes + 4 * (model.heads // tp)
    return out + np.where(flash, attention, 0)


def kept_dense_fraction(model: ModelSpec, tp=1) -> np.ndarray:
    """Share of the block's dense (weight matmul) FLOPs whose outputs are kept, hence not run
    again in backward."""
    every = block_matmuls(model, tp)
    kept = sum(i * o for _, i, o in every[0::2])
    return kept / sum(i * o for _, i, o in every)
