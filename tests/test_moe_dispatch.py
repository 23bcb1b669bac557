"""The expert-parallel dispatch as it runs (costmodel/moe.py, costmodel/comm.py all_to_all): each
hop on the link tier it crosses, per-node copies under node-limited routing, overlap with compute
as a planning setting, and the router's balance setting."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from frontier_llm.catalog import load_model, load_system
from frontier_llm.costmodel import comm, moe, predict
from frontier_llm.costmodel.layouts import from_configs
from frontier_llm.errors import SpecError
from frontier_llm.specs.layout import Layout, Sharding

MIXTRAL = load_model("mixtral-8x7b")
DSV3 = load_model("deepseek-v3")
H100 = load_system("dgx-h100")
NVL72 = load_system("gb200-nvl72")


def _layout(**kw) -> Layout:
    base = dict(tp=1, pp=1, dp=16, ep=8, micro_batch=1, global_batch=64, recompute="none",
                sharding=Sharding(), engine="megatron")
    return Layout(**{**base, **kw})


def test_all_to_all_mixes_the_tiers_it_crosses():
    nbytes = 64e6
    eff = H100.eff("collective")
    node, net = H100.link("node"), H100.link("network")
    # 16 ranks one apart: 8 in each node; 7/15 of the bytes over NVLink, 8/15 over the NIC,
    # at once: the slower (the NIC's) sets the time.
    got = comm.all_to_all(H100, 16, 1, nbytes)
    want = max(nbytes * 7 / 15 / (node.bandwidth * eff), nbytes * 8 / 15 / (net.bandwidth * eff))
    want += 7 * node.latency + 8 * net.latency
    assert got == pytest.approx(want)
    # One member per node (stride 8): every byte through the NIC, as before.
    alone = comm.all_to_all(H100, 16, 8, nbytes)
    assert alone == pytest.approx(nbytes / (net.bandwidth * eff) + 15 * net.latency)
    assert got < alone
    # Halving what leaves the node halves the network part.
    assert comm.all_to_all(H100, 16, 8, nbytes, 0.5) < alone


def test_nvl72_keeps_a_wide_ep_group_on_nvlink():
    nbytes = 64e6
    # 64 ranks: one NVL72 rack (NVLink), eight DGX H100 nodes (network).
    rack = comm.all_to_all(NVL72, 64, 1, nbytes)
    node = NVL72.link("node")
    assert rack == pytest.approx(nbytes / (node.bandwidth * NVL72.eff("collective"))
                                 + 63 * node.latency)
    assert comm.all_to_all(H100, 64, 1, nbytes) > 5 * comm.all_to_all(H100, 8, 1, nbytes)


def test_router_balance_sets_the_rank_imbalance():
    t1, t8 = from_configs([_layout(ep=1, dp=16)]), from_configs([_layout(ep=8)])
    # One rank holding every expert computes every routed copy: no excess.
    assert moe.load_imbalance(MIXTRAL, t1)[0] == 1.0
    # Wang et al.'s MaxVio is the hottest of 64 experts: spread = MaxVio / sqrt(2·ln 64).
    ref = math.sqrt(2 * math.log(64))
    mean = 4096 * 2  # tokens·top_k of a 4096-token micro-batch
    noise = (7 / 8) / mean  # binomial: a rank's share of the ep group's copies
    up = math.sqrt(2 * math.log(8))  # the slowest of 8 ranks, in standard deviations
    # Megatron-LM's aux_loss holds each micro-batch even: sampling noise alone, as forced.
    assert moe.load_imbalance(MIXTRAL, t8)[0] == pytest.approx(1 + math.sqrt(noise) * up)
    forced = dataclasses.replace(MIXTRAL, router_balance="forced")
    assert moe.load_imbalance(forced, t8)[0] == pytest.approx(1 + math.sqrt(noise) * up)
    # A global-batch loss keeps a loss-balanced router's spread; one expert per rank (ep = E):
    # the hottest of 8, below Wang et al.'s hottest of 64.
    glob = dataclasses.replace(MIXTRAL, router_balance="aux-loss-global")
    want = 1 + math.sqrt(((moe.LOAD_IMBALANCE - 1) / ref) ** 2 + noise) * up
    assert moe.load_imbalance(glob, t8)[0] == pytest.approx(want)
    assert 1.0 < moe.load_imbalance(glob, t8)[0] < moe.LOAD_IMBALANCE
    free = dataclasses.replace(MIXTRAL, router_balance="aux-free")
    want = 1 + math.sqrt(((moe.AUX_FREE_IMBALANCE - 1) / ref) ** 2 + noise) * up
    assert moe.load_imbalance(free, t8)[0] == pytest.approx(want)
    # DeepSeek-V3's 256 experts over ep 64: a rank's 4 experts average their spreads.
    t64 = from_configs([_layout(ep=64, dp=64)])
    s = 0.04 / ref
    want = 1 + math.sqrt(s * s * 64 / 256 + (63 / 64) / (4096 * 8)) * ref
    assert moe.load_imbalance(DSV3, t64)[0] == pytest.approx(want)
    slow = predict(glob, H100, _layout())["step_time_s"]
    assert predict(MIXTRAL, H100, _layout())["step_time_s"] < slow
    assert predict(forced, H100, _layout())["step_time_s"] < slow
    with pytest.raises(SpecError):
        dataclasses.replace(MIXTRAL, router_balance="sinkhorn")


def test_node_limited_routing_needs_a_per_node_dispatcher():
    # DeepSeek-V3, ep 64 over 8 DGX nodes: 8 picks reach 8·(1 − (7/8)^8) = 5.25 nodes
    # unlimited, at most 4 with topk_group 4; alltoall sends every copy.
    t = from_configs([_layout(ep=64, dp=64)])
    flex = moe.MoeRun(dispatcher="flex")
    assert moe.remote_copy_factor(DSV3, H100, t) == 1.0
    assert moe.remote_copy_factor(DSV3, H100, t, flex)[0] == pytest.approx(4 / 8)
    unlimited = dataclasses.replace(DSV3, n_group=0, topk_group=0)
    distinct = 8 * (1 - (7 / 8) ** 8)
    assert moe.remote_copy_factor(unlimited, H100, t, flex)[0] == pytest.approx(distinct / 8)
    # Inside one domain nothing crosses the network.
    inside = from_configs([_layout(ep=8)])
    assert moe.remote_copy_factor(DSV3, H100, inside, flex)[0] == 1.0
    assert (moe.all_to_all_times(DSV3, H100, t, 2, flex)[0]
            < moe.all_to_all_times(DSV3, H100, t, 2)[0])


def test_overlap_hides_the_all_to_all_behind_compute():
    lay = _layout(tp=2, dp=8, ep=8, pp=4, global_batch=256, micro_batch=1)
    t = from_configs([lay])
    total = moe.all_to_all_times(MIXTRAL, H100, t, 2)[0]
    compute = np.array([0.25 * total])
    ep = moe.all_to_all_times(MIXTRAL, H100, t, 2, moe.MoeRun("ep-a2a"), compute)[0]
    dual = moe.all_to_all_times(MIXTRAL, H100, t, 2, moe.MoeRun("dualpipe"), compute)[0]
    # 8 micro-batches per dp rank on pp 4: half unpaired (warm-up and cool-down).
    m = t.num_microbatches[0]
    u = min(1.0, 4 / m)
    assert ep == pytest.approx(u * total + (1 - u) * 0.75 * total)
    # DualPipe also sends one copy per node (its dispatch kernels): fewer bytes to hide.
    total_d = moe.all_to_all_times(MIXTRAL, H100, t, 2, moe.MoeRun("dualpipe"))[0]
    assert total_d < total
    assert dual == pytest.approx(max(total_d - 0.25 * total, 0.0))
    # Compute longer than the exchange hides all of it under DualPipe.
    assert moe.all_to_all_times(MIXTRAL, H100, t, 2, moe.MoeRun("dualpipe"),
                                np.array([2 * total]))[0] == 0.0
    # Through predict: overlap never slows a step.
    none = predict(MIXTRAL, H100, lay)["step_time_s"]
    assert predict(MIXTRAL, H100, lay, moe_run=moe.MoeRun("ep-a2a"))["step_time_s"] <= none
    with pytest.raises(ValueError):
        moe.MoeRun("always")


def test_group_limited_routing_is_checked():
    with pytest.raises(SpecError):
        dataclasses.replace(DSV3, topk_group=9)
    with pytest.raises(SpecError):
        dataclasses.replace(DSV3, n_group=7)


def test_cli_and_api_take_the_moe_settings(capsys):
    from frontier_llm import api
    from frontier_llm.cli import main

    args = ["predict", "--model", "deepseek-v3", "--system", "dgx-h100", "--tp", "1", "--pp",
            "16", "--ep", "64", "--dp", "128", "--micro-batch", "1", "--global-batch", "15360",
            "--recompute", "none", "--engine", "megatron", "--zero", "1", "--format", "json"]
    def step(*extra):
        assert main(args + list(extra)) == 0
        return json.loads(capsys.readouterr().out)["step_time_s"]

    none = step()
    assert step("--moe-overlap", "ep-a2a") < none
    assert step("--moe-overlap", "dualpipe") < step("--moe-overlap", "ep-a2a")
    assert step("--moe-dispatcher", "flex") < none
    # The model's own is aux-free (Wang et al.'s measured spread); a global-batch balance loss
    # leaves a larger one, a micro-batch loss holds each micro-batch even (its noise floor).
    assert step("--router-balance", "aux-loss-global") > none
    assert step("--router-balance", "aux-loss") < none
    lay = dict(tp=1, pp=16, ep=64, dp=128, micro_batch=1, global_batch=15360,
               recompute="none", engine="megatron", zero=1)
    got = api.predict("deepseek-v3", "dgx-h100", moe_overlap="dualpipe", **lay)
    assert got["step_time_s"] == pytest.approx(step("--moe-overlap", "dualpipe"))
    with pytest.raises(Exception, match="moe overlap"):
        api.predict("deepseek-v3", "dgx-h100", moe_overlap="sometimes", **lay)
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    assert "--moe-overlap" in capsys.readouterr().out


def test_moe_corpus_rows_build_their_model_layout_and_run():
    import pandas as pd

    from frontier_llm.planner.calibration import (
        load_calibration,
        row_model,
        row_moe_run,
        row_space,
        unused_reason,
    )

    corpus = load_calibration()
    rows = corpus[corpus["file"] == "calibration_runs_moe.csv"]
    assert len(rows) >= 3 and rows["notes"].str.len().gt(50).all()
    mixtral = rows[rows["source_key"] == "MegatronLM-MoE-README-2024"].iloc[0]
    m = row_model(mixtral)
    assert (m.num_experts, m.top_k, m.expert_ffn_hidden, m.kv_heads) == (8, 2, 14336, 8)
    assert m.router_balance == "aux-loss" and m.activation == "swiglu"
    space = row_space(mixtral)
    assert space.ep == (8,) and space.virtual_stages == (8,)
    assert row_moe_run(mixtral) == moe.MoeRun()
    dsv3 = rows[rows["source_key"] == "DeepSeek-V3-report-2024"].iloc[0]
    # Stated since the H800 system, MTP and the catalog-model column: in use.
    assert unused_reason(dsv3) is None
    assert row_moe_run(dsv3).overlap == "dualpipe"
    gb200 = rows[rows["source_key"] == "MegatronLM-DSV3-GB200"]
    assert gb200["unused"].str.contains("multiple of vp").all()
    assert row_moe_run(pd.Series({"notes": "--overlap-moe-expert-parallel-comm", "engine":
                                  "Megatron-LM --moe-token-dispatcher-type flex"})) == \
        moe.MoeRun("ep-a2a", "flex")
    # A dense row builds a dense model as before.
    dense = corpus[corpus["file"] == "calibration_runs.csv"].iloc[0]
    assert not row_model(dense).is_moe


def test_ep_a2a_overlap_is_megatron_lm_s_only():
    lay = dict(tp=2, dp=8, ep=8, pp=4, global_batch=256, micro_batch=1)
    mega = from_configs([_layout(**lay)])
    native = from_configs([_layout(**lay, engine="native")])
    compute = np.array([1e9])
    run = moe.MoeRun("ep-a2a")
    assert (moe.all_to_all_times(MIXTRAL, H100, mega, 2, run, compute)[0]
            < moe.all_to_all_times(MIXTRAL, H100, mega, 2)[0])
    assert (moe.all_to_all_times(MIXTRAL, H100, native, 2, run, compute)[0]
            == pytest.approx(moe.all_to_all_times(MIXTRAL, H100, native, 2)[0]))


def test_dualpipe_pairs_each_rank_with_its_mirror_stage():
    from frontier_llm.costmodel import steptime

    # DeepSeek-V3 over pp 16 (Megatron-LM's split: 3, 14 x 4, 2 blocks; the head and MTP module
    # on the last stage). DualPipe's rank r holds stages r and 15 - r, each for half the
    # micro-batches: the end ranks run (3 + 2)/2 blocks and half the head per micro-batch, a
    # middle pair two 4-block stages; the larger paces.
    t = from_configs([_layout(pp=16, ep=64, dp=128, global_batch=15360, recompute="full")])
    r = steptime._rates(DSV3, H100, t)
    dual_run = moe.MoeRun("dualpipe")
    blk = steptime.block_times(DSV3, H100, t, r, False, False, dual_run)
    one = steptime.stage_times(DSV3, H100, t, r, blk)
    two = steptime.stage_times(DSV3, H100, t, r, blk, moe_run=dual_run)
    per_layer = blk.compute[0] + blk.comm[0] + blk.cp_comm[0] + blk.ep_comm[0]
    assert one.layers[0] == 2 and one.head[0] > 0  # 1F1B: the last stage with its head paces
    ends, middle = 2.5 * per_layer + one.head[0] / 2, 4 * per_layer
    assert (two.layers[0] * per_layer + two.head[0]) == pytest.approx(max(ends, middle))
    assert two.head[0] == pytest.approx(one.head[0] / 2 if ends >= middle else 0.0)
    # The bubble: (P/2 - 1)(F&B + B - 3W) = 7 x 2F against 1F1B's (P - 1)(F + B) = 15 x 3F.
    assert two.bubble[0] == pytest.approx(one.bubble[0] * 7 * 2 / (15 * 3))
    assert two.pipeline[0] < one.pipeline[0]
    # A heavier head (a 16x vocabulary): the end pair paces, with half of it.
    wide = dataclasses.replace(DSV3, vocab=16 * DSV3.vocab)
    r2 = steptime._rates(wide, H100, t)
    blk2 = steptime.block_times(wide, H100, t, r2, False, False, dual_run)
    one2 = steptime.stage_times(wide, H100, t, r2, blk2)
    two2 = steptime.stage_times(wide, H100, t, r2, blk2, moe_run=dual_run)
    assert two2.layers[0] == pytest.approx(2.5)
    assert two2.head[0] == pytest.approx(one2.head[0] / 2)


def _dsv3_pp16(**kw):
    """DeepSeek-V3 over pp 16 (Megatron-LM's split: 3 dense blocks, 14 x 4 MoE blocks, 2 MoE
    blocks with the head and the MTP module), bf16 so that parameters are 2 bytes each."""
    base = dict(pp=16, ep=64, dp=128, global_batch=15360, recompute="full")
    return from_configs([_layout(**{**base, **kw})])


def test_a_dualpipe_rank_holds_the_states_of_both_its_stages():
    """DualPipe's rank r holds stage r and stage 15 - r (deepseek-ai/DualPipe example.py:
    ``nn.Sequential(full_modules[rank], full_modules[pp_size - 1 - rank])``): a middle pair
    holds 4 + 4 MoE blocks, the end ranks stage 0 (embedding, 3 dense blocks) and stage 15
    (2 MoE blocks, head, MTP); parameters, gradients and optimizer states are the two stages'."""
    from frontier_llm.costmodel import memory
    from frontier_llm.costmodel.params import layer_params_per_rank

    t = _dsv3_pp16()
    one = [memory.rank_memory(DSV3, H100, t, r) for r in range(16)]
    for h in (0, 1, 7):
        dual = memory.dualpipe_memory(DSV3, H100, t, h)
        for part in ("params", "grads", "optimizer"):
            assert dual[part][0] == pytest.approx(one[h][part][0] + one[15 - h][part][0])
        mirror = memory.dualpipe_memory(DSV3, H100, t, 15 - h)
        assert mirror["peak"][0] == pytest.approx(dual["peak"][0])
    # By hand: a middle pair's parameters are 8 MoE blocks' (4 of 256 routed experts on each
    # of the 64 ep ranks), 2 bytes each in bf16; the 1F1B stage held 4.
    block = moe.layer_params_per_rank(DSV3, 1, 64, layer_params_per_rank(DSV3, 1), 1.0, 1)[0]
    assert memory.dualpipe_memory(DSV3, H100, t, 3)["params"][0] == pytest.approx(8 * block * 2)
    assert one[3]["params"][0] == pytest.approx(4 * block * 2)


