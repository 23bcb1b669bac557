"""flm export of Mixture-of-Experts layouts: Megatron-LM's MoE flags read back by a parser of the
names its arguments.py defines (core_v0.15.3, 309ffca), torchtitan's TOML read by tomllib
against the keys its job_config.py declares (v0.2.2) with the llama4 registration line, and the
trainers that cannot run expert parallelism refusing in one line. The models are built here
(Mixtral 8x7B's published shape; a tiny MoE) so the tests stand without the catalog."""

from __future__ import annotations

import argparse
import dataclasses
import re
import tomllib

import pytest
from test_export import (
    MEGATRON_LM_FLAGS,
    TORCHTITAN_KEYS,
    TORCHTITAN_LITERALS,
    argv_of,
    megatron_parser,
)

from frontier_llm.catalog import load_model
from frontier_llm.export import (
    DEEPSPEED,
    MEGATRON_DEEPSPEED,
    MEGATRON_LM,
    TORCHTITAN,
    ExportRefused,
    export,
    job_config,
)
from frontier_llm.specs.layout import Layout
from frontier_llm.specs.model import ModelSpec
from frontier_llm.trainers.megatron_common import moe_layer_freq

MIXTRAL = load_model("mixtral-8x7b")  # router_aux_loss 0.02, its config.json's
TINY = ModelSpec("tiny-moe-x", layers=4, hidden=64, heads=4, kv_heads=2, seq_len=64, vocab=512,
                 ffn_hidden=128, expert_ffn_hidden=96, activation="swiglu", norm="rmsnorm",
                 position="rope", bias=False, num_experts=4, top_k=2, shared_experts=1,
                 dense_layers=1)

# megatron/training/arguments.py _add_moe_args at 309ffca: the MoE names flm writes, with
# their types and choices (moe_freq_type: an int, or a list expression of digits, commas,
# brackets, + and * only, as its _eval_pattern checks).
_FREQ = re.compile(r"^(\d+|[\d,\[\]()+*]+)$")


def moe_freq(text: str) -> str:
    if not _FREQ.match(text):
        raise argparse.ArgumentTypeError(f"invalid moe_freq_type {text!r}")
    return text


def megatron_lm_moe_parser() -> argparse.ArgumentParser:
    p = megatron_parser(MEGATRON_LM_FLAGS)
    for name in ("--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size",
                 "--moe-shared-expert-intermediate-size", "--expert-model-parallel-size"):
        p.add_argument(name, type=int)
    p.add_argument("--moe-layer-freq", type=moe_freq)
    p.add_argument("--moe-router-load-balancing-type", nargs="+",
                   choices=["aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none"])
    p.add_argument("--moe-aux-loss-coeff", type=float, nargs="+")
    p.add_argument("--moe-expert-capacity-factor", type=float)
    p.add_argument("--moe-token-dispatcher-type", choices=["allgather", "alltoall", "flex"])
    # Router balance and node-limited routing (megatron/training/arguments.py, the same commit).
    p.add_argument("--moe-router-enable-expert-bias", action="store_true")
    p.add_argument("--moe-router-force-load-balancing", action="store_true")
    p.add_argument("--moe-router-num-groups", type=int)
    p.add_argument("--moe-router-group-topk", type=int)
    return p


def _layout(engine: str = "native", **kw) -> Layout:
    base = dict(tp=2, pp=4, dp=8, ep=8, global_batch=64, sequence_parallel=True,
                sharding="zero1" if engine == "megatron" else "zero3", engine=engine)
    return Layout(**{**base, **kw})


def test_megatron_lm_moe_flags_parse_with_its_names():
    text = export(MEGATRON_LM, MIXTRAL, _layout("megatron"))
    ns = megatron_lm_moe_parser().parse_args(argv_of(text))  # an unknown name: an error
    assert (ns.num_experts, ns.moe_router_topk, ns.moe_ffn_hidden_size) == (8, 2, 14336)
    assert ns.expert_model_parallel_size == 8 and ns.moe_token_dispatcher_type == "alltoall"
    assert ns.moe_router_load_balancing_type == ["aux_loss"] and ns.moe_aux_loss_coeff == [0.02]
    # A global-batch balance loss (Qwen3's) exports Megatron-LM's global_aux_loss.
    glob = dataclasses.replace(MIXTRAL, router_balance="aux-loss-global")
    ns_glob = megatron_lm_moe_parser().parse_args(argv_of(export(
        MEGATRON_LM, glob, _layout("megatron"))))
    assert ns_glob.moe_router_load_balancing_type == ["global_aux_loss"]
    assert ns.moe_layer_freq == "1" and ns.moe_shared_expert_intermediate_size is None
    assert ns.moe_expert_capacity_factor is None  # dropless, Megatron's default
    assert ns.rotary_base == 1_000_000  # Mixtral's rope_theta, not Megatron's 10000
    # The overlapped reduction and gather the megatron engine prices (dp 8, distributed
    # optimizer): without --overlap-grad-reduce Megatron drops --ddp-bucket-size.
    assert ns.overlap_grad_reduce and ns.overlap_param_gather
    # ep re-folds dp: the GPUs are tp x pp x dp, as for the dense model.
    assert (ns.tensor_model_parallel_size, ns.pipeline_model_parallel_size) == (2, 4)


