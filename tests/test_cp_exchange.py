"""The native engine's context-parallel exchange as a trainer's setting (specs/engine_rules.py
CP_EXCHANGE, the cost model's ``cp_exchange``): flm bench's single K/V all-gather with one
masked attention ("gather", the engine's rule) and PyTorch's ``context_parallel`` ring as
torchtitan runs it ("ring"), priced in time and memory by the terms docs/costmodel.md
"Context parallelism" derives."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from frontier_llm.catalog import load_model, load_system
from frontier_llm.costmodel import evaluate, predict
from frontier_llm.costmodel.layouts import from_configs
from frontier_llm.costmodel.memory import (
    activation_bytes,
    cp_mask_bytes,
    cp_ring_backward_bytes,
    layer_activation_bytes,
)
from frontier_llm.costmodel.steptime import cp_exchange_times, kv_exchange_bytes
from frontier_llm.errors import SpecError, UserError
from frontier_llm.specs.engine_rules import CP_EXCHANGE, RULES, check_cp_exchange
from frontier_llm.specs.layout import Engine, Layout
from frontier_llm.specs.sharding import zero_preset

MODEL = dataclasses.replace(load_model("llama3-8b"), seq_len=32768)
SYSTEM = load_system("dgx-h100")


def _layout(**kw) -> Layout:
    base = dict(tp=2, cp=4, pp=1, dp=1, micro_batch=1, global_batch=2,
                sharding=zero_preset(3), sequence_parallel=True)
    return Layout(**{**base, **kw})


def test_each_trainers_exchange_is_its_own():
    assert CP_EXCHANGE == {"flm-bench": "gather", "torchtitan": "ring"}
    assert RULES[Engine.NATIVE].cp_exchange == CP_EXCHANGE["flm-bench"]
    from frontier_llm.trainers import get

    assert get("torchtitan").cp_exchange == "ring"
    assert get("megatron-lm").cp_exchange is None
    assert check_cp_exchange(None) is None and check_cp_exchange("ring") == "ring"
    with pytest.raises(SpecError, match="allgather"):
        check_cp_exchange("allgather")
    with pytest.raises(SpecError):
        evaluate(MODEL, SYSTEM, from_configs([_layout()]), cp_exchange="allgather")


def test_memory_differs_by_the_gathered_kv_the_masks_and_the_rings_backward_buffers():
    """gather keeps, per layer, the other ranks' K and V (2·(s − s/c)·b·kv/t·e) and, once per
    step, the (s/c) x s masks (1 + e bytes an entry); the ring keeps neither, and holds during
    one layer's attention backward the gathered K/V and its own ((c+1) units), fp32 dQ/dK/dV
    and two fp32 dK/dV in flight, and one partial's gradients (e bytes)."""
    e, s, cp, tp = 2, MODEL.seq_len, 4, 2
    local = s // cp
    kv = MODEL.kv_dim // tp
    q = MODEL.q_dim // tp
    # A first stage of two (1F1B, no loss there): its backward peak has no logits beside it.
    t = from_configs([_layout(pp=2, global_batch=4, schedule="1f1b")])
    gathered = 2 * (s - local) * kv * e
    one = {x: layer_activation_bytes(MODEL, t, cp_exchange=x)[0] for x in ("gather", "ring")}
    assert one["gather"] - one["ring"] == gathered
    assert cp_mask_bytes(MODEL, t, "gather")[0] == (1 + e) * local * s
    assert cp_mask_bytes(MODEL, t, "ring")[0] == 0
    kv_el, q_el = 2 * local * kv, local * q  # K and V, and Q, elements of the rank's tokens
    ring_work = (cp + 1) * kv_el * e + 4 * (q_el + kv_el) + 2 * 4 * kv_el + e * (q_el + kv_el)
    assert cp_ring_backward_bytes(MODEL, t, "ring")[0] == ring_work
    assert cp_ring_backward_bytes(MODEL, t, "gather")[0] == 0
    layers, in_flight = MODEL.layers // 2, 2  # 16 layers, 2 micro-batches on stage 0 of 2
    act = {x: activation_bytes(MODEL, t, 0, cp_exchange=x)[0] for x in ("gather", "ring")}
    assert act["gather"] - act["ring"] == (in_flight * layers * gathered + (1 + e) * local * s
                                           - ring_work)
    # The default is the engine's rule, flm bench's.
    assert activation_bytes(MODEL, t, 0)[0] == act["gather"]


