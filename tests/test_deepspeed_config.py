"""The DeepSpeed config is a pure function of the layout; the deepspeed engine's refusals come
before any process starts; its pipeline split is the one the cost model assumes."""

from __future__ import annotations

import pytest

from frontier_llm.bench.deepspeed_config import bucket_elements, deepspeed_config, zero_settings
from frontier_llm.bench.engines import check
from frontier_llm.catalog import load_model
from frontier_llm.costmodel.layouts import from_configs
from frontier_llm.costmodel.memory import rank_state_bytes, state_bytes
from frontier_llm.errors import SpecError, UserError
from frontier_llm.specs.layout import Layout


def ds(**kw) -> Layout:
    return Layout(engine="deepspeed", **kw)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_zero_stage_and_batch_come_from_the_layout(stage):
    cfg = deepspeed_config(ds(dp=4, micro_batch=2, global_batch=32, sharding=stage))
    assert cfg["zero_optimization"]["stage"] == stage
    assert cfg["train_batch_size"] == 32
    assert cfg["train_micro_batch_size_per_gpu"] == 2
    assert cfg["gradient_accumulation_steps"] == 4  # 32 / (2 x 4)
    assert cfg["bf16"]["enabled"] and not cfg["fp16"]["enabled"]
    assert cfg["zero_allow_untested_optimizer"] and "optimizer" not in cfg
    assert cfg["zero_optimization"]["overlap_comm"] is True
    assert ("stage3_param_persistence_threshold" in cfg["zero_optimization"]) == (stage == 3)


def test_bf16_pipelines_leave_grad_accum_dtype_to_deepspeed():
    """The cost model prices what DeepSpeed picks from this config (costmodel/behaviour.py
    ``bf16_optimizer``): ZeRO stage from the sharding and no ``data_types.grad_accum_dtype``, so
    bf16 + pipeline at stage 0 is BF16_Optimizer and at stage 1 the ZeRO optimizer with bf16
    accumulation. Setting grad_accum_dtype here would change which optimizer runs."""
    for stage in (0, 1):
        cfg = deepspeed_config(ds(pp=4, dp=2, global_batch=16, sharding=stage))
        assert cfg["zero_optimization"]["stage"] == stage and cfg["bf16"]["enabled"]
        assert "data_types" not in cfg


def test_dtype_bucket_and_recompute():
    cfg = deepspeed_config(ds(dtype="fp16", recompute="full"), bucket_mb=8)
    assert cfg["fp16"]["enabled"] and cfg["fp16"]["loss_scale"] == 0  # dynamic loss scaling
    assert not cfg["bf16"]["enabled"]
    assert cfg["zero_optimization"]["reduce_bucket_size"] == 8 * 2**20 // 2
    assert cfg["zero_optimization"]["allgather_bucket_size"] == 8 * 2**20 // 2
    assert "activation_checkpointing" in cfg
    fp32 = deepspeed_config(ds(dtype="fp32"))
    assert not fp32["bf16"]["enabled"] and not fp32["fp16"]["enabled"]
    assert "activation_checkpointing" not in fp32
    assert bucket_elements(None, "fp32") == 64 * 2**20 // 4


def test_hpz_is_zero3_with_a_secondary_partition_and_mics_is_refused():
    hpz = ds(dp=8, global_batch=8, sharding="p=partial:4,g=full,o=full")
    assert zero_settings(hpz) == (3, 4)
    assert deepspeed_config(hpz)["zero_optimization"]["zero_hpz_partition_size"] == 4
    with pytest.raises(SpecError, match="deepspeed"):  # the engine rules refuse MiCS
        ds(dp=8, global_batch=8, sharding="p=partial:4,g=partial:4,o=partial:4")