def test_dualpipe_holds_pp_plus_one_stage_micro_batches_of_activations():
    """DualPipe's README: activations per device PP + 1 (1F1B: PP) in micro-batches of one
    stage; dualpipe.py's schedule holds P - h of stage h and h + 1 of stage P-1-h. Under full
    recompute a block keeps its input, s·b·h·2 bytes: a middle pair keeps 17 micro-batches of
    4 blocks, where 1F1B's rank 1 keeps 15 of its 4; the end ranks keep 1F1B's rank 0 and rank
    15 (its one micro-batch and logits), one block rebuilt at a time."""
    from frontier_llm.costmodel import memory

    t = _dsv3_pp16()
    block_input = DSV3.seq_len * 1 * DSV3.hidden * 2
    one = [memory.rank_memory(DSV3, H100, t, r)["activations"][0] for r in range(16)]
    rebuilt = one[1] - 15 * 4 * block_input  # the block rebuilt in backward
    assert rebuilt > 0
    for h in range(1, 8):
        got = memory.dualpipe_memory(DSV3, H100, t, h)["activations"][0]
        assert got - rebuilt == pytest.approx(17 * 4 * block_input)
    end = memory.dualpipe_memory(DSV3, H100, t, 0)
    assert end["activations"][0] == pytest.approx(one[0] + one[15] - rebuilt)
    assert end["loss"][0] > 0  # the end ranks run the loss (stage 15)
    assert memory.dualpipe_memory(DSV3, H100, t, 1)["loss"][0] == 0
    # The peak is the fullest pair's, named by its rank.
    peak = memory.peak_memory(DSV3, H100, t, dualpipe=True)
    pairs = [memory.dualpipe_memory(DSV3, H100, t, h)["peak"][0] for h in range(8)]
    assert peak["peak"][0] == pytest.approx(max(pairs))
    assert peak["stage"][0] == int(np.argmax(pairs))