def test_a_ring_layout_is_priced_with_the_fused_kernel_it_must_run():
    """PyTorch's CP dispatches only the flash, memory-efficient and cuDNN kernels: no
    (s/c) x s scores saved even where the layout asks for the unfused core."""
    unfused = from_configs([_layout(flash_attention=False)])
    fused = from_configs([_layout()])
    assert (layer_activation_bytes(MODEL, unfused, cp_exchange="ring")[0]
            == layer_activation_bytes(MODEL, fused, cp_exchange="ring")[0])
    assert (layer_activation_bytes(MODEL, unfused, cp_exchange="gather")[0]
            > layer_activation_bytes(MODEL, fused, cp_exchange="gather")[0])


def test_time_differs_in_the_cp_part_only_and_by_the_exchanges():
    """Everything but cp_comm is the same step; flm bench's exchange is all exposed (an
    all-gather and a reduce-scatter of c units per layer and micro-batch), the ring's hides
    its gather behind the first partial attention and adds the fp32 merge."""
    lay = _layout(global_batch=4)
    t = from_configs([lay])
    a, b = (evaluate(MODEL, SYSTEM, t, cp_exchange=x) for x in ("gather", "ring"))
    assert a["step_time_s"][0] != b["step_time_s"][0]
    moved = [k for k in a if k.startswith("time_") and a[k][0] != b[k][0]]
    assert moved == ["time_cp_comm_s"]
    assert (b["step_time_s"][0] - a["step_time_s"][0]
            == pytest.approx(b["time_cp_comm_s"][0] - a["time_cp_comm_s"][0]))
    e = 2
    from frontier_llm.costmodel import comm

    chunk = kv_exchange_bytes(MODEL, t, e)
    bench = (comm.all_gather(SYSTEM, t.cp, t.tp, t.cp * chunk)
             + comm.reduce_scatter(SYSTEM, t.cp, t.tp, t.cp * chunk))[0]
    micro_batches = 4
    assert a["time_cp_comm_s"][0] == pytest.approx(MODEL.layers * micro_batches * bench)
    # The eager ring's exchange alone, with the attention hiding its gathers, is less than flm
    # bench's; with nothing to hide behind it is more (cp fp32 dK/dV sends on top). Compiled
    # (the default), its collectives are waited at once, so it is more whatever the attention.
    ring = np.array([True])
    assert cp_exchange_times(MODEL, SYSTEM, t, e, 1.0, ring, eager=True)[0] < bench
    assert cp_exchange_times(MODEL, SYSTEM, t, e, 0.0, ring, eager=True)[0] > bench
    assert cp_exchange_times(MODEL, SYSTEM, t, e, 1.0, ring)[0] > bench
    # At cp 1 the setting changes nothing.
    one = from_configs([_layout(cp=1, dp=4, global_batch=4)])
    c, d = (evaluate(MODEL, SYSTEM, one, cp_exchange=x) for x in ("gather", "ring"))
    assert c["step_time_s"][0] == d["step_time_s"][0]
    assert c["peak_memory_bytes"][0] == d["peak_memory_bytes"][0]


def test_megatron_keeps_its_ring_whatever_the_setting():
    t = from_configs([_layout(engine="megatron", sharding=zero_preset(1))])
    a, b = (evaluate(MODEL, SYSTEM, t, cp_exchange=x) for x in ("gather", "ring"))
    assert a["step_time_s"][0] == b["step_time_s"][0]
    assert a["peak_memory_bytes"][0] == b["peak_memory_bytes"][0]


