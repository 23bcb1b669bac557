"""Per-rank memory: model states, saved activations, communication buffers.

Model states (Rajbhandari et al. 2020, ZeRO): mixed-precision Adam keeps a 16-bit parameter, a
gradient and fp32 master weight + two moments. Megatron accumulates gradients in fp32 for bf16,
so bf16/fp16 is 2 + 4 + 12 = 18 bytes per parameter; fp32 training is 4 + 4 + 8 = 16. Each
component is divided by its AMSP sharding degree (ZeRO-1/2/3 are presets).

Saved activations (Korthikanti et al. 2022, arXiv 2205.05198, §4): per layer and micro-batch
``s·b·h·(34 + 5·a·s/h)`` bytes in 16-bit with dropout; the terms are built here tensor by tensor
so that tensor parallelism (``10 + 24/t``), sequence parallelism (everything ``/t``), selective
recompute or flash attention (no ``a·s²`` terms), full recompute (the layer input only),
grouped-query attention, SwiGLU, no dropout and fp32 all follow from the same count. The pipeline
schedule sets how many micro-batches a stage holds: GPipe all ``m``; 1F1B ``p − r`` on stage
``r``; interleaved 1F1B ``(v−1)·p + 2·(p−1−r) + 1`` chunks (``p·(1 + (p−1)/(p·v))`` micro-batches
of a stage on the first one). The first stage adds token ids and the embedding dropout mask; the
last stage the final norm and the fp32 logits of the cross-entropy (``4·s·b·V/t`` bytes per
micro-batch, kept for every micro-batch under GPipe).
"""

from __future__ import annotations

import numpy as np

from frontier_llm.costmodel.deepspeed_buffers import (
    extra_optimizer_bytes,
    extra_param_bytes,
    extra_params,
)
from frontier_llm.costmodel.layouts import LayoutTable, from_configs
from frontier_llm.costmodel.params import (
    kv_width_per_rank,
    layer_params_per_rank,
    stage_params_per_rank,
)
from frontier_llm.specs.layout import DType, Layout, Recompute, Schedule
from frontier_llm.specs.model import ModelSpec
from frontier_llm.specs.system import SystemSpec

# Bytes per parameter for (parameters, gradients, optimizer states), indexed by DType code.
STATE_BYTES = np.array([{DType.FP32: [4, 4, 8], DType.BF16: [2, 4, 12],
                         DType.FP16: [2, 4, 12]}[d] for d in DType])
ACT_BYTES = np.array([{DType.FP32: 4, DType.BF16: 2, DType.FP16: 2}[d] for d in DType])
MASK_BYTES = 1  # dropout masks are bytes (Korthikanti et al. 2022 §4.1)


