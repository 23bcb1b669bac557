"""Specs: validation rules name the field and the rule; YAML errors name file and line."""

from __future__ import annotations

import pytest

from frontier_llm.catalog import load_model, model_from_mapping, system_from_mapping
from frontier_llm.errors import SpecError
from frontier_llm.specs import ParallelConfig, Placement, Sharding, zero_preset
from frontier_llm.specs.yamlio import load_yaml, loads_yaml


def test_heads_not_divisible_by_tp_names_both_numbers():
    model = load_model("gpt-175b")
    with pytest.raises(SpecError, match=r"heads \(96\) is not divisible by tp \(7\)"):
        ParallelConfig(tp=7, global_batch=7).check_model(model)


def test_uneven_pipeline_chunks_are_split_but_empty_ones_refused():
    model = load_model("gpt-22b")  # 48 layers
    layout = ParallelConfig(pp=5, global_batch=5, schedule="1f1b")
    layout.check_model(model)  # uneven: 48 = 9 + 10 + 10 + 10 + 9
    assert layout.stage_layers(model) == (9, 10, 10, 10, 9)
    tiny = load_model("tiny-gpt")  # 4 layers
    with pytest.raises(SpecError, match=r"leaves a chunk without layers"):
        ParallelConfig(pp=5, global_batch=5).check_model(tiny)


def test_world_size_mismatch_explains_product():
    layout = ParallelConfig(tp=8, global_batch=8)
    with pytest.raises(SpecError, match=r"tp x pp x dp = 8 x 1 x 1 = 8 does not match the 7"):
        layout.check_world(7)


def test_global_batch_must_split_into_micro_batches():
    with pytest.raises(SpecError, match=r"global_batch \(10\) is not divisible by micro_batch"):
        ParallelConfig(dp=4, micro_batch=1, global_batch=10)


def test_interleaved_needs_microbatches_multiple_of_pp():
    with pytest.raises(SpecError, match="multiple of pp"):
        ParallelConfig(pp=4, schedule="interleaved", virtual_stages=2, global_batch=6)
    ok = ParallelConfig(pp=4, schedule="interleaved", virtual_stages=2, global_batch=8)
    assert ok.num_microbatches == 8


def test_virtual_stages_need_interleaved_schedule():
    with pytest.raises(SpecError, match="needs schedule 'interleaved'"):
        ParallelConfig(pp=2, virtual_stages=2, global_batch=4)


def test_zero_presets_are_amsp_points():
    assert zero_preset(0) == Sharding()
    z3 = zero_preset(3)
    assert all(getattr(z3, c).kind == "full" for c in ("params", "grads", "optim"))
    assert zero_preset(1).optim.kind == "full" and zero_preset(1).grads.kind == "replicate"
    assert ParallelConfig(dp=8, global_batch=8, sharding=2).zero_stage == 2
    with pytest.raises(SpecError, match="zero stage must be 0, 1, 2 or 3"):
        zero_preset(4)


def test_partial_sharding_group_must_divide_dp():
    sharding = Sharding.parse({"params": "partial:3", "grads": "partial:3", "optim": "partial:3"})
    with pytest.raises(SpecError, match=r"partial group \(3\) does not divide dp \(8\)"):
        ParallelConfig(dp=8, global_batch=8, sharding=sharding)
    hsdp = ParallelConfig(dp=8, global_batch=8, sharding={"params": "partial:4",
                                                          "grads": "partial:4",
                                                          "optim": "partial:4"})
    assert hsdp.sharding.params.degree(8) == 4
    assert hsdp.sharding.optim.degree(8) == 4
    assert hsdp.zero_stage is None
    # The same degrees under DeepSpeed's hpZ: parameters partial, the rest over all 8.
    hpz = ParallelConfig(dp=8, global_batch=8, engine="deepspeed",
                         sharding={"params": "partial:4", "grads": "full", "optim": "full"})
    assert (hpz.sharding.params.degree(8), hpz.sharding.optim.degree(8)) == (4, 8)


