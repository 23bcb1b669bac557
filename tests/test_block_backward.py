"""FSDP2's block-backward moment in the cost model (costmodel/block_backward.py): what it holds,
term by term from the model's parameter count, and where it is not priced. flm memcheck
measures it (tests/test_memcheck_grid.py, 22b-fsdp-full-dp8 and 22b-fsdp-full-3blocks)."""

from __future__ import annotations

import dataclasses

import pytest

from frontier_llm.catalog import load_model, load_system
from frontier_llm.costmodel.layouts import from_configs
from frontier_llm.costmodel.memory import rank_memory
from frontier_llm.costmodel.params import stage_params_per_rank, table_layer_params
from frontier_llm.specs.layout import Layout, zero_preset

SYSTEM = load_system("dgx-h100")


def _model(layers: int):
    return dataclasses.replace(load_model("gpt-22b"), layers=layers)


def _layout(**kw) -> Layout:
    fields = dict(tp=2, dp=8, micro_batch=2, global_batch=16, recompute="full", dtype="bf16",
                  sharding=zero_preset(3))
    return Layout(**{**fields, **kw})


@pytest.mark.parametrize("layers, gathered_blocks", [(2, 2), (3, 3)])
def test_the_block_moment_holds_the_root_and_its_blocks_gathered(layers, gathered_blocks):
    """Two blocks: the last block's moment (itself and the one prefetched) or the first's (itself
    and the reduce-scatter input), each with the root; three: a middle block holds itself, the
    prefetched one and the reduce-scatter input. None of it at the loss's moment."""
    model = _model(layers)
    t = from_configs([_layout()])
    block = float(table_layer_params(model, t)[0]) * 2
    stage = float(stage_params_per_rank(model, 2, 1, 0))
    root = stage * 2 - layers * block
    peak = rank_memory(model, SYSTEM, t, 0)
    assert float(rank_memory(model, SYSTEM, t, 0, phase="loss")["buffers"][0]) == 0
    assert float(peak["buffers"][0]) == pytest.approx(root + gathered_blocks * block)
    # Among its temporaries: the head's unsharded weight gradient (V/t x h, the tied
    # embedding's) and the MLP's last matrix's (f/t x h), besides the tokens' tensors.
    weights = (model.vocab // 2 + model.ffn_hidden // 2) * model.hidden * 2
    assert float(peak["loss"][0]) > weights
    assert peak["step"][0] == 0  # the backward is the peak


@pytest.mark.parametrize("engine", ["megatron", "deepspeed"])
def test_other_engines_are_priced_at_the_loss_alone(engine):
    """Megatron-LM and DeepSpeed keep their own buffers: the native engine's FSDP2 moment is
    not theirs (their terms equal the loss's moment)."""
    sharding = zero_preset(3 if engine == "deepspeed" else 1)
    t = from_configs([_layout(engine=engine, sharding=sharding)])
    model = _model(3)
    got, loss = (rank_memory(model, SYSTEM, t, 0, phase=p) for p in (None, "loss"))
    assert {k: float(v[0]) for k, v in got.items()} == {k: float(v[0]) for k, v in loss.items()}


@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_without_a_rebuilt_block_the_loss_holds_more_on_a_llama_vocabulary(recompute):
    """Llama 3 8B under FSDP2 (tests/memcheck_grid.py 8b-fsdp): the loss's vocabulary-sized
    temporaries outweigh a block's moment; the prediction is the loss's."""
    model = dataclasses.replace(load_model("llama3-8b"), layers=2)
    t = from_configs([Layout(dp=4, global_batch=4, sharding=zero_preset(3),
                             recompute=recompute, dtype="bf16")])
    got, loss = (rank_memory(model, SYSTEM, t, 0, phase=p) for p in ("backward", "loss"))
    assert float(got["peak"][0]) == float(loss["peak"][0])
