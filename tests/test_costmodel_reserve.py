"""The reserve (costmodel/reserve.py): context, collective buffers and fragmentation, each a
physical quantity with its source, and how they add to the predicted peak."""

from __future__ import annotations

import dataclasses

import pytest

from frontier_llm.catalog import load_model, load_system
from frontier_llm.costmodel import predict
from frontier_llm.costmodel.layouts import from_configs
from frontier_llm.costmodel.reserve import CONNECTION_BYTES, communicators
from frontier_llm.errors import SpecError
from frontier_llm.specs.layout import Engine, Layout
from frontier_llm.specs.sharding import zero_preset


def _layout(**kw) -> Layout:
    base = {"tp": 1, "pp": 1, "dp": 8, "micro_batch": 1, "global_batch": 8}
    base.update(kw)
    return Layout(**base)


def test_a_connection_is_nccls_three_protocol_buffers():
    """NCCL's SIMPLE 4 MiB + LL128 + LL defaults: 9,633,792 bytes, the 9,641,984-byte mapping
    (page-rounded) measured per proxy connection."""
    assert CONNECTION_BYTES == 9_633_792
    assert 0 < 9_641_984 - CONNECTION_BYTES <= 2 * 4096  # two 4 KiB pages


@pytest.mark.parametrize(("kw", "expected"), [
    ({}, 1),                                                 # dp 8 = the world: one group
    ({"tp": 8, "dp": 1}, 1),
    ({"tp": 2, "dp": 4}, 3),                                 # tp, dp and the world
    ({"tp": 2, "pp": 2, "dp": 2, "global_batch": 4}, 4),     # tp, pp, dp, world
])
def test_communicators_per_native_layout(kw, expected):
    assert int(communicators(from_configs([_layout(**kw)]))[0]) == expected


def test_megatron_adds_its_embedding_and_model_parallel_groups():
    kw = {"tp": 2, "pp": 2, "dp": 2, "global_batch": 4}
    native = communicators(from_configs([_layout(**kw)]))[0]
    megatron = communicators(from_configs([_layout(engine=Engine.MEGATRON, **kw)]))[0]
    assert megatron == native + 2


def test_the_reserve_is_its_three_terms_and_adds_to_the_peak():
    model, system = load_model("llama3-8b"), load_system("grand-teton-h100")
    out = predict(model, system, _layout(micro_batch=2, global_batch=16,
                                         sharding=zero_preset(3)))
    mem, parts = out["breakdown"]["memory_bytes"], out["breakdown"]["reserve_bytes"]
    assert mem["reserved"] == pytest.approx(sum(parts.values()))
    assert parts["context"] == system.memory_context_bytes
    assert parts["collective"] == system.collective_channels * CONNECTION_BYTES  # one group
    allocated = out["peak_memory_bytes"] - mem["reserved"]
    assert parts["fragmentation"] == pytest.approx(system.allocator_fragmentation * allocated)
    assert out["peak_memory_bytes"] == pytest.approx(sum(mem.values()))


def test_a_system_without_collective_channels_holds_no_buffers():
    model = load_model("llama3-8b")
    system = dataclasses.replace(load_system("grand-teton-h100"), collective_channels=0)
    out = predict(model, system, _layout(sharding=zero_preset(3)))
    assert out["breakdown"]["reserve_bytes"]["collective"] == 0


def test_the_cpu_system_has_no_reserve():
    model = load_model("tiny-gpt")
    out = predict(model, load_system("cpu-local"), _layout(dp=2, global_batch=2))
    assert out["breakdown"]["memory_bytes"]["reserved"] == 0


@pytest.mark.parametrize("field", ["allocator_fragmentation", "memory_context_bytes",
                                   "collective_channels"])
def test_a_negative_or_impossible_reserve_is_refused(field):
    with pytest.raises(SpecError, match=field):
        dataclasses.replace(load_system("dgx-h100"), **{field: -1})