def test_params_cannot_be_sharded_finer_than_optimizer_states():
    with pytest.raises(SpecError, match="at least as finely"):
        ParallelConfig(dp=4, global_batch=4,
                       sharding={"params": "full", "grads": "replicate", "optim": "replicate"})


def test_placement_parse_rejects_nonsense():
    assert Placement.parse("partial:8") == Placement("partial", 8)
    with pytest.raises(SpecError, match="partial:K"):
        Placement.parse("halfway")
    with pytest.raises(SpecError, match="group size"):
        Placement.parse("partial:x")


def test_layout_round_trips_through_dict():
    layout = ParallelConfig(tp=2, pp=2, dp=2, micro_batch=2, global_batch=16,
                            schedule="interleaved", virtual_stages=2, sequence_parallel=True,
                            recompute="selective", sharding=1)
    again = ParallelConfig.from_dict(layout.to_dict())
    assert again == layout


def test_model_yaml_error_names_file_line_and_field(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\nlayers: 4\nhidden: 100\nheads: 3\nseq_len: 16\nvocab: 32\n")
    data = load_yaml(path)
    with pytest.raises(SpecError) as err:
        model_from_mapping(data)
    assert str(err.value).startswith(f"{path}:3: hidden (100) is not divisible by heads (3)")


def test_unknown_field_suggests_the_close_one(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("name: t\nlayers: 4\nhiden: 64\nhidden: 64\nheads: 4\nseq_len: 8\nvocab: 8\n")
    with pytest.raises(SpecError, match=r"typo.yaml:3: unknown field 'hiden'.*mean 'hidden'"):
        model_from_mapping(load_yaml(path))


def test_wrong_type_names_field_and_line():
    data = loads_yaml("name: t\nlayers: four\nhidden: 64\nheads: 4\nseq_len: 8\nvocab: 8\n",
                      "m.yaml")
    with pytest.raises(SpecError, match=r"m.yaml:2: layers must be an integer \(got 'four'\)"):
        model_from_mapping(data)


def test_yaml_syntax_error_names_line():
    with pytest.raises(SpecError, match=r"x.yaml:3: invalid YAML.*started at line 2"):
        loads_yaml("a: 1\nb: [1, 2\n", "x.yaml")


def test_duplicate_key_is_an_error():
    with pytest.raises(SpecError, match=r"x.yaml:2: duplicate key 'a'"):
        loads_yaml("a: 1\na: 2\n", "x.yaml")


def test_system_validation_needs_node_and_network_tiers():
    with pytest.raises(SpecError, match="links needs a 'network' tier"):
        system_from_mapping({
            "name": "s", "gpu": "g", "gpus_per_node": 8, "memory_bytes": 8e10,
            "peak_flops": {"bf16": 1e15},
            "links": {"node": {"bandwidth": 1e11, "latency": 1e-6}},
        })


def test_efficiency_must_be_a_fraction():
    with pytest.raises(SpecError, match=r"efficiency must be in \[0, 1\]"):
        system_from_mapping({
            "name": "s", "gpu": "g", "gpus_per_node": 8, "memory_bytes": 8e10,
            "peak_flops": {"bf16": 1e15},
            "links": {"node": {"bandwidth": 1e11, "latency": 1e-6},
                      "network": {"bandwidth": 1e10, "latency": 1e-6}},
            "efficiency": {"matmul": 1.5},
        })


def test_rate_efficiency_must_be_positive():
    with pytest.raises(SpecError, match=r"efficiency\.matmul must be above 0"):
        system_from_mapping({
            "name": "s", "gpu": "g", "gpus_per_node": 8, "memory_bytes": 8e10,
            "peak_flops": {"bf16": 1e15},
            "links": {"node": {"bandwidth": 1e11, "latency": 1e-6},
                      "network": {"bandwidth": 1e10, "latency": 1e-6}},
            "efficiency": {"matmul": 0.0, "tp_overlap": 0.0},
        })