def test_only_dualpipe_layouts_change_memory():
    """The other overlaps and every layout without a pipeline keep the 1F1B-family memory
    (GPipe, 1F1B, interleaved); DualPipe's fullest rank holds more than 1F1B's, less than
    GPipe's (all 16 micro-batches of a stage)."""
    from frontier_llm.costmodel import evaluate, memory

    lays = [_layout(pp=16, ep=64, dp=128, global_batch=15360, recompute="full"),
            _layout(pp=4, ep=8, dp=16, global_batch=256, recompute="selective"),
            _layout(pp=4, ep=8, dp=16, global_batch=256, schedule="interleaved",
                    virtual_stages=2, recompute="full"),
            _layout(pp=4, ep=8, dp=16, global_batch=256, schedule="gpipe", engine="native"),
            _layout(pp=1, ep=8, dp=16, global_batch=64)]
    model = [DSV3, MIXTRAL, MIXTRAL, MIXTRAL, MIXTRAL]
    for lay, m in zip(lays, model, strict=True):
        t = from_configs([lay])
        plain = memory.peak_memory(m, H100, t)
        for run in (moe.NO_OVERLAP, moe.MoeRun("ep-a2a"), moe.MoeRun(dispatcher="flex")):
            got = evaluate(m, H100, t, moe_run=run)
            assert got["peak_memory_bytes"][0] == plain["peak"][0]
        dual = evaluate(m, H100, t, moe_run=moe.MoeRun("dualpipe"))["peak_memory_bytes"][0]
        if lay.pp == 1:
            assert dual == plain["peak"][0]
        elif lay.schedule == "gpipe":  # GPipe keeps every micro-batch, DualPipe P + 1
            assert dual < plain["peak"][0]
        else:  # two stages' states and one more micro-batch than 1F1B's first stage
            assert dual > plain["peak"][0]
    # A table mixing both: each row as alone.
    t = from_configs(lays[1:])
    both = memory.peak_memory(MIXTRAL, H100, t, dualpipe=True)
    for i, lay in enumerate(lays[1:]):
        alone = memory.peak_memory(MIXTRAL, H100, from_configs([lay]), dualpipe=True)
        assert both["peak"][i] == pytest.approx(alone["peak"][0])
        assert both["stage"][i] == alone["stage"][0]


@pytest.mark.parametrize("pp", [2, 4, 8, 16])
def test_dualpipe_in_flight_counts_follow_its_schedule(pp):
    """Replays dualpipe.py's ``step`` (steps 1 to 4's first ``F0``) counting the chunks each
    phase holds: step 1 ``2(P/2 − h − 1)`` forwards of phase 0, step 2 ``h + 1`` forwards of
    each phase, step 3 ``P/2 − h − 1`` times B1 then F1, then F0: the peak, ``P + 1`` in all."""
    half = pp // 2
    for rank in range(pp):
        h = min(rank, pp - 1 - rank)
        f0 = 2 * (half - h - 1) + (h + 1) + 1
        f1 = (h + 1) - (half - h - 1) + (half - h - 1)
        got = moe.dualpipe_in_flight(pp, 4 * pp, moe.dualpipe_stages(pp, rank)[0])
        assert (int(got[0]), int(got[1])) == (f0, f1)
        assert f0 + f1 == pp + 1
        stages = sorted(int(s) for s in moe.dualpipe_stages(pp, rank))
        assert stages == sorted((rank, pp - 1 - rank))
