"""Step time: the breakdown adds up, each term responds to its knob as the formulas say, and the
vectorized path equals the scalar one."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from frontier_llm.catalog import load_model, load_system
from frontier_llm.costmodel import TIME_PARTS, evaluate, predict
from frontier_llm.costmodel.behaviour import bf16_optimizer, reduces_fp32
from frontier_llm.costmodel.comm import (
    all_gather,
    all_reduce,
    link_for_span,
    reduce_scatter,
    send_recv,
)
from frontier_llm.costmodel.layouts import from_configs
from frontier_llm.costmodel.params import stage_params_per_rank
from frontier_llm.costmodel.steptime import (
    HP_GRAD_ACCUMULATE_BYTES,
    LP_GRAD_ACCUMULATE_BYTES,
    LP_GRAD_CAST_BYTES,
    deepspeed_pipe_p2p,
)
from frontier_llm.planner import SearchSpace, plan
from frontier_llm.specs.parallel import ParallelConfig


def _ideal(system):
    """The system with perfect efficiencies and no overlap, so formulas can be checked exactly."""
    return dataclasses.replace(system, efficiency={}, matmul_half_hidden=0.0,
                               layer_overhead_s=0.0)


def test_breakdown_sums_to_step_time():
    m, s = load_model("gpt-175b"), load_system("frontier")
    p = predict(m, s, ParallelConfig(tp=8, pp=16, dp=8, global_batch=1024, sharding=1,
                                     schedule="interleaved", virtual_stages=2,
                                     sequence_parallel=True, recompute="selective"))
    assert sum(p["breakdown"]["time_s"].values()) == pytest.approx(p["step_time_s"], rel=1e-9)
    assert all(v >= 0 for v in p["breakdown"]["time_s"].values())


def test_single_gpu_compute_is_flops_over_peak():
    m, s = load_model("gpt3-1.3b"), _ideal(load_system("dgx-a100"))
    p = predict(m, s, ParallelConfig(global_batch=8, micro_batch=8))
    t = p["breakdown"]["time_s"]
    assert t["tp_comm"] == t["pp_comm"] == t["pp_bubble"] == t["dp_comm"] == 0
    from frontier_llm.costmodel.flops import model_flops

    flops = model_flops(m, 8 * m.seq_len)
    # Matrix work (blocks + output layer) at peak.
    matrix = t["compute"] + 3 * 2 * m.hidden * m.vocab * 8 * m.seq_len / s.peak("bf16")
    assert matrix == pytest.approx(flops / s.peak("bf16"), rel=1e-9)


def test_full_recompute_adds_one_forward():
    m, s = load_model("gpt-22b"), load_system("dgx-a100")
    base = dict(tp=8, global_batch=4, micro_batch=4, sequence_parallel=True)
    none = predict(m, s, ParallelConfig(**base))["breakdown"]["time_s"]
    full = predict(m, s, ParallelConfig(recompute="full", **base))["breakdown"]["time_s"]
    forward = (none["compute"] + none["elementwise"]) / 3
    assert full["recompute"] == pytest.approx(forward, rel=1e-9)
    assert full["tp_comm"] == pytest.approx(none["tp_comm"] * 1.5, rel=1e-9)  # 6 vs 4 all-reduces


def test_bubble_follows_narayanan():
    m, s = load_model("gpt-175b"), _ideal(load_system("dgx-a100"))
    for schedule, v in (("1f1b", 1), ("interleaved", 2), ("interleaved", 4)):
        cfg = ParallelConfig(tp=8, pp=8, micro_batch=1, global_batch=32, schedule=schedule,
                             virtual_stages=v)
        t = predict(m, s, cfg)["breakdown"]["time_s"]
        per_mb = (t["compute"] + t["elementwise"] + t["tp_comm"] + t["pp_comm"]) / 32
        # (p-1)/v stage-times of a micro-batch, the average stage carrying 1/p of the head.
        assert t["pp_bubble"] == pytest.approx(7 / v * (per_mb + t["head"] / 32 / 8), rel=1e-9)


def test_collectives_follow_alpha_beta():
    s = _ideal(load_system("frontier"))
    pkg, node, net = s.links["package"], s.links["node"], s.links["network"]
    assert link_for_span(s, 2)[0] == pkg.bandwidth
    assert link_for_span(s, 8)[0] == node.bandwidth
    assert link_for_span(s, 9)[0] == net.bandwidth
    n, nbytes = 8, 1e9
    assert all_reduce(s, n, 1, nbytes) == pytest.approx(
        2 * 7 / 8 * nbytes / node.bandwidth + 14 * node.latency)
    assert reduce_scatter(s, n, 1, nbytes) == pytest.approx(all_reduce(s, n, 1, nbytes) / 2)
    assert all_reduce(s, 1, 1, nbytes) == 0
    # Eight ranks 8 apart cross nodes: the network bounds them.
    assert all_reduce(s, 8, 8, nbytes) > all_reduce(s, 8, 1, nbytes)
    assert send_recv(s, 8, nbytes) == pytest.approx(nbytes / net.bandwidth + net.latency)


def test_a_network_without_rails_gives_every_group_one_nics_rate():
    """A DP group with 2 members a node (TP 4 on 8-GPU nodes) runs 2 rails on a DGX's one HCA
    per GPU; with the network's ``rails: false`` (Omni-Path on Jean Zay, specs/system.py
    LinkTier) it keeps one NIC's rate, as TP-strided groups of one member a node always do. The
    field loads from a system file like the others."""
    import yaml

    from frontier_llm.catalog import SYSTEMS_DIR, system_from_mapping

    dgx = load_system("dgx-a100")
    net = dgx.link("network")
    opa = dataclasses.replace(dgx, links={**dgx.links, "network": dataclasses.replace(
        net, rails=False)})
    eff = dgx.eff("collective")
    assert link_for_span(dgx, 32, 4)[0] == pytest.approx(2 * net.bandwidth * eff)
    assert link_for_span(opa, 32, 4)[0] == pytest.approx(net.bandwidth * eff)
    assert link_for_span(opa, 64, 8)[0] == link_for_span(dgx, 64, 8)[0]  # one member a node
    assert all_reduce(opa, 8, 4, 1e9, rails=True) > 1.9 * all_reduce(dgx, 8, 4, 1e9, rails=True)
    assert dgx.link("network").rails
    raw = yaml.safe_load((SYSTEMS_DIR / "dgx-a100.yaml").read_text())
    raw["links"]["network"]["rails"] = False
    assert not system_from_mapping(raw).link("network").rails


def test_tp_inside_a_node_beats_tp_across_nodes():
    m, s = load_model("gpt-175b"), load_system("frontier")
    inside = predict(m, s, ParallelConfig(tp=8, pp=16, dp=2, global_batch=64))
    across = predict(m, s, ParallelConfig(tp=16, pp=8, dp=2, global_batch=64))
    assert across["breakdown"]["time_s"]["tp_comm"] > 3 * inside["breakdown"]["time_s"][
        "tp_comm"]


def test_zero3_gathers_parameters_every_micro_batch():
    m, s = load_model("gpt-22b"), load_system("frontier")
    base = dict(tp=8, dp=16, micro_batch=1)
    few = predict(m, s, ParallelConfig(global_batch=16, sharding=3, **base))
    many = predict(m, s, ParallelConfig(global_batch=128, sharding=3, **base))
    z1 = predict(m, s, ParallelConfig(global_batch=128, sharding=1, **base))
    # flm bench's accumulation reduce-scatters once (after the last micro-batch), so 8
    # micro-batches cost 8 gathers and one reduction; torchtitan's reduce-scatters each time.
    each = predict(m, s, ParallelConfig(global_batch=128, sharding=3, **base), grad_sync=True)
    assert many["breakdown"]["time_s"]["dp_comm"] > 3 * few["breakdown"]["time_s"]["dp_comm"]
    assert each["breakdown"]["time_s"]["dp_comm"] > 4 * few["breakdown"]["time_s"]["dp_comm"]
    assert many["breakdown"]["time_s"]["dp_comm"] > z1["breakdown"]["time_s"]["dp_comm"]


def test_vectorized_equals_scalar_for_every_layout():
    m, s = load_model("gpt-22b"), load_system("frontier")
    result = plan(m, s, 64, 128, SearchSpace(micro_batch=(1, 2)))
    idx = np.flatnonzero(result.reason == 0)[::37]
    assert len(idx) > 20
    for i in idx:
        scalar = predict(m, s, result.layout(int(i)))
        assert scalar["step_time_s"] == pytest.approx(result.figures["step_time_s"][i], rel=1e-12)
        assert scalar["peak_memory_bytes"] == pytest.approx(
            result.figures["peak_memory_bytes"][i], rel=1e-12)


def test_mfu_and_hfu_relation():
    m, s = load_model("gpt-175b"), load_system("dgx-a100")
    t = from_configs([ParallelConfig(tp=8, pp=8, global_batch=64, recompute="full")])
    f = evaluate(m, s, t)
    assert f["hfu"][0] / f["mfu"][0] == pytest.approx(
        1 + (m.layers * sum(_layer(m))) / (3 * (m.layers * sum(_layer(m)) + 2 * m.hidden
                                                 * m.vocab)), rel=1e-9)
    assert set(TIME_PARTS) <= {k[5:-2] for k in f if k.startswith("time_")}


def _layer(m):
    from frontier_llm.costmodel.flops import layer_forward_flops_per_token

    return layer_forward_flops_per_token(m)


def test_tp_comm_overlap_only_where_the_run_turns_it_on():
    """Megatron-LM hides TP collectives behind its GEMMs only with --tp-comm-overlap (the
    README's H100 runs); flm's Megatron-LM command does not set it, so by default they show."""
    m, s = load_model("gpt-175b"), load_system("dgx-h100")
    table = from_configs([ParallelConfig(tp=4, pp=8, dp=32, global_batch=2048, sharding=1,
                                         sequence_parallel=True, engine="megatron")])
    off = evaluate(m, s, table)
    on = evaluate(m, s, table, tp_comm_overlap=True)
    assert on["time_tp_comm_s"][0] < 0.5 * off["time_tp_comm_s"][0]
    assert on["step_time_s"][0] < off["step_time_s"][0]


def test_predict_takes_tp_comm_overlap_where_megatron_runs_it_and_refuses_it_elsewhere():
    """costmodel.predict's ``tp_comm_overlap`` (flm predict --tp-comm-overlap) is evaluate's
    on Megatron with sequence parallelism; without it Megatron-LM's validate_args asserts
    (309ffca), and on another engine it changes nothing: both refused, not priced."""
    from frontier_llm.errors import UserError
    from frontier_llm.specs.layout import Layout

    m, s = load_model("gpt-175b"), load_system("dgx-h100")
    cfg = dict(tp=4, pp=8, dp=8, global_batch=2048, micro_batch=2, sharding=1,
               sequence_parallel=True, engine="megatron")
    want = evaluate(m, s, from_configs([ParallelConfig(**cfg)]), tp_comm_overlap=True)
    got = predict(m, s, Layout.from_dict({**cfg, "dtype": "bf16"}), tp_comm_overlap=True)
    assert got["step_time_s"] == pytest.approx(want["step_time_s"][0], rel=1e-12)
    assert got["step_time_s"] < predict(m, s, Layout.from_dict({**cfg, "dtype": "bf16"})
                                        )["step_time_s"]
    for other in ({**cfg, "sequence_parallel": False}, {**cfg, "engine": "native"}):
        with pytest.raises(UserError, match="Megatron-LM with sequence parallelism only"):
            predict(m, s, Layout.from_dict({**other, "dtype": "bf16"}), tp_comm_overlap=True)

def test_p2p_overlap_hides_interleaved_sends_behind_compute():
    """Megatron-Core's overlap_p2p_comm (NeMo's MLPerf configs) overlaps an interleaved
    schedule's sends with the chunks' compute: with a send longer than its compute only the
    excess shows; a plain 1F1B schedule and DeepSpeed's pipeline are unchanged; off (flm's
    default) every send shows."""
    m, s = load_model("gpt-175b"), load_system("dgx-h100")
    cfg = dict(tp=4, pp=8, dp=8, global_batch=2048, micro_batch=2, sharding=1,
               sequence_parallel=True, engine="megatron")
    inter = from_configs([ParallelConfig(schedule="interleaved", virtual_stages=6, **cfg)])
    off = evaluate(m, s, inter)
    on = evaluate(m, s, inter, p2p_overlap=True)
    assert off["time_pp_comm_s"][0] > 0.5  # GPT-3 175B on 256 H100: about 0.9 s a step
    assert on["time_pp_comm_s"][0] == 0.0  # a chunk's compute outlasts its sends here
    # The step loses the sends, and the bubble (counted in chunk times, sends included) the
    # sends' share of it.
    assert on["time_pp_bubble_s"][0] < off["time_pp_bubble_s"][0]
    assert on["step_time_s"][0] == pytest.approx(
        off["step_time_s"][0] - off["time_pp_comm_s"][0]
        - (off["time_pp_bubble_s"][0] - on["time_pp_bubble_s"][0]), rel=1e-9)
    # A slow link: the sends outlast the compute, and only the excess is hidden.
    slow = dataclasses.replace(s, links={k: dataclasses.replace(v, bandwidth=v.bandwidth / 1e4)
                                         for k, v in s.links.items()})
    slow_off, slow_on = (evaluate(m, slow, inter, p2p_overlap=o) for o in (False, True))
    hidden = slow_off["time_pp_comm_s"][0] - slow_on["time_pp_comm_s"][0]
    assert 0 < hidden < slow_off["time_pp_comm_s"][0]
    plain = from_configs([ParallelConfig(**cfg)])
    assert evaluate(m, s, plain, p2p_overlap=True)["step_time_s"][0] == evaluate(
        m, s, plain)["step_time_s"][0]
    ds = from_configs([ParallelConfig(**{**cfg, "engine": "deepspeed",
                                         "sequence_parallel": False})])
    assert evaluate(m, s, ds, p2p_overlap=True)["step_time_s"][0] == evaluate(
        m, s, ds)["step_time_s"][0]


def test_deepspeed_pipeline_reduces_after_the_flush():
    """DeepSpeed's PipelineEngine reduces gradients after the pipeline drains (nothing behind a
    backward); a run stating fp32 accumulation at ZeRO-1 (BF16_Optimizer) reduces fp32 copies
    and adds each micro-batch's gradients into them (reduce_fp32=True), with or without a
    pipeline: the plain engine calls ``backward_epilogue`` -> ``update_hp_grads`` after every
    backward too (DeepSpeed 0.19.8 runtime/engine.py ``_backward_epilogue``)."""
    m, s = load_model("gpt-22b"), load_system("dgx-a100")
    cfg = dict(tp=4, dp=8, global_batch=256, sharding=1, engine="deepspeed")
    pipe = evaluate(m, s, from_configs([ParallelConfig(pp=4, **cfg)]))
    bf16_opt = evaluate(m, s, from_configs([ParallelConfig(pp=4, **cfg)]), reduce_fp32=True)
    assert bf16_opt["time_dp_comm_s"][0] > 1.5 * pipe["time_dp_comm_s"][0]
    assert bf16_opt["time_optimizer_s"][0] > 10 * pipe["time_optimizer_s"][0]
    flat_cfg = ParallelConfig(pp=1, **{**cfg, "tp": 8, "dp": 4})
    flat = evaluate(m, s, from_configs([flat_cfg]))
    flat_mb = evaluate(m, s, from_configs([flat_cfg]), reduce_fp32=True)
    n_stage = stage_params_per_rank(m, 8, 1, 0)
    accumulate = (256 // 4) * n_stage * HP_GRAD_ACCUMULATE_BYTES / (
        s.memory_bandwidth * s.eff("memory"))
    assert flat_mb["time_optimizer_s"][0] - flat["time_optimizer_s"][0] == pytest.approx(
        accumulate)


def test_deepspeed_picks_bf16_optimizer_for_an_unstated_bf16_pipeline_at_zero0():
    """A plan that states nothing runs what DeepSpeed picks (0.19.8 runtime/engine.py
    ``_do_optimizer_sanity_check``): bf16 with a pipeline and no ZeRO is BF16_Optimizer. Its
    accumulator is ``grad_acc_dtype``, bf16 as flm exports the config (runtime/bf16_optimizer.py
    l.191, engine.py ``get_data_types``), so each micro-batch costs (m + p - 1) x the stage's
    parameters x 8 bytes at the memory rate, the step casts the 1/dp partition to fp32 and steps
    Adam on it only, the whole accumulator is all-reduced in bf16 and the updated bf16 partitions
    are all-gathered over dp (``update_lp_params``); a run stating fp32 (reduce_fp32 True, the
    BigScience era's hard-coded fp32 buffer) pays 20 bytes a micro-batch and reduces in fp32.
    ZeRO-1, fp16 and pp 1 keep the ZeRO / fp16 / DDP paths."""
    m, s = load_model("gpt-22b"), load_system("dgx-a100")
    dp, tp, pp = 8, 4, 4
    cfg = dict(tp=tp, dp=dp, pp=pp, global_batch=256, engine="deepspeed")

    def run(reduce_fp32=None, **kw):
        return evaluate(m, s, from_configs([ParallelConfig(**{**cfg, **kw})]),
                        reduce_fp32=reduce_fp32)

    rule, stated, off = run(sharding=0), run(True, sharding=0), run(False, sharding=0)
    # Unstated is DeepSpeed's default, bf16 accumulation: what a run stating bf16 gets.
    for key in ("step_time_s", "time_dp_comm_s", "time_optimizer_s", "mem_grads_bytes"):
        assert rule[key][0] == off[key][0]
    # Memory: the accumulator is 2 B unstated, 4 B where the run states fp32
    # (costmodel/memory.py ``bf16_optimizer_states``): the same dtype rule as the time.
    assert stated["mem_grads_bytes"][0] == pytest.approx(1.5 * rule["mem_grads_bytes"][0])
    m_b = 256 // dp
    n_stage = max(stage_params_per_rank(m, tp, pp, r) for r in range(pp))
    rate = s.memory_bandwidth * s.eff("memory")
    assert (HP_GRAD_ACCUMULATE_BYTES, LP_GRAD_ACCUMULATE_BYTES, LP_GRAD_CAST_BYTES) == (20, 8, 6)
    extra = ((m_b + pp - 1) * n_stage * (HP_GRAD_ACCUMULATE_BYTES - LP_GRAD_ACCUMULATE_BYTES)
             - np.ceil(n_stage / dp) * LP_GRAD_CAST_BYTES) / rate
    assert stated["time_optimizer_s"][0] - rule["time_optimizer_s"][0] == pytest.approx(extra)
    assert stated["time_dp_comm_s"][0] > 1.5 * rule["time_dp_comm_s"][0]  # fp32, not bf16
    # fp16 at ZeRO 0 is DeepSpeed's FP16 optimizer: the same 2-byte all-reduce, Adam over the
    # whole stage, no accumulator, no gather. BF16_Optimizer adds the bf16 all-gather of the
    # updated partitions over dp (exposed: inside the step) ...
    fp16 = run(sharding=0, dtype="fp16")
    gather = all_gather(s, dp, tp, n_stage * 2, True)
    assert rule["time_dp_comm_s"][0] - fp16["time_dp_comm_s"][0] == pytest.approx(gather)
    # ... and steps Adam on its 1/dp partition (cast to fp32 first) after accumulating.
    adam_bytes = 2 + 4 + 12 + 2 + 12
    assert rule["time_optimizer_s"][0] == pytest.approx(
        (np.ceil(n_stage / dp) * (adam_bytes + LP_GRAD_CAST_BYTES)
         + (m_b + pp - 1) * n_stage * LP_GRAD_ACCUMULATE_BYTES) / rate)
    assert fp16["time_optimizer_s"][0] == pytest.approx(n_stage * adam_bytes / rate)
    # ZeRO-1 with the default grad_accum_dtype: DeepSpeed's ZeRO optimizer, unchanged.
    zero1, zero1_off = run(sharding=1), run(False, sharding=1)
    assert zero1["step_time_s"][0] == zero1_off["step_time_s"][0]
    assert zero1["time_optimizer_s"][0] < rule["time_optimizer_s"][0]
    # Without a pipeline bf16 at ZeRO 0 is DDP_BFLOAT16: no accumulation priced.
    flat = dict(pp=1, tp=8, dp=4)
    assert run(sharding=0, **flat)["time_optimizer_s"][0] == pytest.approx(
        run(False, sharding=0, **flat)["time_optimizer_s"][0])


def test_bf16_optimizer_rule_row_by_row():
    """One table, one answer per row: only DeepSpeed + bf16 + pp > 1 + nothing sharded (ZeRO-1
    over one rank is still the ZeRO optimizer); a stated reduce_fp32 overrides every row."""
    rows = [dict(engine="deepspeed", pp=4, dp=2, sharding=0),
            dict(engine="deepspeed", pp=4, dp=2, sharding=1),
            dict(engine="deepspeed", pp=4, dp=1, sharding=1),
            dict(engine="deepspeed", pp=4, dp=2, sharding=0, dtype="fp16"),
            dict(engine="deepspeed", pp=1, dp=8, sharding=0),
            dict(engine="megatron", pp=4, dp=2, sharding=0),
            dict(engine="native", pp=4, dp=2, sharding=0)]
    t = from_configs([ParallelConfig(global_batch=16, **r) for r in rows])
    assert bf16_optimizer(t).tolist() == [True, False, False, False, False, False, False]
    # BF16_Optimizer reduces its accumulator in DeepSpeed's default bf16; Megatron and the native
    # engine reduce in fp32 by their own rules.
    assert reduces_fp32(t).tolist() == [False, False, False, False, False, True, True]
    assert reduces_fp32(t, False).tolist() == [False] * len(rows)
    assert reduces_fp32(t, True).tolist() == [True] * len(rows)


def test_deepspeed_pipeline_exchanges_four_blocking_messages_and_rebuilds_its_slices():
    """DeepSpeed's TrainSchedule sends and receives one message after another (blocking
    p2p.send/recv): four messages a micro-batch on a middle stage where Megatron-LM's 1F1B
    exchanges two pairs at once; each is a 1/t slice, rebuilt by three TP all-gathers
    (PartitionedTensor.full(): the input, the stage's output and the gradient)."""
    m, s = load_model("gpt-175b"), _ideal(load_system("dgx-a100"))
    cfg = dict(tp=8, pp=8, dp=1, micro_batch=1, global_batch=32, sharding=1)
    ds = predict(m, s, ParallelConfig(engine="deepspeed", **cfg))["breakdown"]["time_s"]
    mg = predict(m, s, ParallelConfig(engine="megatron", **cfg))["breakdown"]["time_s"]
    full = m.seq_len * m.hidden * 2  # one micro-batch's b·s·h in bf16
    message = send_recv(s, 8 * 1, full / 8)  # pipeline neighbours are tp = 8 ranks apart
    gather = reduce_scatter(s, 8, 1, full)  # an all-gather producing b·s·h over the TP group
    assert mg["pp_comm"] == pytest.approx(32 * 2 * message, rel=1e-9)
    # The last stage (with the head) sets the pace: it receives an input and a gradient's worth
    # less (two messages, one rebuild); a middle stage would take four and three.
    assert ds["head"] > 0
    assert ds["pp_comm"] == pytest.approx(32 * (2 * message + gather), rel=1e-9)
    table = from_configs([ParallelConfig(engine="deepspeed", **cfg)])
    middle, last = deepspeed_pipe_p2p(s, table, message, full)
    assert middle[0] == pytest.approx(4 * message + 3 * gather, rel=1e-9)
    assert last[0] == pytest.approx(2 * message + gather, rel=1e-9)


def test_gpt175b_on_dgx_h100_within_published_megatron_mfu():
    """The planner's best Megatron-LM layout for GPT-3 175B on 1,024 H100s (NVIDIA's own bf16
    recipe's shape: NeMo-Framework-Launcher conf/training/gpt3/175b.yaml, TP 4, PP 8, no TP
    overlap) lands in the published range of Megatron bf16 MFU on H100 (the Megatron-LM
    README's table: 41-49 %)."""
    result = plan(load_model("gpt-175b"), load_system("dgx-h100"), 1024,
                  space=SearchSpace(engine=("megatron",)))
    best = int(result.ranked_indices(1)[0])
    assert 0.41 <= result.figures["mfu"][best] <= 0.49


def test_predict_takes_p2p_overlap_where_it_acts_and_refuses_it_elsewhere():
    """costmodel.predict's ``p2p_overlap`` (flm predict --overlap-p2p-comm) is evaluate's on
    Megatron's interleaved schedule; on any other layout it would change nothing, so it is
    refused rather than priced as if it had done something."""
    from frontier_llm.errors import UserError
    from frontier_llm.specs.layout import Layout

    m, s = load_model("gpt-175b"), load_system("dgx-h100")
    cfg = dict(tp=4, pp=8, dp=8, global_batch=2048, micro_batch=2, sharding=1,
               sequence_parallel=True, engine="megatron")
    inter = dict(schedule="interleaved", virtual_stages=6, **cfg)
    want = evaluate(m, s, from_configs([ParallelConfig(**inter)]), p2p_overlap=True)
    got = predict(m, s, Layout.from_dict({**inter, "dtype": "bf16"}), p2p_overlap=True)
    assert got["step_time_s"] == pytest.approx(want["step_time_s"][0], rel=1e-12)
    assert got["step_time_s"] < predict(m, s, Layout.from_dict({**inter, "dtype": "bf16"})
                                        )["step_time_s"]
    for other in (cfg, {**inter, "engine": "native"}):
        with pytest.raises(UserError, match="interleaved schedule only"):
            predict(m, s, Layout.from_dict({**other, "dtype": "bf16"}), p2p_overlap=True)
