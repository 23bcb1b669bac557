"""Context parallelism in the cost model (issue 30).

cp = 1 reproduces the figures of the cost model before cp existed, exactly
(``tests/data/cp_golden.json``: ``predict`` of 51 layouts over every engine, schedule,
recompute mode and sharding, written from commit b016498 before the cost model learned cp, and
rewritten since only where a term cp does not touch changed: ``git log`` of the file says which);
the cp terms are checked by hand against docs/costmodel.md §"Context parallelism".
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from frontier_llm.catalog import load_model, load_system
from frontier_llm.costmodel import predict
from frontier_llm.specs.layout import Layout, Sharding

GOLDEN = json.loads((Path(__file__).parent / "data" / "cp_golden.json").read_text())


@pytest.mark.parametrize("case", GOLDEN, ids=lambda c: f"{c['model']}-{c['system']}-"
                         f"{c['layout']['engine']}")
def test_cp1_reproduces_the_figures_before_cp(case):
    fields = dict(case["layout"], sharding=Sharding.parse(case["layout"]["sharding"]))
    got = predict(load_model(case["model"]), load_system(case["system"]), Layout(**fields))
    want = case["prediction"]
    # cp_comm is the one part the cost model gained (the K/V exchange): none at cp 1.
    assert got["breakdown"]["time_s"].pop("cp_comm") == 0.0
    # ep_comm (the MoE all-to-alls, issue 41) is none for a dense model.
    assert got["breakdown"]["time_s"].pop("ep_comm") == 0.0
    assert got["breakdown"] == want["breakdown"]
    for key in ("step_time_s", "peak_memory_bytes", "tokens_per_s", "mfu", "hfu", "fits"):
        assert got[key] == want[key], key


# --- the cp terms, by hand -----------------------------------------------------------------

def _model(name="llama3-8b", seq=32768):
    import dataclasses

    return dataclasses.replace(load_model(name), seq_len=seq)


def _layout(**fields):
    base = dict(tp=2, pp=2, dp=2, micro_batch=1, global_batch=8, recompute="none")
    return Layout(**{**base, **fields})


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_megatron_activations_scale_one_over_cp(recompute):
    from frontier_llm.costmodel.layouts import from_configs
    from frontier_llm.costmodel.memory import loss_bytes, rank_activation_bytes

    m = _model()
    for rank in (0, 1):
        one = rank_activation_bytes(m, _layout(engine="megatron", recompute=recompute), rank)
        for cp in (2, 4, 8):
            lay = _layout(engine="megatron", cp=cp, recompute=recompute)
            assert rank_activation_bytes(m, lay, rank) * cp == one
    one = loss_bytes(m, from_configs([_layout(engine="megatron")]))[0]
    assert loss_bytes(m, from_configs([_layout(engine="megatron", cp=4)]))[0] * 4 == one


def test_native_saves_the_gathered_kv():
    """native's layer keeps 1/cp of every token tensor plus the rest of the sequence's K and
    V (gathered before attention, saved as the attention's inputs)."""
    from frontier_llm.costmodel.layouts import from_configs
    from frontier_llm.costmodel.memory import layer_activation_bytes

    m = _model()  # GQA: 8 kv heads of 128, tp 2 -> 512 wide per rank
    s, cp, e = m.seq_len, 4, 2
    one = layer_activation_bytes(m, from_configs([_layout()]))[0]
    four = layer_activation_bytes(m, from_configs([_layout(cp=cp)]))[0]
    kv_rank = m.kv_heads * m.head_dim // 2
    assert kv_rank == 512
    by_hand = 2 * (s - s // cp) * 1 * kv_rank * e  # K and V of the other 3/4 of the sequence
    assert four == one / cp + by_hand
    # Full recompute keeps the block input only; the gathered K/V live while a layer is rebuilt.
    full1 = layer_activation_bytes(m, from_configs([_layout(recompute="full")]), rebuilt=True)
    full4 = layer_activation_bytes(m, from_configs([_layout(recompute="full", cp=cp)]),
                                   rebuilt=True)
    assert full4[0] == full1[0] / cp + by_hand


def test_kv_exchange_volume_and_time_by_hand():
    from frontier_llm.costmodel import comm
    from frontier_llm.costmodel.layouts import from_configs
    from frontier_llm.costmodel.steptime import cp_exchange_times, kv_exchange_bytes

    m, system = _model("gpt-22b", 32768), load_system("frontier")
    tp, cp, e = 2, 4, 2
    t = from_configs([_layout(tp=tp, cp=cp, dp=1, global_batch=4)])
    # K and V of the rank's s/cp tokens, h/t wide each (gpt-22b: multi-head attention).
    chunk = 2 * (m.seq_len // cp) * 1 * (m.hidden // tp) * e
    assert kv_exchange_bytes(m, t, e)[0] == chunk
    # The cp group: 4 ranks 2 apart, spanning 8 ranks: one Frontier node (the node link).
    bw, lat = system.link("node").bandwidth * system.eff("collective"), system.link("node").latency
    gather = (cp - 1) / cp * cp * chunk / bw + (cp - 1) * lat
    # Native, flm bench's own CP (the engine's rule, cp_exchange "gather"): an all-gather
    # before its one attention and a reduce-scatter of dK/dV, both exposed however long the
    # attention.
    assert cp_exchange_times(m, system, t, e, 0.0)[0] == pytest.approx(2 * gather, rel=1e-12)
    assert cp_exchange_times(m, system, t, e, 1.0)[0] == pytest.approx(2 * gather, rel=1e-12)
    # Native, PyTorch's context_parallel (cp_exchange "ring", allgather rotation): K/V gathered
    # in forward and again in backward, and cp sends of the fp32 dK/dV round the ring (2 units
    # at e = 2 B), the wrap-around hop spanning 7 ranks: with no attention to hide behind, all
    # exposed.
    hop = chunk / bw + lat
    hop2 = 2 * chunk / bw + lat
    ring = np.array([True])
    got = cp_exchange_times(m, system, t, e, 0.0, ring)[0]
    assert got == pytest.approx(2 * gather + cp * hop2, rel=1e-12)
    assert comm.link_for_span(system, tp * cp)[0][()] == pytest.approx(bw)
    # Eager, attention longer than every collective hides all but the last dK/dV send, which
    # the backward waits for after its last partial attention.
    assert cp_exchange_times(m, system, t, e, 1.0, ring, eager=True)[0] == pytest.approx(
        hop2, rel=1e-12)
    # Compiled (the default, as torchtitan compiles each block whole), every collective of the
    # traced ring is waited at once: nothing hides, however long the attention.
    assert cp_exchange_times(m, system, t, e, 1.0, ring)[0] == pytest.approx(
        2 * gather + cp * hop2, rel=1e-12)
    # Megatron's ring: 3 steps forward of one chunk and 3 backward of two, with no attention
    # to hide behind (attention time 0) all exposed; the wrap-around hop spans 7 ranks.
    mt = from_configs([_layout(tp=tp, cp=cp, dp=1, global_batch=4, engine="megatron")])
    assert cp_exchange_times(m, system, mt, e, 0.0)[0] == pytest.approx(3 * hop + 3 * hop2)
    # Attention longer than every hop hides the ring.
    assert cp_exchange_times(m, system, mt, e, 1.0)[0] == 0.0
    # A block replayed in backward exchanges again: native gathers once more under full and
    # op-level selective recompute, megatron runs the forward ring again under full and
    # selective (the checkpointed core attention holds the ring).
    for rc, native_again, ring_again in (("full", True, True), ("selective-op", True, False),
                                         ("selective", False, True)):
        nt = from_configs([_layout(tp=tp, cp=cp, dp=1, global_batch=4, recompute=rc)])
        assert cp_exchange_times(m, system, nt, e, 0.0, ring)[0] == pytest.approx(
            (3 if native_again else 2) * gather + cp * hop2, rel=1e-12)
        assert cp_exchange_times(m, system, nt, e, 0.0)[0] == pytest.approx(
            (3 if native_again else 2) * gather, rel=1e-12)
        if rc != "selective-op":  # megatron has no op-level selective
            rt = from_configs([_layout(tp=tp, cp=cp, dp=1, global_batch=4, recompute=rc,
                                       engine="megatron")])
            assert cp_exchange_times(m, system, rt, e, 0.0)[0] == pytest.approx(
                (6 if ring_again else 3) * hop + 3 * hop2)


def test_compiled_ring_waits_for_every_collective():
    """torchtitan compiles each block whole (fullgraph), so PyTorch's ring is traced, and a
    traced functional collective is waited at once (``_maybe_wrap_tensor``): the compiled
    ring's K/V gathers and dK/dV sends are exposed whatever the attention, where the eager
    ring hides all but the last send (docs/costmodel.md, "The K/V exchange"). Only cp_comm
    moves, by exactly the exchange's difference, layers x micro-batches."""
    from frontier_llm.costmodel import comm, evaluate
    from frontier_llm.costmodel.layouts import from_configs
    from frontier_llm.costmodel.steptime import kv_exchange_bytes

    m, system = _model("llama3-8b", 131072), load_system("dgx-h100")
    cp, e = 4, 2
    t = from_configs([_layout(tp=1, cp=cp, pp=1, dp=2, global_batch=2, recompute="full")])
    compiled, eager = (evaluate(m, system, t, eager=x, cp_exchange="ring") for x in (False, True))
    chunk = kv_exchange_bytes(m, t, e)
    gather = comm.all_gather(system, cp, 1, cp * chunk)[0]
    grads = comm.send_recv(system, cp - 1, chunk * 2.0)[0]
    # Full recompute: the forward's gather, the replay's, the backward's, and cp sends.
    serial = 3 * gather + cp * grads
    # Eager at these shapes: every collective but the last dK/dV send hides behind attention.
    overlapped = grads
    micro_batches = 1
    diff = compiled["time_cp_comm_s"][0] - eager["time_cp_comm_s"][0]
    assert diff == pytest.approx(m.layers * micro_batches * (serial - overlapped), rel=1e-9)
    assert diff > 0
    # The native gather (flm bench's) and Megatron's ring do not depend on compilation here.
    for other in (dict(), dict(engine="megatron")):
        o = from_configs([_layout(tp=1, cp=cp, pp=1, dp=2, global_batch=2, recompute="full",
                                  **other)])
        a, b = (evaluate(m, system, o, eager=x)["time_cp_comm_s"][0] for x in (False, True))
        assert a == b


def test_native_merge_bytes_by_hand():
    """PyTorch's context_parallel merges its cp partial attentions in fp32 (docs/costmodel.md,
    "The K/V exchange"): forward o·(c·(8+e) + e), backward (q + kv)·(c·(8+e) + 8 + e); the
    replayed forward merges again; Megatron (TransformerEngine) and cp 1 price none."""
    from frontier_llm.costmodel.layouts import from_configs
    from frontier_llm.costmodel.steptime import cp_merge_bytes

    m, e = load_model("llama3-8b"), 2
    s, tp, cp = m.seq_len, 2, 4
    t = from_configs([_layout(tp=tp, cp=cp, pp=1, dp=1, global_batch=4)])
    local = s // cp
    o = q = local * m.hidden // tp  # Llama: the output and Q are h wide
    kv = 2 * local * m.kv_dim // tp  # K and V of the kv heads (8 of 32)
    fwd, bwd = cp_merge_bytes(m, t, e, np.array([True]))
    assert fwd[0] == o * (cp * (8 + e) + e)
    assert bwd[0] == (q + kv) * (cp * (8 + e) + 8 + e)
    # flm bench's one attention merges nothing (the engine's rule, cp_exchange "gather").
    assert [float(x[0]) for x in cp_merge_bytes(m, t, e)] == [0.0, 0.0]
    for other in (_layout(tp=tp, cp=cp, pp=1, dp=1, global_batch=4, engine="megatron"),
                  _layout(tp=tp, pp=1, dp=1, global_batch=4)):
        assert [float(x[0]) for x in cp_merge_bytes(m, from_configs([other]), e)] == [0.0, 0.0]
    # In the step: the merge is the cp part beyond the exchange, at the memory rate, its
    # forward once more under full recompute.
    system = load_system("dgx-h100")
    none = predict(m, system, _layout(tp=tp, cp=cp, pp=1, dp=1, global_batch=4),
                   cp_exchange="ring")
    full = predict(m, system, _layout(tp=tp, cp=cp, pp=1, dp=1, global_batch=4, recompute="full"),
                   cp_exchange="ring")
    rate = system.memory_bandwidth * system.eff("memory")
    layers = m.layers * 4  # four micro-batches of one sequence
    extra = full["breakdown"]["time_s"]["cp_comm"] - none["breakdown"]["time_s"]["cp_comm"]
    assert extra >= layers * fwd[0] / rate * (1 - 1e-9)


def test_attention_flops_equal_on_every_cp_rank():
    from frontier_llm.costmodel.flops import causal_pairs_per_cp_rank

    for s, cp in ((8, 2), (4096, 4), (131072, 8), (131072, 16)):
        pairs = causal_pairs_per_cp_rank(s, cp)
        assert len(set(pairs)) == 1
        assert sum(pairs) == s * (s + 1) // 2
    with pytest.raises(ValueError):
        causal_pairs_per_cp_rank(12, 4)


def test_cp_divides_a_ranks_compute_and_shards_over_dp_x_cp():
    from frontier_llm.costmodel.layouts import from_configs

    m, system = _model(), load_system("frontier")
    a = predict(m, system, _layout(dp=2))["breakdown"]["time_s"]
    b = predict(m, system, _layout(dp=2, cp=4))["breakdown"]["time_s"]
    assert b["compute"] == pytest.approx(a["compute"] / 4, rel=1e-12)
    t = from_configs([_layout(dp=2, cp=4, sharding=Sharding.parse("zero3"))])
    assert t.degree("params")[0] == t.shard_ranks[0] == 8
    assert t.world_size[0] == 2 * 4 * 2 * 2


def test_ring_exchanges_the_heads_sdpa_receives():
    """``cp_heads``: PyTorch's ring works on SDPA's inputs, so a run whose model code repeats
    K/V to every query head before SDPA (torchtitan before ff0829c: ``repeat_kv`` in
    torchtitan/models/llama/model.py at 9dec370) gathers, sends, accumulates and holds them
    all; the default (None) is the model's kv heads, as flm's torchtitan (v0.2.2, ``enable_gqa``)
    runs it. flm bench's gather and Megatron's ring are not changed by it."""
    from frontier_llm.costmodel import evaluate
    from frontier_llm.costmodel.layouts import from_configs
    from frontier_llm.costmodel.memory import cp_ring_backward_bytes
    from frontier_llm.costmodel.steptime import (
        cp_exchange_times,
        cp_merge_bytes,
        kv_exchange_bytes,
    )

    m, system, e = _model("llama3-8b", 65536), load_system("dgx-h100"), 2
    assert (m.heads, m.kv_heads) == (32, 8)
    t = from_configs([_layout(tp=1, pp=1, cp=4, dp=2, global_batch=2, recompute="full")])
    unit = kv_exchange_bytes(m, t, e)[0]
    assert kv_exchange_bytes(m, t, e, 32)[0] == pytest.approx(4 * unit, rel=1e-12)
    ring = np.array([True])
    # No attention to hide behind: the compiled ring's gathers and dK/dV sends scale with
    # the unit (all bandwidth but the latencies).
    kv8 = cp_exchange_times(m, system, t, e, 0.0, ring)[0]
    kv32 = cp_exchange_times(m, system, t, e, 0.0, ring, cp_heads=32)[0]
    assert 3.5 * kv8 < kv32 < 4 * kv8
    assert cp_exchange_times(m, system, t, e, 0.0, ring, cp_heads=8)[0] == kv8
    # flm bench's gather ignores it (its attention takes the kv heads: enable_gqa).
    bench = np.array([False])
    assert (cp_exchange_times(m, system, t, e, 0.0, bench, cp_heads=32)[0]
            == cp_exchange_times(m, system, t, e, 0.0, bench)[0])
    # The merge's backward accumulates dK/dV of the repeated heads; its forward (the output)
    # is the query heads' either way.
    f8, b8 = cp_merge_bytes(m, t, e, ring)
    f32, b32 = cp_merge_bytes(m, t, e, ring, cp_heads=32)
    assert f32[0] == f8[0] and b32[0] > b8[0]
    ring_t = from_configs([_layout(tp=1, pp=1, cp=4, dp=2, global_batch=2, recompute="full")])
    assert (cp_ring_backward_bytes(m, ring_t, "ring", 32)[0]
            > cp_ring_backward_bytes(m, ring_t, "ring")[0] > 0)
    base = evaluate(m, system, t, cp_exchange="ring")
    rep = evaluate(m, system, t, cp_exchange="ring", cp_heads=32)
    assert rep["time_cp_comm_s"][0] > base["time_cp_comm_s"][0]
    assert rep["step_time_s"][0] > base["step_time_s"][0]
    # At cp 1 there is no exchange: nothing moves.
    one = from_configs([_layout(tp=1, pp=1, cp=1, dp=8, global_batch=8, recompute="full")])
    assert (evaluate(m, system, one, cp_exchange="ring", cp_heads=32)["step_time_s"][0]
            == evaluate(m, system, one, cp_exchange="ring")["step_time_s"][0])