def test_the_config_is_accepted_by_deepspeed():
    """DeepSpeed's own config parser reads the generated dict (no process group needed)."""
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.config import DeepSpeedConfig

    for layout in (ds(dp=1, sharding=3, dtype="bf16", global_batch=4),
                   ds(dp=1, sharding=1, dtype="fp16", recompute="selective", global_batch=2)):
        parsed = DeepSpeedConfig(deepspeed_config(layout))  # no process group: one rank
        assert parsed.zero_optimization_stage == layout.zero_stage
        assert parsed.gradient_accumulation_steps == layout.num_microbatches
    # Why the engine rules refuse MiCS: this DeepSpeed rejects its key.
    from deepspeed.runtime.config import DeepSpeedConfigError

    cfg = deepspeed_config(ds(sharding=3))
    cfg["zero_optimization"]["mics_shard_size"] = 2
    with pytest.raises(DeepSpeedConfigError, match="MiCS"):
        DeepSpeedConfig(cfg)


@pytest.mark.parametrize("kw, rule", [
    (dict(pp=2, global_batch=4, sharding=2), "does not compose sharding zero2 with pipeline"),
    (dict(pp=2, global_batch=4, schedule="gpipe"), "no 'gpipe' pipeline schedule"),
    (dict(tp=2, sequence_parallel=True), "no sequence parallelism"),
])
def test_engine_rules_refuse_what_deepspeed_refuses(kw, rule):
    with pytest.raises(SpecError, match=rule):
        ds(**kw)


def test_bench_refuses_before_any_process():
    with pytest.raises(UserError, match="engine megatron is for planning only"):
        check(load_model("tiny-gpt"), Layout(engine="megatron"))


@pytest.mark.parametrize("kw", [
    dict(pp=2, tp=2, global_batch=2),  # Megatron-style layers inside PipelineModule stages
    dict(dp=2, pp=2, tp=2, global_batch=4, sharding=1),
    dict(pp=2, global_batch=1),  # DeepSpeed's TrainSchedule runs fewer micro-batches than stages
])
def test_bench_accepts_pipelines_with_tp_and_few_micro_batches(kw):
    import dataclasses

    world = kw.get("dp", 1) * kw["pp"] * kw.get("tp", 1)
    check(load_model("tiny-gpt"), ds(**kw), world)
    # Tied embeddings across stages too (the GPT-3 catalog models tie them).
    check(dataclasses.replace(load_model("tiny-gpt"), tied_embeddings=True), ds(**kw), world)


def test_pipeline_tp_config_has_no_autotp_block():
    """With pipelines the engine's own layers split the model and PipelineModule's grid is the
    mpu: no AutoTP block, and train_batch_size is checked against the grid's dp."""
    cfg = deepspeed_config(ds(dp=2, pp=2, tp=2, global_batch=4, sharding=1))
    assert "tensor_parallel" not in cfg and cfg["train_batch_size"] == 4
    assert cfg["gradient_accumulation_steps"] == 2


def test_native_engine_checks_are_unchanged():
    with pytest.raises(UserError, match="fp16"):
        check(load_model("tiny-gpt"), Layout(dtype="fp16"))


@pytest.mark.parametrize("model", ["tiny-gpt", "tiny-llama", "tiny-gpt-8l"])
@pytest.mark.parametrize("pp", [2, 4])
def test_pipelinemodule_split_is_the_cost_models(model, pp):
    """DeepSpeed's partition_method='parameters' (its own partition_balanced over the pieces'
    parameter counts) puts on each stage the parameters the cost model gives that stage."""
    pytest.importorskip("deepspeed")
    from frontier_llm.bench.deepspeed_engine import piece_params, pipeline_parts

    spec = load_model(model)
    if spec.layers % pp:
        pytest.skip("layers not divisible by pp")
    parts, counts = pipeline_parts(spec, pp), piece_params(spec)
    layout = ds(pp=pp, global_batch=pp, dtype="fp32")
    for stage in range(pp):
        held = sum(counts[parts[stage]:parts[stage + 1]])
        assert rank_state_bytes(spec, layout, stage)["params_bytes"] == 4 * held


