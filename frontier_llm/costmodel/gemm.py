"""The rate a block's matrix multiplications reach, by their size on one rank.

A GEMM ``(m × k) · (k × n)`` reaches the system's ``matmul`` efficiency only when its weight
matrix is large: the achieved rate is ``R · d / (d + h½)`` with ``d`` the weight's smaller
side, ``min(n, k)``, and ``h½`` the system's ``matmul_half_hidden`` (the side at which half the
asymptotic rate is reached). Narrow matrices lose to tile and wave quantization and to a lower
arithmetic intensity (NVIDIA, "Matrix Multiplication Background User's Guide", Deep Learning
Performance documentation: throughput as a function of the dimensions). The token dimension
``m = micro_batch · seq`` is at least one sequence (2,048 tokens and more in every layout the
planner meets), so it is not the side that limits a dense block's GEMMs.

Tensor parallelism splits one side of every weight (Megatron's split, Shoeybi et al. 2019:
QKV and the MLP's first matrices column-parallel, their output width over ``tp``; the attention
output and the MLP's last matrix row-parallel, their inner dimension over ``tp``), so a block's
GEMMs on a TP-8 rank are narrower than the model's width. The block's rate is the FLOP-weighted
harmonic mean of its GEMMs' rates: its time is the sum of theirs. The same law prices a routed
expert's GEMM (costmodel/moe.py) and is what ``flm calibrate`` fits to microbenchmarked GEMMs of
exactly these shapes (calibrate/shapes.py, calibrate/fit.py).
"""

from __future__ import annotations

import numpy as np

from frontier_llm.specs.model import ModelSpec


def kv_width_per_rank(model: ModelSpec, tp):
    """Width of K (or V) on one TP rank: a share of the KV heads, or one whole head."""
    tp = np.asarray(tp)
    return np.where(model.kv_heads % tp == 0, model.kv_dim // np.maximum(tp, 1), model.head_dim)


def sdpa_kv_width_per_rank(model: ModelSpec, tp, heads: int | None = None):
    """Width of the K (or V) SDPA receives on one TP rank: :func:`kv_width_per_rank`, or, where
    the run's model code expands K/V to ``heads`` heads before SDPA (torchtitan before ff0829c
    calls ``repeat_kv`` to every query head: torchtitan/models/llama/model.py at 9dec370), that
    many heads' share."""
    if heads is None:
        return kv_width_per_rank(model, tp)
    return heads / np.asarray(tp) * model.head_dim


def size_factor(side, half_side: float) -> np.ndarray:
    """``d / (d + h½)``: the share of the asymptotic rate a GEMM whose weight's smaller side is
    ``side`` reaches."""
    d = np.asarray(side, dtype=float)
    return d / (d + half_side)


def block_weight_shapes(model: ModelSpec, tp) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(n, k)`` of the four weight matrices of one block on one of ``tp`` ranks (QKV with its
    K/V heads, attention output, the MLP's first matrices together, the MLP's last)."""
    h, f = float(model.hidden), float(model.ffn_hidden)
    tp = np.asarray(tp, dtype=float)
    qkv = h / tp + 2 * kv_width_per_rank(model, tp)
    mlp_in = (model.mlp_matrices - 1) * f / tp
    return [(qkv, h), (h, h / tp), (mlp_in, h), (h, f / tp)]


def inverse_side(shapes) -> np.ndarray:
    """``Σ F_i / d_i / Σ F_i`` over GEMMs of FLOPs ``F_i ∝ n·k`` and smaller side ``d_i``: the
    FLOP-weighted mean of ``1/d``, the one number the block's rate depends on
    (``1/rate = (1 + h½ · inverse_side) / R``)."""
    flops = sum(n * k for n, k in shapes)
    return sum(n * k / np.minimum(n, k) for n, k in shapes) / flops


def block_factor(model: ModelSpec, tp, half_side: float) -> np.ndarray:
    """The share of the asymptotic rate one block's GEMMs reach together on a rank of ``tp``."""
    return 1.0 / (1.0 + half_side * inverse_side(block_weight_shapes(model, tp)))