def test_a_name_megatron_lacks_fails_the_parser():
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        megatron_lm_moe_parser().parse_args(["--moe-experts", "8"])


def test_megatron_lm_first_dense_blocks_and_shared_experts():
    # One dense block then MoE in every block: Megatron's list form, one 0/1 per block.
    assert moe_layer_freq(TINY) == "[0,1,1,1]"
    every_other = dataclasses.replace(TINY, dense_layers=0, moe_layer_freq=2)
    assert moe_layer_freq(every_other) == "2"  # Megatron's i % 2 == 0: blocks 0 and 2
    assert [every_other.moe_block(i) for i in range(4)] == [True, False, True, False]
    ns = megatron_lm_moe_parser().parse_args(argv_of(export(
        MEGATRON_LM, TINY, Layout(dp=4, ep=2, global_batch=8, engine="megatron"))))
    assert ns.moe_shared_expert_intermediate_size == 96  # 1 shared expert x 96
    assert ns.moe_router_load_balancing_type == ["none"]
    assert ns.expert_model_parallel_size == 2
    # An MoE model at ep 1 still gets its experts, without an expert-parallel degree.
    ns = megatron_lm_moe_parser().parse_args(argv_of(export(
        MEGATRON_LM, TINY, Layout(dp=2, global_batch=4, engine="megatron"))))
    assert ns.num_experts == 4 and ns.expert_model_parallel_size is None


def test_a_dense_export_has_no_moe_flag():
    dense = ModelSpec("d", layers=2, hidden=64, heads=4, seq_len=64, vocab=512)
    text = export(MEGATRON_LM, dense, Layout(dp=2, global_batch=4, engine="megatron"))
    assert "--num-experts" not in text and "--moe-" not in text and "--expert-" not in text


def test_torchtitan_moe_toml_has_only_job_config_keys():
    keys = {**TORCHTITAN_KEYS, "parallelism": {**TORCHTITAN_KEYS["parallelism"],
                                               # job_config.py v0.2.2 Parallelism
                                               "expert_parallel_degree": int,
                                               "expert_tensor_parallel_degree": int}}
    layout = _layout()
    text = export(TORCHTITAN, MIXTRAL, layout)
    doc = tomllib.loads(text)
    for section, values in doc.items():
        for key, value in values.items():
            assert isinstance(value, keys[section][key]), (section, key)
            if key in TORCHTITAN_LITERALS:
                assert value in TORCHTITAN_LITERALS[key]
    par = doc["parallelism"]
    assert doc["model"] == {"name": "llama4", "flavor": "mixtral-8x7b"}
    assert par["expert_parallel_degree"] == 8
    # etp is tp or 1 in torchtitan; flm's expert-tp is tp.
    assert par["expert_tensor_parallel_degree"] == par["tensor_parallel_degree"] == 2
    # torchtitan's efsdp = dp_shard x cp x tp / (etp x ep) must be a whole number of ranks.
    assert (par["data_parallel_shard_degree"] * par.get("context_parallel_degree", 1)
            * par["tensor_parallel_degree"]) % (2 * 8) == 0
    registration = next(line for line in text.splitlines() if "llama4_args[" in line)
    assert "num_experts=8" in registration and "top_k=2" in registration
    assert "multiple_of=14336" in registration and "auto_scale_hidden_dim=False" in registration
    # Mixtral weights its experts' outputs (torchtitan's default weights their inputs) and its
    # RoPE base is 1e6 (its config.json rope_theta), not Llama 3's 500000.
    assert "score_before_experts=False" in registration
    assert "rope_theta=1000000," in registration
    # torchtitan has no auxiliary loss: the TOML says Mixtral's 0.02 is not applied.
    assert "no auxiliary load-balancing loss" in text and "router_aux_loss 0.02" in text