def test_torchtitan_rows_state_the_ring_and_are_priced_with_it():
    """Every torchtitan row with cp > 1 states cp_exchange ring (its trainer's); no other row
    states one (TorchTitan's Table 2 and Table 6 cp 2 / 4 / 8 rows). Its Table 2 cp 4 and cp 8
    rows (Llama 3.1 8B, 8 H100 96 GB, 128K / 256K tokens) ran: with the ring's memory they are
    predicted within the device, not over it."""
    from frontier_llm.planner.calibration import (
        CALIBRATION_FILES,
        load_runs,
        predict_row,
        row_cp,
        row_cp_exchange,
    )

    seen = 0
    for path in CALIBRATION_FILES:
        runs = load_runs(path)
        for _, row in runs.iterrows():
            titan = "torchtitan" in " ".join(str(row.get(c)) for c in ("source", "engine",
                                                                       "notes")).lower()
            if titan and row_cp(row) > 1:
                seen += 1
                assert row_cp_exchange(row) == CP_EXCHANGE["torchtitan"], row["source"]
            else:
                assert row_cp_exchange(row) is None, row["source"]
    assert seen == 6
    fp8 = load_runs(next(p for p in CALIBRATION_FILES if str(p).endswith("_fp8.csv")))
    for cp in (4, 8):
        row = fp8[(fp8["cp"] == cp) & fp8["source"].str.contains("Table 2")].iloc[0]
        got = predict_row(row)
        assert got["memory_verdict"] in ("fits", "tight"), got
        assert got["peak_memory_gb"] < 96.0, got
        # The ring's peak does not grow with cp at a fixed 32K tokens a rank, as measured
        # (84.0 and 84.5 GiB): flm bench's masks would (s/c x s entries).
        assert got["peak_memory_gb"] == pytest.approx(83.7, abs=0.05)


def test_the_flag_is_in_the_help_and_validated(capsys):
    from frontier_llm.cli import build_parser

    parser = build_parser()
    for cmd in ("plan", "predict"):
        with pytest.raises(SystemExit):
            parser.parse_args([cmd, "--help"])
        out = capsys.readouterr().out
        assert "--cp-exchange {gather,ring}" in out
        assert "PyTorch's" in out and "context_parallel" in out
        with pytest.raises(SystemExit) as bad:
            parser.parse_args([cmd, "--model", "llama3-8b", "--system", "dgx-h100",
                               "--cp-exchange", "allgather"])
        assert bad.value.code == 2
        assert "invalid choice: 'allgather'" in capsys.readouterr().err


def test_flm_predict_prices_the_setting(capsys):
    """``flm predict --cp-exchange ring`` prints the cost model's ring; without the flag, the
    engine's rule (flm bench's gather), which holds more."""
    import json

    from frontier_llm.cli import build_parser

    words = ["predict", "--model", "llama3-8b", "--system", "dgx-h100", "--seq-len", "32768",
             "--tp", "2", "--cp", "4", "--dp", "1", "--micro-batch", "1", "--global-batch",
             "2", "--zero", "3", "--sequence-parallel", "--format", "json"]
    parser = build_parser()
    got = {}
    for extra, exchange in (([], "gather"), (["--cp-exchange", "ring"], "ring")):
        args = parser.parse_args(words + extra)
        assert args.func(args) == 0
        got[exchange] = json.loads(capsys.readouterr().out)
        want = predict(MODEL, SYSTEM, _layout(), cp_exchange=exchange)
        assert got[exchange]["peak_memory_bytes"] == want["peak_memory_bytes"]
        assert got[exchange]["step_time_s"] == want["step_time_s"]
    assert got["ring"]["peak_memory_bytes"] < got["gather"]["peak_memory_bytes"]
    # The table says which exchange it priced.
    table = [w for w in words if w not in ("--format", "json")]
    for extra, line in (([], "cp exchange gather (flm bench"),
                        (["--cp-exchange", "ring"], "cp exchange ring (PyTorch context_parallel")):
        args = parser.parse_args(table + extra)
        assert args.func(args) == 0
        assert line in capsys.readouterr().out


