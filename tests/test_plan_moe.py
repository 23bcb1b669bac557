"""Planning Mixture-of-Experts models: the planner enumerates ep through the layout's owners
(labels, columns, the budget), rejects a listed ep with the rule it breaks, and gives MoE
layouts intervals that say how little MoE calibration exists."""

from __future__ import annotations

import json

import numpy as np
import pytest

from frontier_llm.catalog import load_model, load_system
from frontier_llm.cli import main
from frontier_llm.errors import SpecError
from frontier_llm.planner.plan import plan
from frontier_llm.planner.space import REASONS, SearchSpace, open_ep
from frontier_llm.specs import axes
from frontier_llm.specs.layout import Layout


@pytest.fixture(scope="module")
def mixtral_256():
    return plan(load_model("mixtral-8x22b"), load_system("dgx-h100"), 256)


def test_every_ep_divides_dp_x_cp_and_the_experts(mixtral_256):
    t, ok = mixtral_256.layouts, mixtral_256.reason == 0
    assert set(np.unique(t.ep[ok])) == {1, 2, 4, 8}
    # With etp = tp (stored 0) ep divides dp x cp; with etp 1, tp x dp x cp (the expert fold).
    at_tp = t.etp == 0
    assert (axes.shard_ranks(t)[at_tp] % t.ep[at_tp] == 0).all() and (8 % t.ep == 0).all()
    folded = axes.shard_ranks(t) * t.tp
    assert (folded % (axes.expert_tensor_parallel(t) * t.ep) == 0).all()
    assert set(np.unique(t.etp[ok & (t.tp > 1)])) == {0, 1}
    assert (t.etp[t.tp == 1] == 0).all()
    # ep re-folds dp x cp: every layout still spans the 256 GPUs.
    assert (t.world_size == 256).all()


def test_the_best_mixtral_layouts_name_their_ep_and_say_no_moe_calibration(capsys):
    assert main(["plan", "--model", "mixtral-8x22b", "--system", "dgx-h100", "--gpus", "256",
                 "--top", "5", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["layouts"]
    assert len(rows) == 5 and all(r["fits"] for r in rows)
    # Every row names its ep; ep 1 may win: a rank holding every expert computes exactly its
    # tokens' routed copies, no EP rank's excess (costmodel/moe.py load_imbalance).
    assert all(r["ep"] in (1, 2, 4, 8) for r in rows)
    assert all("MoE calibration" in r["interval_basis"] for r in rows)
    assert all(r["step_time_s_low"] < r["step_time_s"] < r["step_time_s_high"] for r in rows)


def test_a_dense_model_is_planned_at_ep_1_only():
    p = plan(load_model("gpt-22b"), load_system("frontier"), 64, 128)
    assert (p.layouts.ep == 1).all()
    assert open_ep(load_model("gpt-22b"), 64) == (1,)
    assert open_ep(load_model("mixtral-8x7b"), 12) == (1, 2, 4)


@pytest.mark.parametrize("ep, reason, message", [
    (3, "ep x expert-tp does not divide tp x dp x cp", "does not divide"),
    (16, "num_experts not divisible by ep", "is not divisible by ep"),
])
def test_a_listed_ep_is_rejected_with_the_rule_layout_names(ep, reason, message):
    model = load_model("mixtral-8x7b")
    p = plan(model, load_system("dgx-h100"), 48, 96, SearchSpace(ep=(ep,)))
    assert p.rejections().get(reason, 0) > 0
    t = p.layouts
    for i in np.flatnonzero(p.reason == REASONS.index(reason))[:5]:
        with pytest.raises(SpecError, match=message):
            Layout(tp=int(t.tp[i]), pp=int(t.pp[i]), dp=int(t.dp[i]), ep=ep,
                   micro_batch=int(t.micro_batch[i]),
                   global_batch=int(t.global_batch[i])).check_model(model)


def test_flm_predict_takes_ep_and_gives_a_budget(capsys):
    assert main(["predict", "--model", "mixtral-8x7b", "--system", "dgx-h100", "--tp", "1",
                 "--pp", "4", "--dp", "16", "--ep", "8", "--global-batch", "1024",
                 "--engine", "megatron", "--zero", "1", "--recompute", "full", "--tokens", "1T",
                 "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["layout"]["ep"] == 8
    assert out["breakdown"]["time_s"]["ep_comm"] > 0
    # The budget counts the layout's 64 GPUs (8 nodes of 8): ep adds none.
    assert out["nodes"] == 8 and out["node_hours"] > 0
    assert "MoE calibration" in out["interval_basis"]


def test_flm_plan_says_why_a_dense_model_has_no_ep_layout(capsys):
    assert main(["plan", "--model", "tiny-llama", "--system", "cpu-local", "--gpus", "4",
                 "--ep", "2"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("flm plan: no layout fits; rejected:")
    assert "'ep > 1 needs a Mixture-of-Experts model'" in err[-1]


def test_plan_tokens_prints_6nd_on_active_parameters(capsys):
    """6·N·D with N the parameters a token passes through: Mixtral 8x22B's 39B active, not its
    141B total (which gave 3.6x the FLOPs beside days computed on the active ones); a dense
    model's line is as before."""
    model = load_model("mixtral-8x22b")
    assert main(["plan", "--model", "mixtral-8x22b", "--system", "dgx-h100", "--gpus", "256",
                 "--tokens", "1T", "--top", "1"]) == 0
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if "6ND" in x)
    assert f"{model.active_params():.3g} active parameters (of {model.num_params():.3g})" in line
    assert f"6ND = {6 * model.active_params() * 1e12:.3g} FLOPs" in line
    assert "6ND = 2.35e+23" in line  # 6 x 39.2e9 x 1e12
    assert main(["plan", "--model", "gpt-22b", "--system", "dgx-h100", "--gpus", "64",
                 "--tokens", "1T", "--top", "1"]) == 0
    dense = next(x for x in capsys.readouterr().err.splitlines() if "6ND" in x)
    assert "active" not in dense and "x 2.21e+10 parameters:" in dense