@pytest.mark.parametrize("model, layout, words", [
    # DeepSeek's form (first block dense, experts in every block after it) is torchtitan's
    # deepseek_v3, whose MLA attention flm's spec does not describe: said, with the way out.
    (TINY, Layout(dp=4, ep=2, global_batch=8, sharding="zero3"),
     "deepseek_v3 (n_dense_layers) attends with multi-head latent attention"),
    (dataclasses.replace(TINY, dense_layers=0, moe_layer_freq=2),
     Layout(dp=4, ep=2, global_batch=8, sharding="zero3"), "llama4 places its MoE blocks last"),
    (dataclasses.replace(MIXTRAL, capacity_factor=1.25), _layout(),
     "drops no token"),
    # HSDP: dp_shard 2 of dp 8; ep 8 does not divide dp_shard x cp = 2.
    (MIXTRAL, _layout(sharding="p=partial:2,g=partial:2,o=partial:2"),
     "does not divide data_parallel_shard_degree"),
])
def test_torchtitan_refuses_what_llama4_or_its_mesh_cannot_be(model, layout, words):
    with pytest.raises(ExportRefused) as exc:
        job_config(model, layout)
    assert "\n" not in str(exc.value) and words in str(exc.value)


@pytest.mark.parametrize("trainer, layout, words", [
    (MEGATRON_DEEPSPEED, Layout(dp=8, ep=8, global_batch=8, engine="megatron"),
     "DeepSpeed-MoE flags"),
    (DEEPSPEED, Layout(dp=8, ep=8, global_batch=8), "ep_size"),
    (MEGATRON_LM, _layout("megatron", sequence_parallel=False), "needs sequence parallelism"),
    (MEGATRON_LM, _layout("megatron", dtype="fp16"), "not supported with fp16"),
])
def test_moe_refusals_are_one_line(trainer, layout, words):
    with pytest.raises(ExportRefused) as exc:
        export(trainer, MIXTRAL, layout)
    message = str(exc.value)
    assert "\n" not in message and message.startswith(f"{trainer} cannot run this layout: ")
    assert words in message


def test_deepspeed_zero3_moe_export_says_to_mark_the_leaf_modules():
    """ZeRO-3 gathers every module's parameters on every rank: the MoE block must be a ZeRO-3
    leaf (deepspeed.utils.set_z3_leaf_modules, DeepSpeed 0.19), or a rank whose tokens skip an
    expert never joins its gather. The export says so beside the ds_config; ZeRO-1 does not."""
    from frontier_llm.trainers import get

    ds = get(DEEPSPEED)
    zero3 = Layout(dp=4, global_batch=8, sharding="zero3", engine="deepspeed")
    assert any("set_z3_leaf_modules" in n for n in ds.notes(MIXTRAL, zero3))
    zero1 = dataclasses.replace(zero3, sharding="zero1")
    assert not any("set_z3_leaf_modules" in n for n in ds.notes(MIXTRAL, zero1))
    dense = load_model("tiny-llama")
    assert not any("set_z3_leaf_modules" in n for n in ds.notes(dense, zero3))


def test_a_torchtitan_flavor_is_its_shape_and_its_rope_base():
    """torchtitan's llama3 flavors all have rope_theta 500000 (llama3/__init__.py v0.2.2): Llama
    3 8B is "8B"; the same shape at another RoPE base is no flavor of it and is registered with
    its own rope_theta."""
    from frontier_llm.trainers.torchtitan import flavor, registration

    llama = load_model("llama3-8b")
    assert flavor(llama) == "8B"
    other = dataclasses.replace(llama, name="llama3-8b-rope10k", rope_base=10000.0)
    assert flavor(other) is None and registration(other).endswith("rope_theta=10000)")


def test_megatron_export_writes_the_router_balance_and_group_limit():
    import dataclasses

    from frontier_llm.catalog import load_model
    from frontier_llm.specs.layout import Layout
    from frontier_llm.trainers.megatron_common import moe_args

    lay = Layout(tp=1, dp=8, ep=8, global_batch=8, engine="megatron")
    mixtral = load_model("mixtral-8x7b")
    plain = moe_args(mixtral, lay)
    assert "--moe-router-enable-expert-bias" not in plain
    assert "--moe-router-num-groups" not in plain
    free = moe_args(dataclasses.replace(mixtral, router_balance="aux-free", n_group=4,
                                        topk_group=2), lay)
    assert "--moe-router-enable-expert-bias" in free
    i = free.index("--moe-router-num-groups")
    assert free[i:i + 4] == ["--moe-router-num-groups", "4", "--moe-router-group-topk", "2"]
    forced = moe_args(dataclasses.replace(mixtral, router_balance="forced"), lay)
    assert "--moe-router-force-load-balancing" in forced
