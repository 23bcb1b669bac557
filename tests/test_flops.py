"""FLOP counting reproduces Narayanan et al. 2021 eq. 3 and the published MFU figures."""

from __future__ import annotations

import numpy as np
import pytest

from frontier_llm.catalog import load_model
from frontier_llm.costmodel.flops import (
    hardware_flops,
    iteration_flops,
    model_flops,
    narayanan_eq3,
)


@pytest.mark.parametrize("name", ["gpt-22b", "gpt-175b", "gpt-530b", "gpt-1t"])
def test_matches_eq3_for_gpt_shapes(name):
    model = load_model(name)
    tokens = 64 * model.seq_len
    assert model_flops(model, tokens) == pytest.approx(narayanan_eq3(model, 64), rel=1e-12)
    assert hardware_flops(model, tokens, "full") == pytest.approx(
        narayanan_eq3(model, 64, full_recompute=True), rel=1e-12
    )


def test_selective_recompute_costs_only_attention_core():
    model = load_model("gpt-22b")
    tokens = 4 * model.seq_len
    extra = hardware_flops(model, tokens, "selective") - model_flops(model, tokens)
    assert extra == pytest.approx(model.layers * 4 * model.seq_len * model.hidden * tokens)
    assert 0 < extra < 0.05 * model_flops(model, tokens)


@pytest.mark.parametrize("name", ["gpt-22b", "llama3-8b"])
def test_selective_op_replays_the_matmuls_it_does_not_keep(name):
    """Op-level selective recompute replays the 2nd, 4th, ... weight matmuls (wk, wo, w3 for
    SwiGLU; wk, wo, w2 for GeLU), and the attention core too when it is not one fused kernel."""
    model = load_model(name)
    h, kv, f = model.hidden, model.kv_dim, model.ffn_hidden
    replayed = h * kv + h * h + h * f  # wk, wo, then w3 (SwiGLU) or w2 (GeLU): h x f either way
    tokens = 2 * model.seq_len
    extra = hardware_flops(model, tokens, "selective-op") - model_flops(model, tokens)
    assert extra == pytest.approx(model.layers * 2 * replayed * tokens, rel=1e-12)
    unfused = hardware_flops(model, tokens, "selective-op", flash=False)
    assert unfused - extra - model_flops(model, tokens) == pytest.approx(
        model.layers * 4 * model.seq_len * h * tokens, rel=1e-12)


def test_reproduces_published_mfu_22b_a100():
    # Korthikanti et al. 2022 Table 5: 22B, 8 A100, batch 4, 1.10 s per iteration, MFU 41.5 %.
    model = load_model("gpt-22b")
    mfu = model_flops(model, 4 * model.seq_len) / (1.10 * 8 * 312e12)
    assert mfu == pytest.approx(0.415, abs=0.003)


def test_vectorized_over_batches():
    model = load_model("llama3-8b")
    batches = np.array([1, 2, 4, 8])
    out = iteration_flops(model, batches, "full")
    assert out["model"].shape == (4,)
    np.testing.assert_allclose(out["model"] / out["model"][0], batches)
    assert np.all(out["hardware"] > out["model"])


def test_gqa_counts_fewer_flops_than_mha():
    llama = load_model("llama3-8b")
    mha = llama.__class__(**{**llama.to_dict(), "kv_heads": llama.heads})
    assert model_flops(llama, 1) < model_flops(mha, 1)


def test_unknown_recompute_rejected():
    with pytest.raises(ValueError, match="recompute must be"):
        hardware_flops(load_model("tiny-gpt"), 1, "sometimes")
