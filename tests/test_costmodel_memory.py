"""Per-rank memory: parameter split, ZeRO/AMSP sharding, and Korthikanti et al.'s activation
formulas reproduced term by term."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from frontier_llm.catalog import load_model, load_system
from frontier_llm.costmodel import evaluate
from frontier_llm.costmodel.layouts import from_configs
from frontier_llm.costmodel.memory import (
    activation_bytes,
    activation_parts,
    layer_activation_bytes,
    rank_memory,
    rank_state_bytes,
)
from frontier_llm.costmodel.params import stage_params_per_rank
from frontier_llm.specs.parallel import ParallelConfig, Sharding


def _gpt175_dropout():
    return dataclasses.replace(load_model("gpt-175b"), dropout=0.1)


# Korthikanti et al. 2022, Table 2 (16-bit, per layer, bytes / (s·b·h)).
@pytest.mark.parametrize(
    ("layout", "formula"),
    [
        (dict(tp=1), lambda a, s, h, t: 34 + 5 * a * s / h),
        (dict(tp=8), lambda a, s, h, t: 10 + 24 / t + 5 * a * s / (h * t)),
        (dict(tp=8, sequence_parallel=True), lambda a, s, h, t: (34 + 5 * a * s / h) / t),
        (dict(tp=8, sequence_parallel=True, recompute="selective"), lambda a, s, h, t: 34 / t),
    ],
)
def test_layer_activations_match_korthikanti(layout, formula):
    m = _gpt175_dropout()
    cfg = ParallelConfig(flash_attention=False, engine="megatron", **layout)
    got = layer_activation_bytes(m, from_configs([cfg]))[0]
    expected = m.seq_len * m.hidden * formula(m.heads, m.seq_len, m.hidden, cfg.tp)
    # The only addition to the paper's count: fp32 norm statistics (8 bytes per token per norm).
    assert got == pytest.approx(expected, rel=2e-4)
    assert got >= expected


def test_flash_attention_drops_the_score_terms():
    m = _gpt175_dropout()
    unfused = layer_activation_bytes(m, from_configs([ParallelConfig(flash_attention=False)]))[0]
    fused = layer_activation_bytes(m, from_configs([ParallelConfig(flash_attention=True)]))[0]
    s, a = m.seq_len, m.heads
    assert unfused - fused == pytest.approx(5 * a * s * s, rel=1e-3)


def test_full_recompute_keeps_layer_inputs_only():
    m = _gpt175_dropout()
    cfg = ParallelConfig(tp=8, pp=4, micro_batch=1, global_batch=16, recompute="full",
                         sequence_parallel=True, engine="megatron")
    t = from_configs([cfg])
    stored = activation_bytes(m, t, 1)[0]  # a middle stage: no embedding or logits
    per_layer = 2 * m.seq_len * m.hidden / 8
    full_layer = layer_activation_bytes(m, t)[0]
    in_flight = 4 - 1  # 1F1B: p - r micro-batches on stage r
    # The layer being rebuilt holds its full activations, its stored input among them.
    assert stored == pytest.approx(in_flight * (m.layers // 4) * per_layer + full_layer - per_layer)


def test_last_stage_logits_and_a_rebuilt_layer_are_not_alive_together():
    m = load_model("gpt-22b")
    cfg = ParallelConfig(tp=8, micro_batch=1, global_batch=1, recompute="full",
                         sequence_parallel=True, engine="megatron")
    t = from_configs([cfg])
    e, s, h = 2, m.seq_len, m.hidden
    stored = m.layers * s * h * e / 8
    logits = 4 * s * m.vocab / 8
    total = activation_bytes(m, t, 0)[0]  # pp = 1: the only stage is first and last
    rebuilt = layer_activation_bytes(m, t)[0] - s * h * e / 8
    assert total < stored + rebuilt + logits
    assert total >= stored + max(rebuilt, logits)


def test_native_sequence_parallel_saves_gathered_linear_inputs():
    """PyTorch's DTensor SP keeps the gathered input of QKV and fc1; Megatron keeps 1/t."""
    m = load_model("gpt-22b")
    megatron = layer_activation_bytes(m, from_configs([ParallelConfig(
        tp=8, sequence_parallel=True, engine="megatron")]))[0]
    native = layer_activation_bytes(m, from_configs([ParallelConfig(
        tp=8, sequence_parallel=True, engine="native")]))[0]
    assert native - megatron == pytest.approx(2 * 2 * m.seq_len * m.hidden * (1 - 1 / 8))