def test_deepspeed_fp32_master_partition_in_the_cost_model():
    spec = load_model("tiny-gpt")
    for stage, extra in ((0, 0), (1, 4), (2, 4), (3, 4)):
        native = state_bytes(spec, from_configs([Layout(dp=2, global_batch=2, sharding=stage,
                                                        dtype="fp32")]), 0)["optimizer"][0]
        deep = state_bytes(spec, from_configs([ds(dp=2, global_batch=2, sharding=stage,
                                                  dtype="fp32")]), 0)["optimizer"][0]
        assert deep - native == extra * -(-spec.num_params() // 2), stage
    # Mixed precision: the ZeRO accounting already holds the master copy.
    bf = [state_bytes(spec, from_configs([lay(dp=2, global_batch=2, sharding=1)]), 0)
          ["optimizer"][0] for lay in (Layout, ds)]
    assert bf[0] == bf[1]


def test_the_deepspeed_launcher_is_detected():
    from frontier_llm.bench import launch

    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "n1",
           "MASTER_PORT": "29500", "CROSS_RANK": "0", "CROSS_SIZE": "1", "LOCAL_SIZE": "2"}
    assert launch.detect(env) == launch.RankEnv(1, 2, 1, "n1", 29500, "deepspeed", None)


def test_autotp_config_and_its_replicated_vocabulary_in_the_cost_model():
    cfg = deepspeed_config(ds(tp=2, dp=2, global_batch=4, sharding=1))
    assert cfg["tensor_parallel"]["autotp_size"] == 2
    assert not cfg["tensor_parallel"]["partition_config"]["use_default_specs"]
    assert "train_batch_size" not in cfg and cfg["gradient_accumulation_steps"] == 2
    spec = load_model("tiny-gpt")  # untied: embedding and head each keep V - V/tp more rows
    native = rank_state_bytes(spec, Layout(tp=2, dtype="fp32"), 0)["params_bytes"]
    deep = rank_state_bytes(spec, ds(tp=2, dtype="fp32"), 0)["params_bytes"]
    assert deep - native == 4 * 2 * (spec.vocab // 2) * spec.hidden


@pytest.mark.parametrize("model", ["tiny-gpt", "tiny-llama", "small-gpt"])
def test_pipelinemodule_partition_is_stage_layers_even_or_not(model):
    """DeepSpeed's own partition_balanced over the pieces' parameter counts (what
    PipelineModule(partition_method='parameters') runs) gives the layers per stage that
    specs.pipeline_split.stage_layers gives for the deepspeed engine, divisible or not."""
    pytest.importorskip("deepspeed")
    import dataclasses

    from frontier_llm.bench.deepspeed_engine import stage_blocks
    from frontier_llm.specs.pipeline_split import stage_layers

    spec = load_model(model)
    for layers in (spec.layers, 5, 7, 10, 13):
        s = dataclasses.replace(spec, layers=layers)
        for pp in range(2, min(layers, 6) + 1):
            got = tuple(len(b) for b in stage_blocks(s, pp))
            assert got == stage_layers(layers, pp, 1, "deepspeed", s), (layers, pp)


def test_hpz_keeps_the_primary_shard_in_the_cost_model():
    """What flm bench --engine deepspeed measured for tiny-gpt, dp4, p=partial:2,g=full,o=full,
    fp32: 704640 parameter bytes per rank (N/4 primary + N/2 secondary), 234880 gradient and
    704640 optimizer bytes; losses equal to the reference (run by hand, 4 ranks: not in CI)."""
    spec = load_model("tiny-gpt")
    got = rank_state_bytes(spec, ds(dp=4, global_batch=4, dtype="fp32",
                                    sharding="p=partial:2,g=full,o=full"), 0)
    want = {"params_bytes": 704640, "grads_bytes": 234880, "optimizer_bytes": 704640}
    assert {k: got[k] for k in want} == want


def test_pipeline_tp_has_no_autotp_vocabulary_term():
    """With pipelines the deepspeed engine's TP layers split the vocabulary (tp_layers.py): the
    cost model's DeepSpeed parameters equal the native (Megatron-style) count."""
    spec = load_model("tiny-gpt")
    for stage in (0, 1):
        native = rank_state_bytes(spec, Layout(pp=2, tp=2, global_batch=2, dtype="fp32"), stage)
        deep = rank_state_bytes(spec, ds(pp=2, tp=2, global_batch=2, dtype="fp32"), stage)
        assert deep == native  # ZeRO-0: no fp32 master partition either
