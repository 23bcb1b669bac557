"""Mixture-of-Experts in the cost model (issue 41), checked against hand computation.

Dense models are untouched: tests/test_cp_costmodel.py's golden figures (51 layouts written
before cp and MoE existed) still match, ``ep_comm`` 0. Nothing here is measured: the figures
are the formulas of docs/costmodel.md "Mixture-of-Experts" worked by hand. The GPU systems are
catalog specs (no GPU runs here); the models are built in the test (Mixtral 8x7B's published
shapes, Jiang et al. 2024, Table 1).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest

from frontier_llm.catalog import load_model, load_system
from frontier_llm.costmodel import comm, moe, predict
from frontier_llm.costmodel.flops import model_flops
from frontier_llm.costmodel.layouts import from_configs
from frontier_llm.costmodel.memory import layer_activation_bytes, state_bytes
from frontier_llm.costmodel.params import table_layer_params
from frontier_llm.planner import intervals
from frontier_llm.specs.layout import Layout, Sharding
from frontier_llm.specs.model import ModelSpec

MIXTRAL = load_model("mixtral-8x7b")
# A tiny MoE with a dense first block and every other block MoE (blocks 1 and 3), a shared
# expert and GeLU experts with biases: every term of the mean block differs from Mixtral's.
TINY = ModelSpec(name="tiny-moe-test", layers=4, hidden=64, heads=4, seq_len=32, vocab=128,
                 num_experts=4, top_k=2, expert_ffn_hidden=96, shared_experts=1, dense_layers=1,
                 moe_layer_freq=2)
H100 = load_system("dgx-h100")


def _layout(**kw) -> Layout:
    base = dict(tp=1, pp=4, dp=16, micro_batch=1, global_batch=256, recompute="selective",
                engine="megatron", flash_attention=True, dtype="bf16")
    return Layout(**{**base, **kw})


def test_mixtral_model_flops_are_six_times_its_active_matmul_parameters():
    m = MIXTRAL
    norms = m.layers * 2 * m.hidden + m.hidden  # RMSNorm weights do no matmul
    active_matmul = m.active_params() - norms - m.vocab * m.hidden  # the embedding: a lookup
    attention = m.layers * 4 * m.seq_len * m.hidden
    assert model_flops(m, 1.0) == pytest.approx(6 * active_matmul + 3 * attention, rel=1e-12)
    # 12.9B active of 46.7B: throughput and MFU are counted on the active parameters.
    assert model_flops(m, 1.0) < 6 * (m.num_params() - m.vocab * m.hidden) / 3


def test_tiny_moe_mean_block_flops_by_hand():
    m = TINY
    h, f, fe, E = 64, 256, 96, 4
    dense_mlp = 2 * 2 * h * f
    moe_mlp = 2 * h * E + (2 + 1) * 2 * 2 * h * fe  # router + (top_k + shared) GeLU experts
    attn_proj = 2 * (h * 3 * h + h * h)
    per_block = attn_proj + (2 * dense_mlp + 2 * moe_mlp) / 4 + 4 * m.seq_len * h
    want = 3 * (m.layers * per_block + 2 * h * m.vocab)
    assert model_flops(m, 1.0) == pytest.approx(want, rel=1e-12)


def test_mean_block_parameters_match_the_model_and_split_over_ep():
    for ep in (1, 2, 4, 8):
        t = from_configs([_layout(ep=ep)])
        got = table_layer_params(MIXTRAL, t)[0]
        routed = MIXTRAL.expert_params()
        assert got == MIXTRAL.layer_params(0) - routed + routed // ep
    # TP splits the experts' matrices too (expert-tp = tp); the router stays whole.
    t = from_configs([_layout(tp=2, dp=8, ep=8, sequence_parallel=True)])
    exp = MIXTRAL.mlp_params(MIXTRAL.expert_ffn_hidden) // 2
    assert moe.routed_params_per_rank(MIXTRAL, t)[0] == exp


def test_tiny_moe_mean_block_parameters_by_hand():
    t = from_configs([_layout(pp=1, dp=2, ep=2, global_batch=4)])
    per = table_layer_params(TINY, t)[0]
    assert per * TINY.layers == pytest.approx(
        sum(TINY.layer_params(i) for i in range(4)) - 2 * TINY.expert_params() / 2, rel=1e-12)


def test_expert_states_shrink_with_ep_and_shard_over_expert_dp():
    held = 8  # Mixtral's 32 blocks over pp = 4
    routed = MIXTRAL.expert_params()
    zero1 = Sharding.parse("zero1")
    out = {}
    for ep in (1, 8):
        t = from_configs([_layout(ep=ep, sharding=zero1)])
        out[ep] = {k: v[0] for k, v in state_bytes(MIXTRAL, t, 1, held).items()}
    # bf16 parameters: 2 bytes of the 7/8 of each block's experts ep = 8 leaves elsewhere.
    assert out[1]["params"] - out[8]["params"] == 2 * held * (routed - routed // 8)
    # Optimizer states (12 bytes) over dp·cp = 16 for the dense part, expert-dp = 2 for experts.
    n8 = held * (MIXTRAL.layer_params(0) - routed + routed // 8)
    dense = n8 - held * routed // 8
    assert out[8]["optimizer"] == 12 * (-(-dense // 16) + -(-(held * routed // 8) // 2))
    # Fully sharded, the experts' states per rank are E/(ep·dp·cp/ep): ep moves them between
    # ranks but saves nothing; the unsharded gradients (and parameters) are what ep saves.
    assert out[8]["optimizer"] == out[1]["optimizer"]
    assert out[1]["grads"] - out[8]["grads"] == 4 * held * (routed - routed // 8)


def test_all_to_all_costs_more_across_nodes():
    nbytes = 64e6
    inside = comm.all_to_all(H100, 8, 1, nbytes)  # 8 ranks, one node
    across = comm.all_to_all(H100, 8, 2, nbytes)  # every other rank: two nodes
    assert across > 2 * inside
    assert comm.all_to_all(H100, 1, 1, nbytes) == 0.0
    # The same ep group, its span moved across nodes by tp = 2 (sequence parallelism off, so
    # the bytes are the same): the predicted all-to-all time grows.
    one = predict(MIXTRAL, H100, _layout(tp=1, dp=16, ep=8))["breakdown"]["time_s"]["ep_comm"]
    two = predict(MIXTRAL, H100, _layout(tp=2, dp=8, ep=8))["breakdown"]["time_s"]["ep_comm"]
    assert two > 2 * one > 0


def test_all_to_all_volume_by_hand():
    t = from_configs([_layout(ep=4)])
    # tokens·top_k·h·e·imb·(ep−1)/ep; a micro-batch balance loss leaves the binomial noise
    # of the rank's 8192 routed copies, the slowest of 4 ranks sqrt(2·ln 4) deviations up.
    imb = 1 + math.sqrt((3 / 4) / 8192) * math.sqrt(2 * math.log(4))
    want = 4096 * 2 * 4096 * 2 * imb * 3 / 4
    assert moe.all_to_all_bytes(MIXTRAL, t, 2)[0] == pytest.approx(want, rel=1e-12)
    full = from_configs([_layout(ep=4, recompute="full")])
    a2a = comm.all_to_all(H100, 4, 1, want)
    assert moe.all_to_all_times(MIXTRAL, H100, t, 2)[0] == pytest.approx(4 * a2a)
    assert moe.all_to_all_times(MIXTRAL, H100, full, 2)[0] == pytest.approx(6 * a2a)


def test_capacity_factor_caps_the_imbalance():
    # A global-batch balance loss: the hottest of Mixtral's 8 experts is the 64-expert
    # MaxVio's spread times sqrt(2·ln 8).
    glob = dataclasses.replace(MIXTRAL, router_balance="aux-loss-global")
    hottest = 1 + (moe.LOAD_IMBALANCE - 1) * math.sqrt(math.log(8) / math.log(64))
    assert moe.load_imbalance(glob) == pytest.approx(hottest)
    capped = dataclasses.replace(glob, capacity_factor=1.25)
    assert moe.load_imbalance(capped) == 1.25
    loose = dataclasses.replace(glob, capacity_factor=4.0)
    assert moe.load_imbalance(loose) == pytest.approx(hottest)
    t = from_configs([_layout(ep=8)])
    assert (predict(capped, H100, _layout(ep=8))["step_time_s"]
            < predict(glob, H100, _layout(ep=8))["step_time_s"])
    assert moe.all_to_all_bytes(capped, t, 2)[0] < moe.all_to_all_bytes(glob, t, 2)[0]


def test_permuted_tokens_in_activation_memory_by_hand():
    t = from_configs([_layout(ep=8)])
    one = dataclasses.replace(MIXTRAL, top_k=1)
    sb, h, fe, e = 4096, 4096, 14336, 2
    # Each routed copy of a token: its permuted hidden state twice (expert input, combine
    # input) and a SwiGLU expert's four saved intermediates, on the most loaded rank; top-1
    # routes half the copies, so its sampling noise (and its imbalance) is a little larger.
    two, one_load = moe.load_imbalance(MIXTRAL, t)[0], moe.load_imbalance(one, t)[0]
    assert one_load > two > 1.0
    want = sb * (2 * two - one_load) * (2 * h * e + 4 * fe * e)
    got = layer_activation_bytes(MIXTRAL, t)[0] - layer_activation_bytes(one, t)[0]
    assert got == pytest.approx(want, rel=1e-12)


def test_expert_gemms_slow_down_when_tokens_per_expert_are_few():
    short = dataclasses.replace(MIXTRAL, seq_len=512)
    t = from_configs([_layout(ep=1)])
    assert moe.expert_rows(short, t)[0] == 512 * 2 / 8
    assert moe.expert_gemm_slowdown(short, t, 1200.0)[0] > 1.0
    assert moe.expert_gemm_slowdown(MIXTRAL, from_configs([_layout(ep=8)]), 1200.0)[0] == 1.0
    assert moe.expert_gemm_slowdown(short, t, 0.0)[0] == 1.0  # no size law: no slowdown


def test_moe_interval_is_at_least_the_all_family_quantile():
    frame = pd.DataFrame({"engine": ["megatron"], "sharding": ["zero1"], "gpus": [64],
                          "step_time_s": [2.0], "tokens_per_s": [1e5],
                          "peak_memory_bytes": [40e9]})
    dense = intervals.add_intervals(frame, H100, 0.8)
    moe_rows = intervals.add_intervals(frame, H100, 0.8, moe=True)
    res = intervals.load_residuals()
    pool = intervals.residual_quantile(
        intervals.usable(res)["loso_log_residual"].to_numpy(float), 0.8)
    # The MoE calibration rows (families with +moe), too few for a quantile: their worst.
    ok = intervals.usable(res)
    moe_res = ok[ok["family"].fillna("").str.contains("+moe", regex=False)]
    worst = float(np.max(np.abs(moe_res["loso_log_residual"]))) if len(moe_res) else 0.0
    q = np.log(moe_rows["step_time_s_high"][0] / 2.0)
    assert q == pytest.approx(max(pool, worst, np.log(dense["step_time_s_high"][0] / 2.0)))
    assert "MoE calibration" in moe_rows["interval_basis"][0]
    assert "MoE calibration" not in dense["interval_basis"][0]
    # A plan row with ep > 1 is an MoE layout without being told; ep 1 is left to ``moe``.
    with_ep = intervals.add_intervals(frame.assign(ep=[8]), H100, 0.8)
    assert "MoE calibration" in with_ep["interval_basis"][0]
    assert with_ep["step_time_s_high"][0] == moe_rows["step_time_s_high"][0]
    ep1 = intervals.add_intervals(frame.assign(ep=[1]), H100, 0.8)
    assert ep1["interval_basis"][0] == dense["interval_basis"][0]


def test_a_dense_model_never_reaches_the_moe_terms(monkeypatch):
    """Dense figures are unchanged because no MoE function runs for them: each one, replaced
    by a tripwire, stays untouched while a dense layout of every engine is predicted."""

    def tripwire(*args, **kwargs):
        raise AssertionError("an MoE term ran for a dense model")

    for name in ("mlp_flops_per_token", "routed_flops_per_token", "layer_params_per_rank",
                 "routed_params_per_rank", "sharded_count", "routed_gemm_extra",
                 "all_to_all_times", "activation_extra"):
        monkeypatch.setattr(moe, name, tripwire)
    dense = load_model("llama3-8b")
    for engine in ("native", "megatron", "deepspeed"):
        out = predict(dense, H100, _layout(engine=engine, sharding=Sharding.parse("zero1")))
        assert out["breakdown"]["time_s"]["ep_comm"] == 0.0


def test_peak_memory_drops_with_ep():
    peaks = [predict(MIXTRAL, H100, _layout(ep=ep))["peak_memory_bytes"] for ep in (1, 2, 4, 8)]
    assert peaks == sorted(peaks, reverse=True) and peaks[-1] < 0.5 * peaks[0]


def test_a_stage_of_moe_blocks_holds_their_parameters_not_the_mean_blocks():
    # Blocks 0, 1 dense, 2, 3 MoE over pp 4: each middle stage (no embedding, no head) holds
    # its own block, rank 1 the dense block 1, rank 2 the MoE block 2, not two mean blocks.
    m = dataclasses.replace(TINY, dense_layers=2, moe_layer_freq=1)
    t = from_configs([_layout(pp=4, dp=1, global_batch=4)])
    assert state_bytes(m, t, 1)["params"][0] == 2 * m.layer_params(1)  # bf16: 2 bytes each
    assert state_bytes(m, t, 2)["params"][0] == 2 * m.layer_params(2)
    # The fullest window (stage_moe_share) is what a stage of unknown place is priced at.
    assert list(moe.stage_moe_share(m, np.array([1, 2, 3, 4]))) == [1.0, 1.0, 2 / 3, 0.5]
    assert moe.stage_moe_share(MIXTRAL, np.array([8]))[0] == 1.0
