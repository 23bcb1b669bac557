"""FLOPs per training iteration.

Narayanan et al. 2021 (SC21, "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", eq. 3): for a GPT with multi-head attention and a 4h GeLU MLP,

    F = 72 · B · s · l · h² · (1 + s/(6h) + V/(12·h·l))          (no recompute)
    F = 96 · B · s · l · h² · (1 + s/(6h) + V/(16·h·l))          (full recompute)

counting only matrix multiplications (2 FLOPs per multiply-add) and a backward pass of twice the
forward. The functions below derive the same numbers from the per-layer matrix shapes so that
grouped-query attention and SwiGLU MLPs (Llama) are counted exactly; for a GPT shape they reduce to
eq. 3 (tests pin that). Every function works on scalars and on numpy arrays alike, so the planner
can evaluate a whole table of layouts at once and the benchmark imports the same code.
"""

from __future__ import annotations

from typing import Any

from frontier_llm.costmodel import moe
from frontier_llm.costmodel.checkpoint_policy import kept_dense_fraction
from frontier_llm.specs.model import ModelSpec

ArrayLike = Any  # float or numpy array


def layer_forward_flops_per_token(model: ModelSpec) -> tuple[float, float]:
    """(dense, attention) forward FLOPs per token of one transformer block (of the mean block
    of an MoE model, its active experts only: costmodel/moe.py).

    ``dense`` is the weight matmuls (the attention projections of
    :meth:`ModelSpec.attention_matrices`: QKV and output, or MLA's down- and up-projections;
    the MLP); ``attention`` is Q·Kᵀ over ``heads x head_dim`` and scores·V over the V width,
    which grow with the sequence length (causal masking is not discounted, as in eq. 3). MLA
    is counted as it trains, K and V rebuilt per head (DeepSeek-V2 §2.1.2; absorbing the
    up-projections is an inference trick).
    """
    h, f, s = model.hidden, model.ffn_hidden, model.seq_len
    projections = 2.0 * sum(i * o for _, i, o, _ in model.attention_matrices())
    dense = projections + 2.0 * model.mlp_matrices * h * f
    if model.is_moe:  # the mean block's active MLP: router + top_k (+ shared) experts
        dense = projections + moe.mlp_flops_per_token(model)
    attention = 2.0 * s * model.q_dim + 2.0 * s * model.out_dim
    return dense, attention


def logits_forward_flops_per_token(model: ModelSpec) -> float:
    return 2.0 * model.hidden * model.vocab


def mtp_forward_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs per token of the multi-token-prediction modules (0 without them): each a
    block (the mean block's, as every block here), its 2h -> h projection and another pass
    through the shared output head (DeepSeek-V3 report §2.2; Megatron-Core's
    MultiTokenPredictionLayer and GPTModel's MTP logits)."""
    if not model.mtp_layers:
        return 0.0
    dense, attn = layer_forward_flops_per_token(model)
    proj = 2.0 * 2 * model.hidden * model.hidden
    return model.mtp_layers * (dense + attn + proj + logits_forward_flops_per_token(model))


def model_flops(model: ModelSpec, batch_tokens: ArrayLike) -> ArrayLike:
    """Model FLOPs (no recompute) for ``batch_tokens`` = B·s tokens: forward + 2x backward,
    the multi-token-prediction modules included (they train)."""
    dense, attn = layer_forward_flops_per_token(model)
    forward = (model.layers * (dense + attn) + logits_forward_flops_per_token(model)
               + mtp_forward_flops_per_token(model))
    return 3.0 * forward * batch_tokens


def recompute_flops(model: ModelSpec, batch_tokens: ArrayLike, recompute: str,
                    flash: bool = True) -> ArrayLike:
    """Extra forward FLOPs spent recomputing activations.

    ``full`` reruns every block's forward (not the logits): the 72 -> 96 factor of eq. 3.
    ``selective`` (Korthikanti et al. 2022 §4.2) reruns only the attention core, Q·Kᵀ, softmax and
    scores·V. ``selective-op`` reruns the matrix multiplies whose outputs it does not keep
    (:mod:`.checkpoint_policy`); a fused attention kernel's output is kept (PyTorch's SDPA, as
    torchtitan runs it), the unfused core (``flash=False``) is replayed.
    """
    dense, attn = layer_forward_flops_per_token(model)
    blocks = model.layers + model.mtp_layers  # an MTP module's block is recomputed alike
    if recompute == "selective-op":
        replayed = dense * (1 - float(kept_dense_fraction(model))) + (0.0 if flash else attn)
        return blocks * replayed * batch_tokens
    if recompute == "full":
        return blocks * (dense + attn) * batch_tokens
    if recompute == "selective":
        return blocks * attn * batch_tokens
    if recompute == "none":
        return 0.0 * batch_tokens
    raise ValueError(f"recompute must be none, selective, full or selective-op (got {recompute!r})")


def hardware_flops(model: ModelSpec, batch_tokens: ArrayLike, recompute: str,
                   flash: bool = True) -> ArrayLike:
    """Hardware FLOPs: model FLOPs plus recomputation (the numerator of HFU)."""
    return model_flops(model, batch_tokens) + recompute_flops(model, batch_tokens, recompute,
                                                              flash)


def iteration_flops(model: ModelSpec, global_batch: ArrayLike, recompute: str = "none") -> dict:
    """Model and hardware FLOPs of one iteration of ``global_batch`` sequences."""
    tokens = global_batch * model.seq_len
    return {
        "model": model_flops(model, tokens),
        "hardware": hardware_flops(model, tokens, recompute),
    }


def narayanan_eq3(model: ModelSpec, global_batch: float, full_recompute: bool = False) -> float:
    """Eq. 3 exactly as printed, for GPT shapes; kept to check :func:`model_flops` against."""
    B, s, L, h, V = global_batch, model.seq_len, model.layers, model.hidden, model.vocab
    if full_recompute:
        return 96.0 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * h * L))
    return 72.0 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * h * L))


def causal_pairs_per_cp_rank(seq_len: int, cp: int) -> list[int]:
    """Causal (query, key) pairs each cp rank computes under the load-balanced split: the
    sequence cut into ``2·cp`` chunks of ``c = seq/(2cp)`` tokens, rank ``r`` holding chunks
    ``r`` and ``2cp−1−r`` (Megatron-LM's CP, torchtitan's ``context_parallel`` with load
    balancing). Chunk ``i``'s queries see ``c·i + j + 1`` keys for its ``j``-th token, so
    ``c²·i + c(c+1)/2`` pairs; ranks sum chunks ``i`` and ``2cp−1−i``:
    ``c²·(2cp−1) + c(c+1)``, the same on every rank, ``1/cp`` of the ``s(s+1)/2`` total. That is
    why the cost model divides attention FLOPs by cp (docs/costmodel.md)."""
    if seq_len % (2 * cp):
        raise ValueError(f"seq_len ({seq_len}) is not divisible by 2 x cp ({2 * cp})")
    c = seq_len // (2 * cp)

    def chunk(i: int) -> int:
        return c * c * i + c * (c + 1) // 2

    return [chunk(r) + chunk(2 * cp - 1 - r) for r in range(cp)]