def _cdiv(a, b):
    return -(-a // b)


def state_bytes(model: ModelSpec, t: LayoutTable, pp_rank) -> dict[str, np.ndarray]:
    """Parameters, gradients and optimizer-state bytes on one rank of stage ``pp_rank``."""
    n = stage_params_per_rank(model, t.tp, t.pp, pp_rank) + extra_params(model, t, pp_rank)
    per = STATE_BYTES[t.dtype]
    return {
        "params": _cdiv(n, t.degree("params")) * per[:, 0] + extra_param_bytes(t, n, per[:, 0]),
        "grads": _cdiv(n, t.degree("grads")) * per[:, 1],
        # DeepSpeed's fp32 master partition (costmodel/deepspeed_buffers.py).
        "optimizer": _cdiv(n, t.degree("optim")) * per[:, 2] + extra_optimizer_bytes(t, n),
    }


# Frameworks differ in one saved tensor: with sequence parallelism Megatron saves the 1/t shard of
# a column-parallel linear's input and gathers it again in backward; PyTorch's DTensor
# (``native``, the flm bench engine) saves the gathered input.
ENGINES = ("megatron", "native")


def layer_activation_bytes(model: ModelSpec, t: LayoutTable, engine: str = "megatron"
                           ) -> np.ndarray:
    """Bytes one transformer block saves for backward per micro-batch (no recompute)."""
    e = ACT_BYTES[t.dtype]
    tp = t.tp
    s, b, h, f = model.seq_len, t.micro_batch, model.hidden, model.ffn_hidden
    sb = s * b
    rep = np.where(t.sequence_parallel, 1.0 / tp, 1.0)  # the parts TP alone leaves whole
    q, kv, f_rank, heads = h / tp, kv_width_per_rank(model, tp), f / tp, model.heads / tp
    drop = MASK_BYTES if model.dropout > 0 else 0
    stats = 8 if model.norm == "layernorm" else 4  # fp32 mean and rstd (or rstd) per token
    # Two norm inputs, the QKV and MLP inputs (norm outputs), two residual dropout masks.
    linear_in = rep if engine == "megatron" else 1.0
    whole = sb * (rep * (2 * e * h + 2 * drop * h + 2 * stats) + linear_in * 2 * e * h)
    mlp_saved = 2 if model.activation == "gelu" else 4  # fc1 out + act out | gate, up, silu, prod
    split = sb * e * ((q + kv) + kv + q + mlp_saved * f_rank)  # Q,K | V | proj input | MLP
    # Q·Kᵀ softmax output, its dropout mask and output; flash attention and selective recompute
    # keep none of them (flash keeps a fp32 log-sum-exp per row instead).
    scores = heads * s * sb * (e + (drop + e if drop else 0))
    keep_scores = ~t.flash_attention & (t.recompute == Recompute.NONE.code)
    lse = np.where(t.flash_attention, 4 * heads * sb, 0)
    return whole + split + np.where(keep_scores, scores, 0) + lse


def _in_flight_chunks(t: LayoutTable, pp_rank) -> np.ndarray:
    """Chunks of layers (a whole stage unless interleaved) held on stage ``pp_rank`` at peak."""
    m, p, v = t.num_microbatches, t.pp, t.virtual_stages
    r = np.asarray(pp_rank)
    gpipe = m
    one_f_one_b = np.minimum(m, p - r)
    interleaved = np.minimum(m * v, (v - 1) * p + 2 * (p - 1 - r) + 1)
    chunks = np.select([t.schedule == Schedule.GPIPE.code, t.schedule == Schedule.ONE_F_ONE_B.code],
                       [gpipe, one_f_one_b], interleaved)
    return chunks


def activation_bytes(model: ModelSpec, t: LayoutTable, pp_rank, engine: str = "megatron"
                     ) -> np.ndarray:
    """Peak bytes saved for backward on one rank of stage ``pp_rank``."""
    e = ACT_BYTES[t.dtype]
    r = np.asarray(pp_rank)
    s, b, h = model.seq_len, t.micro_batch, model.hidden
    sb = s * b
    rep = np.where(t.sequence_parallel, 1.0 / t.tp, 1.0)
    chunks = _in_flight_chunks(t, r)
    layers_per_chunk = model.layers // (t.pp * t.virtual_stages)
    full = layer_activation_bytes(model, t, engine)
    # Full recompute keeps only each layer's input, and rebuilds one layer at a time (its input
    # is then part of the rebuilt layer).
    per_layer = np.where(t.recompute == Recompute.FULL.code, sb * h * e * rep, full)
    transient = np.where(t.recompute == Recompute.FULL.code, full - per_layer, 0)
    layers = chunks * layers_per_chunk
    micro_in_flight = np.where(t.schedule == Schedule.INTERLEAVED.code,
                               _cdiv(chunks, t.virtual_stages), chunks)
    drop = MASK_BYTES if model.dropout > 0 else 0
    first = np.where(r == 0, micro_in_flight * sb * (8 + drop * h * rep), 0)
    stats = 8 if model.norm == "layernorm" else 4
    logits_mb = np.where(t.schedule == Schedule.GPIPE.code, t.num_microbatches, 1)
    last = np.where(
        r == t.pp - 1,
        logits_mb * sb * (e * h * rep + stats * rep + e * h + 4 * _cdiv(model.vocab, t.tp)),
        0,
    )
    # The head's tensors (logits) are freed by its backward before any layer is rebuilt.
    return layers * per_layer + first + np.maximum(transient, last)


def buffer_bytes(model: ModelSpec, t: LayoutTable) -> np.ndarray:
    """Transient communication buffers: gathered parameters (ZeRO-3 style, one layer gathered
    and the next prefetched) and the sequence-parallel all-gather of one layer input."""
    e = ACT_BYTES[t.dtype]
    gathered = np.where(t.degree("params") > 1,
                        2 * layer_params_per_rank(model, t.tp) * STATE_BYTES[t.dtype][:, 0], 0)
    sp = np.where(t.sequence_parallel, e * model.seq_len * t.micro_batch * model.hidden, 0)
    return gathered + sp


def rank_memory(model: ModelSpec, system: SystemSpec, t: LayoutTable, pp_rank,
                engine: str = "megatron") -> dict:
    """Every memory term of one rank of stage ``pp_rank``, and their total ``peak``."""
    states = state_bytes(model, t, pp_rank)
    out = {
        "params": states["params"],
        "grads": states["grads"],
        "optimizer": states["optimizer"],
        "activations": activation_bytes(model, t, pp_rank, engine),
        "buffers": buffer_bytes(model, t),
        "reserved": np.full(len(t), system.memory_reserved_bytes, dtype=float),
    }
    out["peak"] = sum(np.asarray(v, dtype=float) for v in out.values())
    return out


def peak_memory(model: ModelSpec, system: SystemSpec, t: LayoutTable,
                engine: str = "megatron") -> dict:
    """The rank with the most memory: the first stage (embeddings, most micro-batches in flight)
    or the last (head, logits); middle stages hold less than the first."""
    first = rank_memory(model, system, t, 0, engine)
    last = rank_memory(model, system, t, t.pp - 1, engine)
    use_last = last["peak"] > first["peak"]
    out = {k: np.where(use_last, last[k], first[k]) for k in first}
    out["stage"] = np.where(use_last, t.pp - 1, 0)
    return out


# Scalar helpers for one layout (the benchmark compares its measured bytes with these).
def rank_state_bytes(model: ModelSpec, layout: Layout, pp_rank: int) -> dict[str, int]:
    s = state_bytes(model, from_configs([layout]), pp_rank)
    return {f"{k}_bytes": int(v[0]) for k, v in s.items()}


def rank_activation_bytes(model: ModelSpec, layout: Layout, pp_rank: int,
                          engine: str = "megatron") -> int:
    return int(activation_bytes(model, from_configs([layout]), pp_rank, engine)[0])
