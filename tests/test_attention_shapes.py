"""Attention as MoE models have it: ``head_dim`` apart from hidden / heads (Qwen3, gpt-oss) and
multi-head latent attention (DeepSeek-V3, Kimi K2) in the model spec, its FLOPs and parameter
counts against formulas worked by hand, the catalog's new models against their published counts,
and the defaults that keep every existing model and layout hash as it was."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from frontier_llm.catalog import load_model, model_names
from frontier_llm.costmodel import flops, params
from frontier_llm.costmodel.checkpoint_policy import block_matmuls
from frontier_llm.errors import SpecError
from frontier_llm.specs.identity import layout_hash
from frontier_llm.specs.layout import Layout
from frontier_llm.specs.model import ModelSpec

# A small MLA shape to work the formulas by hand: 4 heads, Q latent 16, KV latent 8, per-head
# Q·K width 8 + 4 (no rope + rope), V width 6.
SMALL_MLA = dict(name="mla-small", layers=2, hidden=64, heads=4, seq_len=32, vocab=100,
                 ffn_hidden=128, activation="swiglu", norm="rmsnorm", position="rope",
                 bias=False, q_lora_rank=16, kv_lora_rank=8, qk_nope_head_dim=8,
                 qk_rope_head_dim=4, v_head_dim=6)


def _published(text: str) -> float:
    return float(text[:-1]) * {"B": 1e9, "T": 1e12}[text[-1]]


def _half_unit(text: str) -> float:
    """Half a unit in the last digit a figure was published with ("3.3B": 0.05e9)."""
    decimals = len(text[:-1].split(".")[1]) if "." in text else 0
    return 0.5 * 10.0 ** -decimals * {"B": 1e9, "T": 1e12}[text[-1]]


# (model, published total, published active, whether the publisher counts the input embedding
# as active, source). DeepSeek and OpenAI count the output head but not the embedding lookup
# active (DeepSeek-V3 README_WEIGHTS.md: "36.6B (including 0.9B for the output Head)"; the
# gpt-oss model card's 5.13B is its unembedding plus attention and 4 experts a block); Kimi K2
# is DeepSeek-V3's architecture, counted the same way; Qwen's cards count both.
PUBLISHED = [
    ("deepseek-v3", "671B", "36.6B", False, "deepseek-ai/DeepSeek-V3 README_WEIGHTS.md"),
    ("kimi-k2", "1.04T", "32B", False, "Kimi Team 2025, arXiv 2507.20534"),
    ("qwen3-235b-a22b", "235B", "22B", True, "Qwen/Qwen3-235B-A22B model card"),
    ("qwen3-30b-a3b", "30.5B", "3.3B", True, "Qwen/Qwen3-30B-A3B model card"),
    ("gpt-oss-120b", "116.83B", "5.13B", False, "arXiv 2508.10925, Table 1"),
]


@pytest.mark.parametrize("name, total, active, embedding_active, source", PUBLISHED)
def test_new_moe_models_match_their_published_counts(name, total, active, embedding_active,
                                                     source):
    """Within 1 % of each published figure beyond the rounding it was published with (two
    figures need the rounding: Kimi K2's 1.04T, which config.json's shapes reach to 1.3 %, and
    Qwen3-30B-A3B's 3.3B active, which they reach to 1.6 %; the rest are within 1 % outright)."""
    model = load_model(name)
    ours = {"total": model.num_params(),
            "active": model.active_params() - (0 if embedding_active else
                                               model.vocab * model.hidden)}
    for kind, text in (("total", total), ("active", active)):
        figure = _published(text)
        allowed = 0.01 * figure + _half_unit(text)
        assert abs(ours[kind] - figure) <= allowed, (name, kind, ours[kind], text, source)


def test_gpt_oss_attention_count_matches_the_model_card():
    """The model card's per-component count: attention 0.96B over 36 blocks (64 query heads of
    64 and 8 KV heads on a 2880 hidden, with biases): only a head_dim apart from hidden/heads
    gives it (hidden/heads would be 45)."""
    model = load_model("gpt-oss-120b")
    assert model.head_dim == 64 and model.q_dim == 4096 != model.hidden
    assert abs(model.layers * model.attention_params() / 0.96e9 - 1) <= 0.01


def test_qwen3_flops_count_q_at_heads_times_head_dim():
    """Qwen3-235B-A22B's forward FLOPs per token, worked from its config.json: Q and the output
    projection are 64 x 128 = 8192 wide on a 4096 hidden. Pricing them at the hidden width (as
    before head_dim was a field) counts 23 % fewer FLOPs per training token."""
    model = load_model("qwen3-235b-a22b")
    h, s, q, kv = 4096, 4096, 64 * 128, 4 * 128
    projections = 2 * (h * q + 2 * h * kv + q * h)
    experts = 2 * (h * 128 + 8 * 3 * h * 1536)  # router + 8 SwiGLU experts of 1536
    core = 2 * s * q + 2 * s * q  # Q·Kᵀ and scores·V over 64 heads of 128
    logits = 2 * h * 151936
    by_hand = 3 * (94 * (projections + experts + core) + logits)
    assert flops.model_flops(model, 1) == pytest.approx(by_hand, rel=1e-12)
    narrow = dataclasses.replace(model, head_dim=64)
    assert flops.model_flops(narrow, 1) / by_hand == pytest.approx(0.767, abs=0.001)


def test_mla_flops_and_parameters_by_hand():
    model = ModelSpec(**SMALL_MLA)
    assert model.is_mla and model.head_dim == 12 and model.kv_heads == 4
    # q_a 64x16, q_b 16x(4x12), kv_a 64x(8+4), kv_b 8x(4x(8+6)), o (4x6)x64
    weights = 64 * 16 + 16 * 48 + 64 * 12 + 8 * 56 + 24 * 64
    assert weights == 4544
    dense, core = flops.layer_forward_flops_per_token(model)
    assert dense == 2 * weights + 2 * 3 * 64 * 128
    assert core == 2 * 32 * 48 + 2 * 32 * 24  # Q·Kᵀ over 4 x 12, scores·V over 4 x 6
    # Two RMSNorms of the block, the latents' norms (16 + 8).
    assert model.attention_params() == weights + 2 * 64 + 16 + 8
    assert model.num_params() == 2 * (model.attention_params() + 3 * 64 * 128) + 2 * 100 * 64 + 64


def test_mla_per_rank_parameters_split_up_projections_and_keep_down_projections():
    model = ModelSpec(**SMALL_MLA)
    one = int(params.layer_params_per_rank(model, 1))
    assert one == model.layer_params(0)
    two = int(params.layer_params_per_rank(model, 2))
    # q_a and kv_a (and the norms) whole on each rank, q_b and kv_b by columns, o by rows, the
    # MLP's three matrices by halves.
    whole = 64 * 16 + 64 * 12 + 2 * 64 + 16 + 8
    split = (16 * 48 + 8 * 56 + 24 * 64 + 3 * 64 * 128) // 2
    assert two == whole + split
    names = [name for name, _, _ in block_matmuls(model, 2)]
    assert names[:5] == ["wq_a", "wq_b", "wkv_a", "wkv_b", "wo"]


def test_defaults_keep_every_existing_model_and_hash():
    """head_dim defaults to hidden / heads and MLA is off: every catalog model without the new
    fields gets the Q width of hidden, and an explicit head_dim of hidden / heads is the same
    layout (the same hash)."""
    new = {"deepseek-v3", "kimi-k2", "qwen3-235b-a22b", "qwen3-30b-a3b", "gpt-oss-120b"}
    for name in set(model_names()) - new:
        model = load_model(name)
        assert model.head_dim * model.heads == model.hidden == model.q_dim == model.out_dim
        assert not model.is_mla
    llama = load_model("llama3-8b")
    same = dataclasses.replace(llama, head_dim=128)
    layout = Layout(tp=2, dp=4, global_batch=8)
    assert layout_hash(same, "dgx-h100", layout) == layout_hash(llama, "dgx-h100", layout)
    assert layout_hash(dataclasses.replace(llama, head_dim=64), "dgx-h100", layout) \
        != layout_hash(llama, "dgx-h100", layout)
    dense, core = flops.layer_forward_flops_per_token(llama)
    h, kv, f, s = 4096, 1024, 14336, 8192
    assert dense == 2 * (h * (h + 2 * kv) + h * h + 3 * h * f) and core == 4 * s * h


@pytest.mark.parametrize("fields, words", [
    ({"v_head_dim": 6}, "v_head_dim is set but kv_lora_rank is 0"),
    ({**SMALL_MLA, "kv_heads": 2}, "kv_heads (2) must equal heads (4)"),
    ({**SMALL_MLA, "head_dim": 16}, "head_dim (16) must be qk_nope_head_dim + qk_rope_head_dim"),
    ({**SMALL_MLA, "v_head_dim": 0}, "v_head_dim of at least 1"),
    ({"hidden": 60, "heads": 8}, "give head_dim"),
    ({"head_dim": 0}, "head_dim must be at least 1"),
])
def test_bad_attention_fields_are_refused_in_one_line(fields, words):
    base = dict(name="m", layers=2, hidden=64, heads=4, seq_len=32, vocab=100)
    with pytest.raises(SpecError, match=re.escape(words)) as err:
        ModelSpec(**{**base, **fields})
    assert "\n" not in str(err.value)


def test_head_dim_apart_reaches_the_activation_memory():
    """Q (and the projection input) saved for backward are heads x head_dim wide: widening
    head_dim raises a block's saved activations by exactly that many bytes per token."""
    from frontier_llm.costmodel.layouts import from_configs
    from frontier_llm.costmodel.memory import layer_activation_bytes

    base = ModelSpec(name="m", layers=2, hidden=64, heads=4, seq_len=32, vocab=100,
                     kv_heads=4, activation="swiglu", norm="rmsnorm", position="rope",
                     bias=False)
    wide = dataclasses.replace(base, head_dim=32)  # Q 128 wide on a 64 hidden, K and V too
    layout = Layout(global_batch=1, flash_attention=True, dtype="bf16")
    t = from_configs([layout])
    a = layer_activation_bytes(base, t)[0]
    b = layer_activation_bytes(wide, from_configs([layout]))[0]
    # Q, K, V, projection input: each 64 wider, 2 bytes an element, 32 tokens.
    assert b - a == 4 * 64 * 2 * 32
    assert np.isfinite(a)
