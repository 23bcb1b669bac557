"""flm export of attention set apart from hidden / heads: each head's width as Megatron's
--kv-channels, multi-head latent attention as Megatron-LM's --multi-latent-attention flags, read
back by a parser of the names its arguments.py defines at the cited commit (core_v0.15.3,
309ffca: --kv-channels in _add_network_size_args, the MLA ranks and head widths in
_add_mla_args, --rope-type's choices 'rope'/'yarn'; Megatron-DeepSpeed 4efb479 has
--kv-channels too), and by flm's own Megatron log reader; the trainers that cannot run them
refuse in one line."""

from __future__ import annotations

import dataclasses

import pytest
from test_export import MEGATRON_DEEPSPEED_FLAGS, add_flags, argv_of, megatron_parser
from test_export_moe import megatron_lm_moe_parser
from test_logs_moe import BASE, MIXTRAL_LOG, _arguments

from frontier_llm.catalog import load_model
from frontier_llm.export import (
    MEGATRON_DEEPSPEED,
    MEGATRON_LM,
    TORCHTITAN,
    ExportRefused,
    export,
)
from frontier_llm.logs.traces import parse_log
from frontier_llm.specs.layout import Layout
from frontier_llm.specs.model import ModelSpec

# Megatron-LM core_v0.15.3 (309ffca) megatron/training/arguments.py: the names flm writes for
# attention, with their types (--q-lora-rank default None, --kv-lora-rank 32, --qk-head-dim
# 128, --qk-pos-emb-head-dim 64, --v-head-dim 128: every one is written).
ATTENTION_FLAGS = {"--kv-channels": int, "--multi-latent-attention": None,
                   "--q-lora-rank": int, "--kv-lora-rank": int, "--qk-head-dim": int,
                   "--qk-pos-emb-head-dim": int, "--v-head-dim": int,
                   "--rope-type": ("rope", "yarn")}


def lm_parser():
    return add_flags(megatron_lm_moe_parser(), ATTENTION_FLAGS)


def _layout(**kw) -> Layout:
    base = dict(tp=2, pp=4, dp=8, ep=8, global_batch=64, sequence_parallel=True,
                sharding="zero1", engine="megatron")
    return Layout(**{**base, **kw})


def test_qwen3_head_dim_is_written_as_kv_channels():
    model = load_model("qwen3-235b-a22b")
    ns = lm_parser().parse_args(argv_of(export(MEGATRON_LM, model, _layout(pp=2))))
    assert (ns.num_attention_heads, ns.kv_channels, ns.num_query_groups) == (64, 128, 4)
    assert ns.group_query_attention and not ns.multi_latent_attention


def test_deepseek_v3_mla_flags_parse_with_megatron_lms_names():
    model = load_model("deepseek-v3")
    ns = lm_parser().parse_args(argv_of(export(MEGATRON_LM, model, _layout())))
    assert ns.multi_latent_attention
    assert (ns.q_lora_rank, ns.kv_lora_rank) == (1536, 512)
    # Megatron's qk-head-dim is the part without RoPE: q_head_dim = qk_head_dim + pos_emb.
    assert (ns.qk_head_dim, ns.qk_pos_emb_head_dim, ns.v_head_dim) == (128, 64, 128)
    assert ns.rope_type == "rope"  # MLA's default is YaRN; flm's model is plain RoPE
    # MLA has no query groups and no kv-channels of its own.
    assert not ns.group_query_attention and ns.kv_channels is None


def test_a_full_rank_query_leaves_q_lora_rank_at_none():
    mla = ModelSpec(name="mla-lite", layers=2, hidden=64, heads=4, seq_len=32, vocab=128,
                    ffn_hidden=128, activation="swiglu", norm="rmsnorm", position="rope",
                    bias=False, kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=4,
                    v_head_dim=6)
    ns = lm_parser().parse_args(argv_of(export(MEGATRON_LM, mla, Layout(dp=2, global_batch=4,
                                                                          engine="megatron"))))
    assert ns.q_lora_rank is None and ns.kv_lora_rank == 8


def test_megatron_deepspeed_writes_kv_channels_and_refuses_mla():
    dense = dataclasses.replace(load_model("tiny-llama"), name="tiny-llama-wide", head_dim=32)
    names = {**MEGATRON_DEEPSPEED_FLAGS, "--kv-channels": int}  # 4efb479 megatron/arguments.py
    layout = Layout(dp=2, global_batch=4, engine="deepspeed")
    ns = megatron_parser(names).parse_args(argv_of(export(MEGATRON_DEEPSPEED, dense, layout)))
    assert ns.kv_channels == 32
    mla = dataclasses.replace(dense, head_dim=None, kv_heads=None, kv_lora_rank=8,
                              qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6)
    with pytest.raises(ExportRefused, match="does not implement; use --to megatron-lm") as exc:
        export(MEGATRON_DEEPSPEED, mla, layout)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("name, words", [
    ("deepseek-v3", r"runs it as its deepseek_v3 model \(DeepSeekV3ModelArgs\), which flm "
                    "does not export"),
    ("qwen3-30b-a3b", "heads are 128 wide, not dim / n_heads = 64"),
])
def test_torchtitan_refuses_what_llama3_and_llama4_cannot_be(name, words):
    with pytest.raises(ExportRefused, match=words) as exc:
        export(TORCHTITAN, load_model(name), Layout(dp=8, ep=8, global_batch=64,
                                                     sharding="zero3"))
    assert "\n" not in str(exc.value)


def test_megatron_log_reads_head_dim_and_mla_back(tmp_path):
    """The arguments block Megatron-LM prints gives the model back: kv_channels (printed
    always) as head_dim where it is not hidden / heads, and the MLA widths."""
    def model_of(args: dict) -> dict:
        path = tmp_path / "run.log"
        path.write_text(_arguments({**BASE, **args}) + MIXTRAL_LOG.read_text())
        return parse_log(path, "megatron").runs[0].model

    wide = model_of({"kv_channels": 256, "group_query_attention": True,
                     "num_query_groups": 8})
    assert wide["head_dim"] == 256 and wide["kv_heads"] == 8
    assert "head_dim" not in model_of({"kv_channels": 128})  # hidden / heads: as before
    mla = model_of({"multi_latent_attention": True, "q_lora_rank": None,
                    "kv_lora_rank": 512, "qk_head_dim": 128, "qk_pos_emb_head_dim": 64,
                    "v_head_dim": 128, "kv_channels": 128})
    assert {k: mla[k] for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                                "qk_rope_head_dim", "v_head_dim")} == \
        {"q_lora_rank": 0, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
         "qk_rope_head_dim": 64, "v_head_dim": 128}
    assert "head_dim" not in mla


def test_plan_does_not_send_an_mla_model_to_flm_bench(capsys):
    """A first rank no trainer expresses runs under flm bench for other models; flm bench
    builds no MLA, so for DeepSeek-V3 the line says so rather than point at it."""
    from frontier_llm.cli import main

    assert main(["plan", "--model", "deepseek-v3", "--system", "dgx-h100", "--gpus", "1024",
                 "--top", "1"]) == 0
    line = next(x for x in capsys.readouterr().err.splitlines() if x.startswith("# rank 1 ("))
    assert "flm bench builds no multi-head latent attention" in line
    assert "flm bench only" not in line
