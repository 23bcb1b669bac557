"""The layout knob ``reshard_after_forward`` (docs/layout.md "To add a layout knob" was written
from adding it): its engine rules, its cost-model terms, and the native engine running it,
measured against the model's prediction with real ``flm bench`` runs (FSDP2, gloo, 2 ranks).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from frontier_llm.catalog import load_model, load_system
from frontier_llm.costmodel import predict
from frontier_llm.costmodel.layouts import from_configs
from frontier_llm.costmodel.memory import rank_memory
from frontier_llm.costmodel.params import stage_params_per_rank
from frontier_llm.errors import SpecError
from frontier_llm.planner import SearchSpace, plan
from frontier_llm.specs.layout import Layout, zero_preset


def _layout(**kw) -> Layout:
    return Layout(tp=2, dp=8, global_batch=64, sharding=zero_preset(3), **kw)


def test_keeping_parameters_trades_memory_for_one_gather_per_layer():
    """Off keeps every layer of the stage gathered from its forward to its backward: at the
    loss's backward, when the native engine has resharded everything (its root too), the
    buffers grow by the stage's whole unsharded parameters (flm memcheck measures it:
    tests/test_memcheck_grid.py), and the backward's second all-gather goes. (The peak of
    "on" is here a block's backward, costmodel/block_backward.py, which gathers a block or
    two: the difference at the peak is smaller.)"""
    model, system = load_model("gpt-22b"), load_system("frontier")
    on, off = predict(model, system, _layout()), predict(model, system, _layout(
        reshard_after_forward=False))
    stage = float(stage_params_per_rank(model, 2, 1, 0))
    at_loss = [float(rank_memory(model, system, from_configs([lay]), 0, phase="loss")
                     ["buffers"][0]) for lay in (_layout(), _layout(reshard_after_forward=False))]
    assert at_loss[1] - at_loss[0] == pytest.approx(stage * 2, rel=1e-6)  # bf16
    extra = off["breakdown"]["memory_bytes"]["buffers"] - on["breakdown"]["memory_bytes"]["buffers"]
    assert 0 < extra < stage * 2
    assert off["breakdown"]["time_s"]["dp_comm"] < on["breakdown"]["time_s"]["dp_comm"]
    # Without sharded parameters there is nothing to keep: the same prediction.
    z1 = Layout(tp=2, dp=8, global_batch=64, sharding=zero_preset(1))
    kept = Layout(tp=2, dp=8, global_batch=64, sharding=zero_preset(1),
                  reshard_after_forward=False)
    assert predict(model, system, z1)["step_time_s"] == predict(model, system, kept)[
        "step_time_s"]


@pytest.mark.parametrize("engine, why", [
    ("megatron", "shards no parameters"),
    ("deepspeed", "ZeRO-3 frees each module's parameters after its forward"),
])
def test_engines_that_cannot_keep_them_refuse_in_the_layout_and_the_planner(engine, why):
    sharding = zero_preset(3 if engine == "deepspeed" else 1)
    with pytest.raises(SpecError, match=f"engine {engine} runs reshard_after_forward = on "
                                        f"only: .*{why}"):
        Layout(dp=2, global_batch=2, engine=engine, sharding=sharding,
               reshard_after_forward=False)
    result = plan(load_model("gpt-22b"), load_system("frontier"), 16, 128,
                  SearchSpace(engine=("native", engine), reshard_after_forward=(True, False)))
    assert result.rejections()[f"engine {engine} runs reshard_after_forward = on only"] > 0
    kept = result.frame()
    kept = kept[(kept["reject_reason"] == "") & ~kept["reshard_after_forward"]]
    assert len(kept) and set(kept["engine"]) == {"native"}


SHAPE = "layers: 8\nhidden: 512\nheads: 8\nseq_len: 32\nvocab: 256\n"


def _bench(tmp_path: Path, run_id: str, *extra: str) -> dict:
    spec = tmp_path / "m.yaml"
    spec.write_text(f"name: keep\n{SHAPE}")
    cmd = [sys.executable, "-m", "frontier_llm.cli", "bench", "--model", str(spec), "--dp", "2",
           "--zero", "3", "--micro-batch", "1", "--global-batch", "2", "--dtype", "fp32",
           "--steps", "1", "--warmup", "0", "--trace-dir", str(tmp_path), "--run-id", run_id,
           *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((tmp_path / f"{run_id}.trace.json").read_text())


@pytest.mark.slow
def test_the_native_engine_keeps_them(tmp_path):
    """Two real runs that differ only in the knob. flm bench counts the parameters each rank
    holds after the forward: resharded, its half of the model (dp = 2); kept, the whole model
    gathered, as the cost model's kept-parameter term says. (The resident-set difference on
    CPU, printed, moves by tens of MB from run to run with the allocator: not a measure.)"""
    on = _bench(tmp_path, "on")
    off = _bench(tmp_path, "off", "--no-reshard-after-forward")
    assert off["layout"]["reshard_after_forward"] is False
    whole = load_model(str(tmp_path / "m.yaml")).num_params() * 4  # fp32
    for r_on, r_off in zip(on["memory"], off["memory"], strict=True):
        assert r_on["params_bytes"] == pytest.approx(whole / 2, rel=0.02)
        assert r_off["params_bytes"] == pytest.approx(whole, rel=0.02)
    rss = [sum(r["host_rss_peak_bytes"] for r in t["memory"]) / 2 for t in (on, off)]
    predicted = off["prediction"]["peak_memory_bytes"] - on["prediction"]["peak_memory_bytes"]
    print(f"keeping gathered parameters: predicted +{predicted / 1e6:.1f} MB per rank at the "
          f"backward's start; resident set +{(rss[1] - rss[0]) / 1e6:.1f} MB")
    # The whole stage stays gathered at the loss's backward; on this small model the optimizer
    # step's peak (its fp32 temporaries) is the larger moment, so the peaks differ by less.
    model = load_model(str(tmp_path / "m.yaml"))
    layouts = [Layout.from_dict(t["layout"]) for t in (on, off)]
    back = [float(rank_memory(model, load_system("cpu-local"), from_configs([lay]), 0,
                              phase="loss")["buffers"][0]) for lay in layouts]
    assert back[1] - back[0] == pytest.approx(whole, rel=0.05)
    assert 0 <= predicted <= back[1] - back[0]
