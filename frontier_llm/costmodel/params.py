"""Parameters held by one rank: how tensor and pipeline parallelism split a GPT (Megatron's way).

Tensor parallelism (Shoeybi et al. 2019, Megatron-LM) splits QKV and the MLP's first matrices by
columns and the attention output projection and the MLP's last matrix by rows; the row-parallel
biases and the norms stay whole on every rank. The token embedding and the output head are split
over the vocabulary; learned positions are replicated. With grouped-query attention and fewer KV
heads than TP ranks, each rank keeps one KV head (replicated). Pipeline rank 0 holds the
embeddings, the last rank the final norm and the head; with tied embeddings and more than one
stage the last stage keeps its own copy of the embedding matrix (its gradient is all-reduced with
the first stage's), as Megatron does.

All functions take numpy arrays (or ints) for ``tp``/``pp`` and return arrays of the same shape.
"""

from __future__ import annotations

import numpy as np

from frontier_llm.costmodel import moe

# The block's shapes are gemm's (it sizes their GEMMs; moe prices experts with it): taken from
# there, so that gemm -> params -> moe -> gemm is no cycle.
from frontier_llm.costmodel.gemm import kv_width_per_rank
from frontier_llm.specs import axes
from frontier_llm.specs.model import ModelSpec


def _cdiv(a, b):
    return -(-a // b)


def layer_params_per_rank(model: ModelSpec, tp):
    """Parameters of one transformer block on one TP rank."""
    tp = np.asarray(tp)
    h, f = model.hidden, model.ffn_hidden
    if model.is_mla:
        return _mla_params_per_rank(model, tp) + moe.mlp_params_per_rank(model, f, tp)
    kv = kv_width_per_rank(model, tp)
    q = model.q_dim // tp
    column = h * (q + 2 * kv) + (model.mlp_matrices - 1) * h * (f // tp)
    row = q * h + (f // tp) * h
    norms = 2 * (2 * h if model.norm == "layernorm" else h)
    bias = 0
    if model.bias:
        bias = (q + 2 * kv) + (model.mlp_matrices - 1) * (f // tp) + 2 * h  # 2 row biases whole
    return column + row + norms + bias


def _mla_params_per_rank(model: ModelSpec, tp):
    """MLA's attention on one TP rank: the up-projections split by columns (whole heads), the
    output projection by rows, the down-projections and the latents' norms on every rank
    (Megatron-Core's MLA duplicates its down-projections), with the block's two norms."""
    h = model.hidden
    total = 2 * (2 * h if model.norm == "layernorm" else h) + model.mla_norm_params()
    for _, i, o, split in model.attention_matrices():
        if split == "whole":
            total = total + i * o + (o if model.bias else 0)
        elif split == "column":
            total = total + i * (o // tp) + ((o // tp) if model.bias else 0)
        else:
            total = total + (i // tp) * o + (o if model.bias else 0)
    return total


def embedding_params_per_rank(model: ModelSpec, tp):
    """Token embedding (vocabulary-parallel) plus learned positions (replicated)."""
    pos = model.seq_len * model.hidden if model.position == "learned" else 0
    return _cdiv(model.vocab, np.asarray(tp)) * model.hidden + pos


def head_params_per_rank(model: ModelSpec, tp, pp):
    """Final norm plus the output projection on the last stage."""
    tp, pp = np.asarray(tp), np.asarray(pp)
    norm = 2 * model.hidden if model.norm == "layernorm" else model.hidden
    separate = (not model.tied_embeddings) | (pp > 1)
    return norm + np.where(separate, _cdiv(model.vocab, tp) * model.hidden, 0)


def mtp_params_per_rank(model: ModelSpec, tp, pp, per_layer):
    """The multi-token-prediction modules on one TP rank of the last stage (0 without them):
    each a block (``per_layer``: the mean block's, as every layer here), its column-parallel
    2h -> h projection and three whole norms; with pp > 1 the last stage also builds its own
    embedding (Megatron-Core's GPTModel: ``if self.pre_process or self.mtp_process``, at
    309ffca), split over the vocabulary like the first stage's."""
    if not model.mtp_layers:
        return 0
    tp, pp = np.asarray(tp), np.asarray(pp)
    h = model.hidden
    block = per_layer + _cdiv(2 * h * h, tp) + 3 * model.norm_params()
    return model.mtp_layers * block + np.where(pp > 1, _cdiv(model.vocab, tp) * h, 0)


def stage_params_per_rank(model: ModelSpec, tp, pp, pp_rank, layers=None, per_layer=None):
    """Parameters on one rank of pipeline stage ``pp_rank`` (all chunks of that rank), which
    holds ``layers`` blocks (default: an even split, ``l/p``; costmodel/split.py gives the
    engine's own), and on the last stage any multi-token-prediction modules.
    ``per_layer``: :func:`layer_params_per_rank` when the caller has it."""
    tp, pp, pp_rank = np.asarray(tp), np.asarray(pp), np.asarray(pp_rank)
    held = model.layers // pp if layers is None else np.asarray(layers)
    per_layer = layer_params_per_rank(model, tp) if per_layer is None else per_layer
    n = held * per_layer
    n = n + np.where(pp_rank == 0, embedding_params_per_rank(model, tp), 0)
    n = n + np.where(pp_rank == pp - 1, mtp_params_per_rank(model, tp, pp, per_layer), 0)
    return n + np.where(pp_rank == pp - 1, head_params_per_rank(model, tp, pp), 0)


def layer_modules(model: ModelSpec) -> int:
    """Modules holding a block's parameters: two norms, the fused QKV and output projections and
    the MLP's matrices (what an engine that gathers module by module issues collectives for)."""
    return 2 + 2 + model.mlp_matrices


def table_layer_params(model: ModelSpec, t) -> np.ndarray:
    """:func:`layer_params_per_rank` for every layout of table ``t``, computed once per table
    and model (step time and memory read it several times)."""
    memo = t.__dict__.get("_layer_params")
    if memo is not None and memo[0] is model:
        return memo[1]
    out = layer_params_per_rank(model, t.tp)
    if model.is_moe:  # the mean block, routed experts over ep (costmodel/moe.py)
        out = moe.layer_params_per_rank(model, t.tp, axes.degree(t, "ep"), out,
                                        etp=axes.expert_tensor_parallel(t))[0]
    t.__dict__["_layer_params"] = (model, out)
    return out