def test_schedules_keep_the_micro_batches_the_papers_say():
    m = load_model("gpt-22b")
    base = dict(tp=1, pp=4, dp=1, micro_batch=1, global_batch=16, flash_attention=True)
    per_stage = {}
    for name, extra in [("gpipe", dict(schedule="gpipe")), ("1f1b", dict(schedule="1f1b")),
                        ("il2", dict(schedule="interleaved", virtual_stages=2))]:
        t = from_configs([ParallelConfig(**base, **extra)])
        per_stage[name] = [activation_bytes(m, t, r)[0] for r in range(4)]
    layer = layer_activation_bytes(m, from_configs([ParallelConfig(**base)]))[0]
    stage_layers = m.layers // 4
    # Stage 1 has neither embeddings nor logits: 1F1B keeps p - r = 3 micro-batches, GPipe all 16,
    # each with the input the stage received (the native engine's, measured by flm memcheck).
    received = m.seq_len * m.hidden * 2  # one bf16 micro-batch of hidden states
    assert per_stage["1f1b"][1] == pytest.approx(3 * (stage_layers * layer + received))
    assert per_stage["gpipe"][1] == pytest.approx(16 * (stage_layers * layer + received))
    # Interleaving on the first stage: p·(1 + (p−1)/(p·v)) micro-batches of a whole stage.
    first_il = per_stage["il2"][0] - (per_stage["1f1b"][0] - 4 * stage_layers * layer)
    # (up to the token ids and embedding dropout masks of the micro-batches in flight: 0.1 %)
    assert first_il == pytest.approx(4 * (1 + 3 / 8) * stage_layers * layer, rel=2e-3)
    assert per_stage["1f1b"][0] > per_stage["1f1b"][2]


def test_stage_params_sum_to_the_model():
    for name in ("gpt-22b", "llama3-70b", "tiny-llama"):
        m = dataclasses.replace(load_model(name), tied_embeddings=False)
        total = sum(int(stage_params_per_rank(m, 1, 4, r)) for r in range(4))
        assert total == m.num_params()


def test_tensor_parallel_ranks_hold_the_split_plus_replicated_parts():
    m = load_model("gpt-22b")
    tp1 = int(stage_params_per_rank(m, 1, 1, 0))
    tp8 = int(stage_params_per_rank(m, 8, 1, 0))
    replicated = m.layers * (4 * m.hidden + 2 * m.hidden) + m.seq_len * m.hidden + 2 * m.hidden
    assert 8 * (tp8 - replicated) == tp1 - replicated


@pytest.mark.parametrize(
    ("zero", "divided"),
    [(0, ()), (1, ("optimizer",)), (2, ("optimizer", "grads")),
     (3, ("optimizer", "grads", "params"))],
)
def test_zero_stages_divide_the_right_states(zero, divided):
    m = load_model("gpt-22b")
    # DeepSpeed runs every ZeRO stage and keeps the ZeRO paper's fp32 gradients in bf16.
    base = rank_state_bytes(m, ParallelConfig(dp=8, global_batch=8, sharding=0,
                                              engine="deepspeed"), 0)
    got = rank_state_bytes(m, ParallelConfig(dp=8, global_batch=8, sharding=zero,
                                             engine="deepspeed"), 0)
    for part in ("params", "grads", "optimizer"):
        factor = 8 if part in divided else 1
        assert got[f"{part}_bytes"] == pytest.approx(base[f"{part}_bytes"] / factor, rel=1e-6)
    assert base["params_bytes"] + base["grads_bytes"] + base["optimizer_bytes"] == \
        18 * m.num_params()  # bf16: 2 + 4 + 12 bytes per parameter


