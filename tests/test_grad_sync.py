"""FSDP2 gradient accumulation as a trainer's setting (specs/engine_rules.py GRAD_SYNC_EACH):
flm bench reduce-scatters only after the last micro-batch (unsharded gradients held between),
torchtitan after every one. The cost model prices both in time and memory, and flm memcheck
measures both on flm bench's own engine."""

from __future__ import annotations

import dataclasses

import pytest

from frontier_llm.bench.memcheck import measure
from frontier_llm.catalog import load_model, load_system
from frontier_llm.costmodel import evaluate
from frontier_llm.costmodel.layouts import from_configs
from frontier_llm.costmodel.memory import rank_memory
from frontier_llm.specs.engine_rules import GRAD_SYNC_EACH, RULES
from frontier_llm.specs.layout import Engine, Layout
from frontier_llm.specs.sharding import zero_preset

# Llama 3 8B's shapes with two blocks (tests/memcheck_grid.py's reason), four micro-batches.
MODEL = dataclasses.replace(load_model("llama3-8b"), layers=2)
LAYOUT = Layout(tp=1, pp=1, dp=2, micro_batch=1, global_batch=8, sharding=zero_preset(3))
SYSTEM = load_system("grand-teton-h100")


def test_each_trainers_default_is_its_own():
    assert GRAD_SYNC_EACH == {"flm-bench": False, "torchtitan": True}
    assert RULES[Engine.NATIVE].fsdp_grad_sync_each_microbatch is GRAD_SYNC_EACH["flm-bench"]
    assert RULES[Engine.DEEPSPEED].fsdp_grad_sync_each_microbatch  # ZeRO-3's backward hooks


@pytest.fixture(scope="module")
def measured() -> dict[bool, object]:
    return {sync: measure(MODEL, LAYOUT, rank=0, grad_sync_each_microbatch=sync)
            for sync in (False, True)}


@pytest.mark.parametrize("sync", [False, True])
def test_memcheck_measures_what_the_cost_model_predicts(measured, sync):
    """The allocated peak of each setting within 2 % (the reserve is not traced)."""
    mem = rank_memory(MODEL, SYSTEM, from_configs([LAYOUT]), 0, grad_sync=sync)
    predicted = float(mem["peak"][0] - mem["reserved"][0])
    assert measured[sync].peak_bytes == pytest.approx(predicted, rel=0.02)


def test_syncing_every_micro_batch_holds_less_and_the_model_says_how_much(measured):
    """The unsharded gradient flm bench holds between micro-batches is the difference, less
    the sharded one torchtitan keeps instead: both measured and predicted."""
    got = measured[False].peak_bytes - measured[True].peak_bytes
    t = from_configs([LAYOUT])
    want = float(rank_memory(MODEL, SYSTEM, t, 0, grad_sync=False)["peak"][0]
                 - rank_memory(MODEL, SYSTEM, t, 0, grad_sync=True)["peak"][0])
    assert got > 0 and want > 0
    # The reserve's fragmentation scales the predicted difference by the system's share.
    assert got * (1 + SYSTEM.allocator_fragmentation) == pytest.approx(want, rel=0.05)


def test_syncing_every_micro_batch_costs_the_extra_reduce_scatters():
    """m - 1 more reduce-scatters of the stage's gradients: slower, the time only moves in
    dp_comm; with one micro-batch the two settings are the same step."""
    t = from_configs([LAYOUT])
    each, last = (evaluate(MODEL, SYSTEM, t, grad_sync=s) for s in (True, False))
    assert each["time_dp_comm_s"][0] > last["time_dp_comm_s"][0]
    assert each["step_time_s"][0] - last["step_time_s"][0] == pytest.approx(
        each["time_dp_comm_s"][0] - last["time_dp_comm_s"][0])
    one = from_configs([dataclasses.replace(LAYOUT, global_batch=2)])
    a, b = (evaluate(MODEL, SYSTEM, one, grad_sync=s) for s in (True, False))
    assert a["step_time_s"][0] == b["step_time_s"][0]
    assert a["peak_memory_bytes"][0] == b["peak_memory_bytes"][0]


def test_flm_bench_runs_either_way_and_its_ranks_inherit_the_setting():
    """``flm bench --grad-sync-each-microbatch`` reaches the spawned ranks' command line and
    the engine (bench/engines.py), default off (flm bench's own accumulation)."""
    from frontier_llm.bench.config import build_config, child_argv
    from frontier_llm.cli import build_parser

    def parse(*argv: str):
        return build_parser().parse_args(["bench", *argv])

    base = ("--model", "tiny-gpt", "--tp", "1", "--dp", "2", "--zero", "3",
            "--global-batch", "8", "--dtype", "fp32")
    assert not build_config(parse(*base)).grad_sync_each_microbatch
    args = parse(*base, "--grad-sync-each-microbatch")
    cfg = build_config(args)
    assert cfg.grad_sync_each_microbatch
    assert build_config(parse(*child_argv(cfg, args))).grad_sync_each_microbatch


def test_calibration_prices_a_torchtitan_row_with_torchtitans_setting():
    from frontier_llm.planner.calibration import CALIBRATION_FILES, load_runs, row_grad_sync

    runs = load_runs(CALIBRATION_FILES[0])
    titan = runs[runs["source"].str.contains("TorchTitan")]
    assert len(titan) and all(row_grad_sync(r) is True for _, r in titan.iterrows())
    others = runs[~runs["source"].str.contains("TorchTitan")]
    assert all(row_grad_sync(r) is None for _, r in others.iterrows())
