"""The Mixture-of-Experts model spec: the catalog's MoE models against their published parameter
counts (total and active), the per-block pattern, and the one-line refusals of bad MoE fields."""

from __future__ import annotations

import dataclasses

import pytest

from frontier_llm.catalog import load_model
from frontier_llm.errors import SpecError
from frontier_llm.specs.layout import Layout
from frontier_llm.specs.model import ModelSpec


@pytest.mark.parametrize("name, total, active, tolerance", [
    ("mixtral-8x7b", 46.7e9, 12.9e9, 0.01),    # Jiang et al. 2024, Table 1
    ("mixtral-8x22b", 141e9, 39e9, 0.01),      # Mistral AI's model card
    # Kimi K2, DeepSeek-V3, Qwen3 and gpt-oss (their attention as published, MLA or a head_dim
    # apart): tests/test_attention_shapes.py.
])
def test_catalog_moe_models_match_their_published_counts(name, total, active, tolerance):
    model = load_model(name)
    assert model.is_moe
    assert abs(model.num_params() / total - 1) <= tolerance
    if active is not None:
        assert abs(model.active_params() / active - 1) <= tolerance


def test_block_pattern_counts_and_a_dense_model_is_unchanged():
    base = load_model("tiny-moe")
    assert base.moe_blocks == base.layers == 2
    first_dense = dataclasses.replace(base, layers=6, dense_layers=2, moe_layer_freq=2)
    assert [first_dense.moe_block(i) for i in range(6)] == [False, False, True, False, True,
                                                              False]
    assert first_dense.moe_blocks == 2
    # Total = each block's own count; a dense block carries ffn_hidden, an MoE block its experts.
    blocks = [first_dense.layer_params(i) for i in range(6)]
    assert sum(blocks) + first_dense.embedding_params() + first_dense.head_params() \
        == first_dense.num_params()
    assert blocks[2] - blocks[0] == (first_dense.router_params() + first_dense.expert_params()
                                     - first_dense.mlp_params(first_dense.ffn_hidden))
    dense = load_model("tiny-llama")
    assert not dense.is_moe and dense.moe_blocks == 0
    assert dense.active_params() == dense.num_params() == dense.layers * dense.layer_params() \
        + dense.embedding_params() + dense.head_params()


@pytest.mark.parametrize("fields, words", [
    ({"top_k": 2}, "top_k is set but num_experts is 0"),
    ({"num_experts": 4, "top_k": 0}, "top_k must be between 1 and num_experts"),
    ({"num_experts": 4, "top_k": 5}, "top_k must be between 1 and num_experts"),
    ({"num_experts": 4, "top_k": 2, "dense_layers": 4}, "leaves no MoE block"),
    ({"num_experts": 4, "top_k": 2, "moe_layer_freq": 0}, "moe_layer_freq must be between"),
    ({"num_experts": 4, "top_k": 2, "capacity_factor": 0.0}, "capacity_factor must be in"),
    ({"num_experts": 4, "top_k": 2, "router_aux_loss": -0.1}, "router_aux_loss must be in"),
    ({"num_experts": -1}, "num_experts must be in"),
])
def test_bad_moe_fields_are_refused_in_one_line(fields, words):
    base = load_model("tiny-llama").to_dict()
    with pytest.raises(SpecError) as exc:
        ModelSpec(**{**base, **fields})
    assert words in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("layout, model, words", [
    (Layout(dp=4, ep=2, global_batch=4), "tiny-llama", "needs a Mixture-of-Experts model"),
    (Layout(dp=8, ep=8, global_batch=8), "tiny-moe",
     r"num_experts \(4\) is not divisible by ep \(8\)"),
])
def test_ep_against_the_model(layout, model, words):
    with pytest.raises(SpecError, match=words):
        layout.check_model(load_model(model))
