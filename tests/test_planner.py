"""The planner: every layout it calls valid is one ParallelConfig accepts, every rejection names
the rule ParallelConfig would have named, and the ranking is by predicted throughput."""

from __future__ import annotations

import numpy as np
import pytest

from frontier_llm.catalog import load_model, load_system
from frontier_llm.errors import SpecError, UserError
from frontier_llm.planner import REASONS, SearchSpace, default_global_batch, plan
from frontier_llm.planner.plan import memory_bounds, non_dominated
from frontier_llm.specs.forms import layout_from_row
from frontier_llm.specs.parallel import ParallelConfig


@pytest.fixture(scope="module")
def frontier_22b():
    return plan(load_model("gpt-22b"), load_system("frontier"), 64, 128)


def test_valid_layouts_are_valid_configs(frontier_22b):
    model = frontier_22b.model
    valid = np.flatnonzero(frontier_22b.reason == 0)
    assert len(valid) > 100
    for i in valid[:: max(1, len(valid) // 200)]:
        cfg = frontier_22b.layout(int(i))
        cfg.check_model(model)
        cfg.check_world(64)


RULE_FIELDS = {
    "heads not divisible by tp": "heads",
    "a pipeline chunk without layers": "without layers",
    "global_batch not divisible by micro_batch x dp": "global_batch",
    "interleaved needs micro-batches to be a multiple of pp": "micro-batches",
}


def test_rejected_layouts_break_the_rule_they_name(frontier_22b):
    model = frontier_22b.model
    seen = set()
    t = frontier_22b.layouts
    for code, reason in enumerate(REASONS):
        if reason not in RULE_FIELDS:
            continue
        rows = np.flatnonzero(frontier_22b.reason == code)
        for i in rows[:: max(1, len(rows) // 20)]:
            with pytest.raises(SpecError) as err:
                cfg = ParallelConfig(
                    tp=int(t.tp[i]), pp=int(t.pp[i]), dp=int(t.dp[i]),
                    micro_batch=int(t.micro_batch[i]), global_batch=int(t.global_batch[i]),
                    schedule=("gpipe", "1f1b", "interleaved")[t.schedule[i]],
                    virtual_stages=int(t.virtual_stages[i]),
                )
                cfg.check_model(model)
            assert RULE_FIELDS[reason] in str(err.value)
            seen.add(reason)
    assert len(seen) >= 2


def test_ranking_is_by_throughput_and_fits(frontier_22b):
    ranked = frontier_22b.ranked(50)
    assert ranked["fits"].all()
    assert (np.diff(ranked["tokens_per_s"].to_numpy()) <= 1e-9).all()
    assert (ranked["peak_memory_bytes"] <= load_system("frontier").memory_bytes).all()
    best = layout_from_row(ranked.iloc[0])
    assert best == frontier_22b.best()


def test_oom_layouts_are_rejected_with_their_reason():
    p = plan(load_model("gpt-175b"), load_system("frontier"), 64, 64)
    counts = p.rejections()
    assert counts["does not fit in memory"] > 0
    oom = p.reason == REASONS.index("does not fit in memory")
    capacity = load_system("frontier").memory_bytes
    # Rejected: even the low end of the memory interval exceeds the device (``exceeds``).
    low, high = memory_bounds(p.figures["peak_memory_bytes"])
    assert (low[oom] > capacity).all()
    assert (low[p.valid] <= capacity).all()
    # Kept: those that fit, then the tight ones (the interval straddles the capacity).
    tight = p.figures["memory_tight"]
    assert (high[p.valid & ~tight] <= capacity).all() and tight[p.valid].any()
    order = p.order()
    assert not np.any(np.diff(tight[order].astype(int)) < 0)  # no fit after a tight one


def test_tight_layouts_under_the_capacity_rank_before_those_over_it():
    """gpt-22b on one DGX H100: every kept layout is tight. The fastest (tp1 pp4 dp2, 91 GB)
    is predicted over the 80 GB; one a few percent slower (tp2 pp2 sp, 77 GB) under it: the
    one predicted to fit ranks first, and the frontier keeps both groups in that order."""
    p = plan(load_model("gpt-22b"), load_system("dgx-h100"), 8)
    capacity = p.system.memory_bytes
    mem, tps = p.figures["peak_memory_bytes"], p.figures["tokens_per_s"]
    order = p.order()
    tight = p.figures["memory_tight"][order]
    over = tight & (mem[order] > capacity)
    assert tight.all() and over.any() and (~over).any()
    assert tps[order][over].max() > tps[order][~over].max()  # the case the groups decide
    assert not np.any(np.diff(over.astype(int)) < 0)  # none under after one over
    assert mem[order[0]] <= capacity
    shown = p.ranked_indices(None, frontier=True)
    shown_over = mem[shown] > capacity
    assert shown_over.any() and not shown_over[0]
    assert not np.any(np.diff(shown_over.astype(int)) < 0)
    # An over layout is shown only when faster than every layout under the capacity.
    assert tps[shown[shown_over]].min() > tps[shown[~shown_over]].max()
    for group in (shown[~shown_over], shown[shown_over]):
        assert (np.diff(tps[group]) <= 0).all() and (np.diff(mem[group]) < 0).all()


def test_rejection_counts_add_up(frontier_22b):
    total = int(frontier_22b.valid.sum()) + sum(frontier_22b.rejections().values())
    assert total == len(frontier_22b.reason)


def test_space_restrictions_are_honoured():
    p = plan(load_model("gpt-175b"), load_system("frontier"), 1024, 2048,
             SearchSpace(tp=(8,), pp=(16,), recompute=("full",), micro_batch=(1,)))
    df = p.table
    assert set(df["tp"]) == {8} and set(df["pp"]) == {16} and set(df["dp"]) == {8}
    assert set(df["recompute"].astype(str)) == {"full"}


def test_default_global_batch_suits_every_dp():
    m = load_model("gpt-1t")
    gb = default_global_batch(m, 3072)
    assert gb % 3072 == 0 and gb * m.seq_len >= 4 * 1024 * 1024


def test_impossible_requests_explain_themselves():
    m, s = load_model("gpt-22b"), load_system("frontier")
    with pytest.raises(UserError, match="tp 8 does not divide the 7 GPUs"):
        plan(m, s, 7, 7, SearchSpace(tp=(8,)))
    with pytest.raises(UserError, match="between 1 and 1,048,576"):
        plan(m, s, 0)


def test_amsp_partial_sharding_is_in_the_space():
    p = plan(load_model("gpt-175b"), load_system("frontier"), 1024, 2048,
             SearchSpace(tp=(4,), pp=(16,)))
    labels = set(p.table["sharding"].astype(str))
    assert {"zero0", "zero1", "zero2", "zero3"} <= labels
    assert any("partial:2" in lab for lab in labels)


@pytest.mark.parametrize(("memory", "keep"), [
    ([5, 4, 4, 6, 3, 3, 1], [True, True, False, False, True, False, True]),
    ([1, 2, 3], [True, False, False]),
    ([], []),
])
def test_non_dominated_walks_the_ranking(memory, keep):
    assert non_dominated(np.array(memory)).tolist() == keep


def test_the_default_ranking_holds_only_non_dominated_layouts(frontier_22b):
    shown = frontier_22b.ranked_indices(None, frontier=True)
    every = frontier_22b.order()
    tps, mem = frontier_22b.figures["tokens_per_s"], frontier_22b.figures["peak_memory_bytes"]
    assert 1 < len(shown) < len(every)
    for i in shown:  # no other valid layout is as fast with no more memory
        others = every[every != i]
        assert not np.any((tps[others] >= tps[i]) & (mem[others] < mem[i]))
        assert not np.any((tps[others] > tps[i]) & (mem[others] <= mem[i]))
    for j in np.setdiff1d(every, shown):  # every layout left out is dominated by one shown
        assert np.any((tps[shown] >= tps[j]) & (mem[shown] <= mem[j]))
    # The frontier keeps the ranking's order: those that fit, then the tight ones (cost model
    # 2.3's verdict), each fastest first with memory falling.
    tight = frontier_22b.figures["memory_tight"][shown]
    assert (np.diff(tight.astype(int)) >= 0).all()
    for group in (shown[~tight], shown[tight]):
        assert (np.diff(tps[group]) <= 0).all() and (np.diff(mem[group]) < 0).all()


def test_tp_groups_that_cross_a_node_are_refused_not_priced_in_node():
    """tp 3 on 8-GCD nodes: past one node, some tp groups straddle two nodes, which the cost
    model would price at in-node speed (a span of 3 fits in a node). Such layouts are refused
    with their own reason; within one node (6 GCDs) tp 3 stays valid."""
    model, system = load_model("gpt-175b"), load_system("frontier")
    p = plan(model, system, 1020, None, SearchSpace(engine=("megatron",)))
    reason = REASONS.index(
        "a tp x cp group crosses a node (its size does not divide gpus_per_node)")
    tp3 = p.table.tp == 3
    assert tp3.any() and (p.reason[tp3] == reason).sum() > 0
    assert not (p.valid & tp3).any()
    assert p.rejections()[REASONS[reason]] > 0
    small = plan(model, system, 6, None, SearchSpace(engine=("megatron",), tp=(3,)))
    assert len(small.reason) and not (small.reason == reason).any()