def test_bf16_optimizer_states_are_what_deepspeed_allocates():
    """DeepSpeed's BF16_Optimizer (deepspeed/runtime/bf16_optimizer.py, DeepSpeed 0.19.8;
    costmodel/memory.py ``bf16_optimizer_states``), where DeepSpeed picks it for an unstated bf16
    pipeline at ZeRO 0 (costmodel/behaviour.py ``bf16_optimizer``): the bf16 ``.grad`` (2 B,
    zeroed, not freed, by ``clear_lp_grads``) beside a whole accumulator in the model's dtype
    (``fp32_groups_gradients_flat``, ``grad_acc_dtype`` bf16 with flm's config: 2 B), and the
    fp32 master and Adam's moments over the dp ranks (``fp32_groups_flat_partition``: 12/dp B).
    A stated fp32 reduction makes the accumulator fp32 (4 B), at ZeRO 0 and, as DeepSpeed then
    picks BF16_Optimizer there too (``_do_optimizer_sanity_check``), at ZeRO-1. fp16, pp 1 and an
    unstated ZeRO-1 keep their paths. tests/test_bench_deepspeed.py measures the real ones."""
    m, s = load_model("gpt-22b"), load_system("dgx-a100")
    cfg = dict(tp=4, dp=8, pp=4, global_batch=256, engine="deepspeed", sharding=0)
    bf16 = rank_state_bytes(m, ParallelConfig(**cfg), 0)
    n = bf16["count_bytes"]
    assert bf16["params_bytes"] == 2 * n
    assert bf16["grads_bytes"] == (2 + 2) * n
    assert bf16["optimizer_bytes"] == 12 * -(-n // 8)
    fp16 = rank_state_bytes(m, ParallelConfig(**cfg, dtype="fp16"), 0)
    assert (fp16["grads_bytes"], fp16["optimizer_bytes"]) == (2 * n, 12 * n)
    no_pipe = rank_state_bytes(m, ParallelConfig(**{**cfg, "pp": 1}), 0)
    assert no_pipe["optimizer_bytes"] == 12 * no_pipe["count_bytes"]
    t = from_configs([ParallelConfig(**cfg)])
    rule, fp32 = evaluate(m, s, t), evaluate(m, s, t, reduce_fp32=True)
    assert rule["mem_grads_bytes"][0] == 4 * n
    assert fp32["mem_grads_bytes"][0] == 6 * n
    assert rule["mem_optimizer_bytes"][0] == fp32["mem_optimizer_bytes"][0] == 12 * -(-n // 8)
    z1 = from_configs([ParallelConfig(**{**cfg, "sharding": 1})])
    plain, stated = evaluate(m, s, z1), evaluate(m, s, z1, reduce_fp32=True)
    assert plain["mem_grads_bytes"][0] == 4 * n
    assert stated["mem_grads_bytes"][0] == 6 * n
    assert plain["mem_optimizer_bytes"][0] == stated["mem_optimizer_bytes"][0]


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_native_states_are_what_flm_bench_holds(zero):
    """flm bench's native engine keeps gradients in the parameters' dtype (2 + 2 + 12 bytes
    per parameter in bf16) and, from ZeRO-2 on, stores FSDP2's parameter shard (ZeRO-2's whole
    parameters are a gathered copy, a buffer): what flm memcheck measures
    (tests/test_memcheck_grid.py)."""
    m = load_model("gpt-22b")
    got = rank_state_bytes(m, ParallelConfig(dp=8, global_batch=8, sharding=zero), 0)
    n = m.num_params()
    shard = 8 if zero >= 2 else 1
    assert got["params_bytes"] == pytest.approx(2 * n / shard, rel=1e-6)
    assert got["grads_bytes"] == pytest.approx(2 * n / shard, rel=1e-6)
    assert got["optimizer_bytes"] == pytest.approx(12 * n / (8 if zero >= 1 else 1), rel=1e-6)


def test_partial_sharding_divides_by_the_group():
    m = load_model("gpt-22b")
    cfg = ParallelConfig(dp=16, global_batch=16,
                         sharding=Sharding.parse({"params": "partial:4", "optim": "partial:4",
                                                  "grads": "partial:4"}))
    got = rank_state_bytes(m, cfg, 0)
    assert got["optimizer_bytes"] == pytest.approx(12 * m.num_params() / 4, rel=1e-6)
    # HSDP (FSDP2 on a 2-D mesh) stores the parameter shard of its group; the whole parameters
    # it gathers are a buffer.
    assert got["params_bytes"] == pytest.approx(2 * m.num_params() / 4, rel=1e-6)


def test_peak_memory_fits_flag_against_capacity():
    from frontier_llm.costmodel import predict

    m, s = load_model("gpt-175b"), load_system("frontier")
    small = predict(m, s, ParallelConfig(tp=1, pp=1, dp=1))
    assert not small["fits"] and small["peak_memory_bytes"] > 175e9 * 18
    ok = predict(m, s, ParallelConfig(tp=8, pp=16, dp=8, global_batch=1024, sharding=1))
    assert ok["fits"]
    parts = ok["breakdown"]["memory_bytes"]
    assert sum(parts.values()) == pytest.approx(ok["peak_memory_bytes"])
    assert np.isfinite(ok["step_time_s"])


def test_sdpa_kv_heads_are_what_the_fused_kernel_saves():
    """``cp_heads`` (the K/V heads SDPA receives): torchtitan before ff0829c repeats Llama 3's 8
    K/V heads to all 32 query heads before SDPA, and the flash kernel saves its inputs, so a
    block saves 4x the K/V flm counts for the model's kv heads: wherever the block's attention
    inputs are kept (no recompute) or rebuilt (full and op-level recompute: the rebuilt block),
    never in what a recomputed block keeps."""
    m = load_model("llama3-8b")
    base = dict(tp=2, pp=2, dp=1, micro_batch=1, global_batch=8, flash_attention=True)
    # K and V, 24 more heads each, in bf16 (2 bytes), over tp 2.
    extra = 2 * m.seq_len * (32 - m.kv_heads) * m.head_dim * 2 / 2
    for recompute in ("none", "full", "selective-op"):
        t = from_configs([ParallelConfig(**base, recompute=recompute)])
        kv = activation_parts(m, t, 0)
        rep = activation_parts(m, t, 0, cp_heads=32)
        if recompute == "none":
            assert rep["per_layer"][0] - kv["per_layer"][0] == pytest.approx(extra)
            assert rep["transient"][0] == kv["transient"][0] == 0
        else:
            assert rep["per_layer"][0] == kv["per_layer"][0]
            assert rep["transient"][0] - kv["transient"][0] == pytest.approx(extra)
    # The kv heads themselves price as the default.
    t = from_configs([ParallelConfig(**base)])
    assert (activation_parts(m, t, 0, cp_heads=m.kv_heads)["per_layer"]
            == activation_parts(m, t, 0)["per_layer"])


def test_a_native_pipeline_accumulates_gradients_whatever_its_trainer_syncs():
    """torch's PipelineStage turns FSDP2's gradient sync off for every backward
    (torch/distributed/pipelining/stage.py ``backward_maybe_with_nosync``) and reduces after the
    schedule: at pp > 1 a trainer that reduce-scatters every micro-batch (torchtitan's loop,
    grad_sync True) holds the stage's whole unsharded gradients as one that syncs once does, and
    no sharded ones; without a pipeline it keeps only its shard. Where the run states an
    fp32-reducing policy, FSDP2 holds the accumulated gradient in fp32
    (``_fsdp_param.py`` ``to_accumulated_grad_if_needed``): twice the bf16 bytes."""
    model, system = load_model("llama3-8b"), load_system("dgx-h100")

    def terms(pp, grad_sync, reduce_fp32=None):
        t = from_configs([ParallelConfig(pp=pp, dp=4, micro_batch=1, global_batch=32,
                                         sharding=Sharding.parse("zero3"),
                                         recompute="full")])
        got = rank_memory(model, system, t, 0, grad_sync=grad_sync, reduce_fp32=reduce_fp32)
        # The first stage's parameters, whole (an even split: its embedding, half the blocks).
        stage = stage_params_per_rank(model, 1, pp, 0)
        return float(got["buffers"][0]), float(got["grads"][0]), float(stage)

    each, sharded_each, stage = terms(2, True)
    once, sharded_once, _ = terms(2, False)
    assert each == once == pytest.approx(2 * stage, rel=1e-6)  # bf16, whole stage
    assert sharded_each == sharded_once == 0.0
    fp32, _, _ = terms(2, True, reduce_fp32=True)
    assert fp32 == pytest.approx(2 * each)
    flat_each, flat_sharded, flat_stage = terms(1, True)
    assert flat_each == 0.0 and flat_sharded == pytest.approx(2 * flat_stage / 4, rel=1e-3)
