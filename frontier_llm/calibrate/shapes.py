"""The matrix multiplications one transformer block runs on one tensor-parallel rank.

Megatron's split (Shoeybi et al. 2019; :mod:`frontier_llm.costmodel.params`): QKV and the MLP's
first matrices are column-parallel (their output width divides by ``tp``), the attention output
projection and the MLP's last matrix row-parallel (their inner dimension divides by ``tp``). For
``tokens = micro_batch · seq_len`` rows, a GEMM ``(m × k) · (k × n)`` costs ``2·m·n·k`` FLOPs.
The microbenchmark times exactly these shapes, so the fitted matrix rate is the rate a layout of
this model sees, not a square-matrix datasheet figure.
"""

from __future__ import annotations

from dataclasses import dataclass

from frontier_llm.costmodel.gemm import block_weight_shapes
from frontier_llm.specs.model import ModelSpec

# The four weight matrices of a block, in costmodel/gemm.py's block_weight_shapes order.
GEMM_NAMES = ("qkv", "attn_out", "mlp_in", "mlp_out")


@dataclass(frozen=True)
class Gemm:
    """One GEMM: ``(m × k) · (k × n)``; ``hidden`` is the model width it belongs to. The cost
    model's size effect (``matmul_half_hidden``) is in the weight's smaller side,
    ``min(n, k)`` (costmodel/gemm.py)."""

    name: str
    tp: int
    hidden: int
    m: int
    n: int
    k: int

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k


def block_gemms(model: ModelSpec, tp: int, micro_batch: int = 1) -> list[Gemm]:
    """The forward GEMMs of one block on one of ``tp`` ranks (backward runs each twice more)."""
    if tp < 1 or model.hidden % tp or model.ffn_hidden % tp:
        raise ValueError(f"tp={tp} does not divide {model.name}'s hidden/ffn sizes")
    tokens = micro_batch * model.seq_len
    # The cost model's own shapes (costmodel/gemm.py), so the microbenchmark times what it prices.
    return [Gemm(name, tp, model.hidden, tokens, int(n), int(k))
            for name, (n, k) in zip(GEMM_NAMES, block_weight_shapes(model, tp), strict=True)]


def scaled_model(model: ModelSpec, hidden: int) -> ModelSpec:
    """The same architecture at another width (heads keep their size where they can), for the
    size ladder that measures how the matrix rate grows with the matrices."""
    import dataclasses

    heads = max(1, hidden // model.head_dim) if hidden % model.head_dim == 0 else 1
    kv_heads = heads if model.kv_heads == model.heads else max(1, min(model.kv_heads, heads))
    while heads % kv_heads:
        kv_heads -= 1
    ffn = (None if model.ffn_hidden == 4 * model.hidden
           else round(model.ffn_hidden * hidden / model.hidden))
    return dataclasses.replace(model, name=f"{model.name}@h{hidden}", hidden=hidden,
                               heads=heads, kv_heads=kv_heads, ffn_hidden=ffn)


def gemm_set(model: ModelSpec, tps: list[int], ladder: list[int], micro_batch: int = 1
             ) -> list[Gemm]:
    """The model's block GEMMs for every ``tp`` that divides it, plus the tp=1 block GEMMs of
    the same architecture at each width of ``ladder`` (the size effect)."""
    out: list[Gemm] = []
    for tp in tps:
        if model.hidden % tp == 0 and model.ffn_hidden % tp == 0:
            out += block_gemms(model, tp, micro_batch)
    for h in ladder:
        if h != model.hidden:
            out += block_gemms(scaled_model(model, h), 1, micro_batch)
    return out