def test_the_torchtitan_export_is_only_asked_for_the_ring(capsys):
    """flm export --to torchtitan --from-plan plans with PyTorch's ring; asked for flm bench's
    gather it refuses, saying why; its notes say what a cp layout runs."""
    from frontier_llm.cli import build_parser
    from frontier_llm.trainers import get

    parser = build_parser()
    args = parser.parse_args(["export", "--to", "torchtitan", "--model", "llama3-8b",
                              "--system", "dgx-h100", "--from-plan", "--gpus", "8",
                              "--plan-args", "--cp 2 --seq-len 32768 --cp-exchange gather"])
    with pytest.raises(UserError, match="runs context parallelism as --cp-exchange ring"):
        args.func(args)
    notes = get("torchtitan").notes(MODEL, _layout())
    assert any("context_parallel ring" in n and "--cp-exchange ring" in n for n in notes)
    assert not any("context_parallel" in n for n in get("torchtitan").notes(
        MODEL, _layout(cp=1, dp=4, global_batch=4)))


def test_the_planner_and_its_curve_price_the_setting():
    """plan() and the allocation curve take cp_exchange: the same native cp layouts hold less
    under the ring (no masks, no gathered K/V)."""
    from frontier_llm.planner import SearchSpace, plan
    from frontier_llm.planner.allocation import allocation_curve

    space = SearchSpace(engine=("native",), tp=(2,), cp=(4,), pp=(1,))
    a, b = (plan(MODEL, SYSTEM, 8, 4, space, cp_exchange=x) for x in ("gather", "ring"))
    ok = np.isfinite(a.figures["peak_memory_bytes"])
    assert ok.any()
    # Less wherever the peak is the backward's (at the optimizer step no activation is alive).
    ring, gather = b.figures["peak_memory_bytes"][ok], a.figures["peak_memory_bytes"][ok]
    assert (ring <= gather).all() and (ring < gather).sum() > len(ring) // 2
    curves = [allocation_curve(MODEL, SYSTEM, [8], space=space, global_batch=4,
                               cp_exchange=x) for x in ("gather", "ring")]
    assert curves[0]["step_time_s"].iloc[0] != curves[1]["step_time_s"].iloc[0] or \
        curves[0]["peak_memory_gb"].iloc[0] != curves[1]["peak_memory_gb"].iloc[0]


def test_a_torchtitan_sweep_predicts_its_jobs_with_the_ring():
    """A sweep's jobs are priced with their trainer's exchange: torchtitan's ring; flm bench's
    (and Megatron-LM's, whose engine has its own ring) the engine's rule."""
    from types import SimpleNamespace

    from frontier_llm.jobs.sweepspec import _cp_exchange, _predicted

    assert _cp_exchange(SimpleNamespace(workload="torchtitan")) == "ring"
    assert _cp_exchange(SimpleNamespace(workload="flm-bench")) is None
    assert _cp_exchange(SimpleNamespace(workload="megatron-lm")) is None
    lay = _layout()
    ring = _predicted(MODEL, SYSTEM, lay, "ring")
    assert ring["peak_memory_bytes"] == predict(MODEL, SYSTEM, lay,
                                                cp_exchange="ring")["peak_memory_bytes"]
    assert ring["peak_memory_bytes"] < _predicted(MODEL, SYSTEM, lay)["peak_memory_bytes"]


def test_the_python_api_takes_the_setting():
    import frontier_llm.api as flm

    fields = dict(seq_len=32768, tp=2, cp=4, dp=1, micro_batch=1, global_batch=2, zero=3,
                  sequence_parallel=True)
    ring = flm.predict("llama3-8b", "dgx-h100", cp_exchange="ring", **fields)
    assert ring["peak_memory_bytes"] == predict(MODEL, SYSTEM, _layout(),
                                                cp_exchange="ring")["peak_memory_bytes"]
    assert ring["peak_memory_bytes"] < flm.predict("llama3-8b", "dgx-h100",
                                                   **fields)["peak_memory_bytes"]
    ranked = flm.plan("llama3-8b", "dgx-h100", 8, global_batch=4, seq_len=32768, cp=4, tp=2,
                      engine="native", top=None, cp_exchange="ring", include_oom=True)
    assert len(ranked)
