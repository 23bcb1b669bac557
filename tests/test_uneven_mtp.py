"""Uneven pipelines as Megatron states them, dense first blocks and multi-token prediction
(issue 53): the model spec's MTP parameters and FLOPs, where each sits on the pipeline (dense
blocks on the first stage, MTP on the last), the slowest stage setting the pace, and DeepSeek-V3
over pp 16 x ep 64 with given end stages through ``flm predict``."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from test_logs_moe import _arguments

from frontier_llm.catalog import load_model, load_system
from frontier_llm.costmodel import moe, predict
from frontier_llm.costmodel.flops import (
    layer_forward_flops_per_token,
    logits_forward_flops_per_token,
    model_flops,
)
from frontier_llm.costmodel.layouts import from_configs
from frontier_llm.costmodel.memory import rank_memory
from frontier_llm.costmodel.params import layer_params_per_rank, stage_params_per_rank
from frontier_llm.costmodel.split import rank_layers, rank_moe_blocks
from frontier_llm.errors import SpecError
from frontier_llm.specs.layout import Layout

DSV3 = load_model("deepseek-v3")
NO_MTP = dataclasses.replace(DSV3, mtp_layers=0)
H100 = load_system("dgx-h100")


def _ds_layout(first: int = 4, last: int = 1, **kw) -> Layout:
    """DeepSeek-V3's training layout as its report states it (arXiv 2412.19437 §3.2: 16-way
    pipeline, 64-way expert parallelism, ZeRO-1 data parallelism, no tensor parallelism, on 2,048
    GPUs; §4.2: batch 15,360 sequences of 4,096 tokens), with the end stages given."""
    base = dict(tp=1, pp=16, dp=128, ep=64, micro_batch=1, global_batch=15360,
                sharding="zero1", engine="megatron", recompute="full",
                first_stage_layers=first, last_stage_layers=last)
    return Layout(**{**base, **kw})


def test_deepseek_v3_catalog_states_dense_first_blocks_and_one_mtp_module():
    # config.json: first_k_dense_replace 3, num_nextn_predict_layers 1.
    assert DSV3.dense_layers == 3 and DSV3.mtp_layers == 1
    assert [DSV3.moe_block(i) for i in range(4)] == [False, False, False, True]
    assert load_model("kimi-k2").dense_layers == 1  # its first_k_dense_replace
    assert load_model("qwen3-235b-a22b").dense_layers == 0  # every block MoE


def test_mtp_parameters_are_a_last_kind_block_a_projection_and_three_norms():
    h = DSV3.hidden
    assert DSV3.mtp_layer_params() == DSV3.layer_params(60) + 2 * h * h + 3 * h
    # README_WEIGHTS.md: "11.5B unique parameters (excluding the shared 0.9B Embedding and 0.9B
    # Output Head)"; the shapes give 11.61B (the eh_proj's 0.10B on the block's 11.51B).
    assert DSV3.mtp_params() == pytest.approx(11.5e9, rel=0.011)
    # The published 671B leaves the module out, and so does num_params.
    assert DSV3.num_params() == NO_MTP.num_params()
    with pytest.raises(SpecError, match="mtp_layers"):
        dataclasses.replace(DSV3, mtp_layers=-1)


def test_mtp_flops_are_one_block_a_projection_and_another_head_pass():
    dense, attn = layer_forward_flops_per_token(DSV3)
    h = DSV3.hidden
    per_token = dense + attn + 2 * 2 * h * h + logits_forward_flops_per_token(DSV3)
    assert model_flops(DSV3, 1.0) - model_flops(NO_MTP, 1.0) == pytest.approx(3 * per_token)


def test_mtp_sits_on_the_last_stage_with_an_embedding_copy():
    t = from_configs([_ds_layout()])
    per_layer = layer_params_per_rank(DSV3, 1)
    h, v = DSV3.hidden, DSV3.vocab
    for rank in (0, 7):
        assert stage_params_per_rank(DSV3, 1, 16, rank, 4, per_layer) == \
            stage_params_per_rank(NO_MTP, 1, 16, rank, 4, per_layer)
    extra = (stage_params_per_rank(DSV3, 1, 16, 15, 1, per_layer)
             - stage_params_per_rank(NO_MTP, 1, 16, 15, 1, per_layer))
    assert extra == per_layer + 2 * h * h + 3 * h + v * h
    with_mtp = rank_memory(DSV3, H100, t, 15)
    without = rank_memory(NO_MTP, H100, t, 15)
    assert with_mtp["params"][0] > without["params"][0]
    assert with_mtp["activations"][0] > without["activations"][0]
    first_with, first_without = rank_memory(DSV3, H100, t, 0), rank_memory(NO_MTP, H100, t, 0)
    assert first_with["peak"][0] == pytest.approx(first_without["peak"][0])


def test_dense_first_blocks_sit_on_the_first_stage():
    """Rank 0 of 4 + 14 x 4 + 1 holds blocks 0-3 (three dense, one MoE) and the embedding; a
    middle rank four MoE blocks: each is priced at its own blocks, not at mean blocks. Under
    ep 64 a dense block (its 18,432-wide MLP whole) outweighs an MoE block's share (4 of 256
    routed experts and the shared one) on a rank."""
    t = from_configs([_ds_layout()])
    assert [int(rank_layers(DSV3, t, r)[0][0]) for r in (0, 1, 15)] == [4, 4, 1]
    assert [int(rank_moe_blocks(DSV3, t, r)[0]) for r in (0, 1, 15)] == [1, 4, 1]
    dense_rank = layer_params_per_rank(DSV3, 1)
    block = {frac: moe.layer_params_per_rank(DSV3, 1, 64, dense_rank, frac)[0]
             for frac in (0.0, 1.0)}
    assert block[0.0] > block[1.0]
    first, middle = rank_memory(DSV3, H100, t, 0), rank_memory(DSV3, H100, t, 1)
    bf16 = 2
    assert first["params"][0] == pytest.approx(
        bf16 * (3 * block[0.0] + block[1.0] + DSV3.embedding_params()))
    assert middle["params"][0] == pytest.approx(bf16 * 4 * block[1.0])


def test_the_slowest_stage_sets_the_pace():
    """With the end stages given, a last stage of 4 layers plus the MTP module and two head
    passes is slower than the middle stages' 4 layers, so it paces the pipeline: 1 + 14 x 4 + 4
    is slower than 4 + 14 x 4 + 1, whose middle stages pace it."""
    light = predict(DSV3, H100, _ds_layout(4, 1))
    heavy = predict(DSV3, H100, _ds_layout(1, 4))
    assert heavy["step_time_s"] > light["step_time_s"]
    # Without MTP the heavier last stage costs less.
    plain = predict(NO_MTP, H100, _ds_layout(1, 4))
    assert plain["step_time_s"] < heavy["step_time_s"]


def test_uneven_interleaving_is_priced_by_its_chunks():
    """94 layers (Qwen3-235B-A22B) over pp 8 x vp 2 with given ends: Megatron runs it (each
    chunk whole), and the peak memory is a real stage's."""
    model = load_model("qwen3-235b-a22b")
    layout = Layout(tp=4, pp=8, dp=8, ep=8, micro_batch=1, global_batch=64,
                    schedule="interleaved", virtual_stages=2, engine="megatron",
                    sharding="zero1", recompute="full", first_stage_layers=10,
                    last_stage_layers=12)
    out = predict(model, H100, layout)
    assert np.isfinite(out["step_time_s"]) and out["peak_memory_bytes"] > 0


def test_deepseek_v3_pp16_ep64_with_uneven_stages_through_flm_predict(capsys):
    """The done-when of issue 53: DeepSeek-V3 as its report states the layout (pp 16, ep 64,
    ZeRO-1 dp, tp 1, 2,048 GPUs, blockwise FP8; H800s, here dgx-h100, the same SXM5 GPU with
    NVLink cut to 400 GB/s), its 61 layers split 4 + 14 x 4 + 1 (the report gives no per-stage
    counts; Megatron needs given ends for 61 over 16), through ``flm predict``."""
    from frontier_llm.cli import main

    argv = ["predict", "--model", "deepseek-v3", "--system", "dgx-h100", "--tp", "1",
            "--pp", "16", "--dp", "128", "--ep", "64", "--engine", "megatron",
            "--micro-batch", "1", "--global-batch", "15360", "--zero", "1",
            "--recompute", "full", "--dtype", "fp8", "--fp8-recipe", "blockwise",
            "--first-stage-layers", "4", "--last-stage-layers", "1", "--format", "json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["layout"]["first_stage_layers"] == 4 and out["layout"]["last_stage_layers"] == 1
    assert out["layout"]["pp"] == 16 and out["layout"]["ep"] == 64
    assert 0 < out["step_time_s"] < 1e4 and out["fits"]
    # A split Megatron refuses is refused with its rule: 61 = 5 + 15 x 56/15 does not divide.
    assert main([*argv[:-6], "--first-stage-layers", "5", "--format", "json"]) != 0
    assert "do not divide evenly over the 15 middle stages" in capsys.readouterr().err


# --- Export: Megatron-LM's flags, the other trainers' refusals, the log read back --------------
def _mlm_argv(model, layout) -> dict[str, str]:
    from frontier_llm.trainers import get

    argv = get("megatron-lm").flags(model, layout)
    out, i = {}, 0
    while i < len(argv):
        takes = i + 1 < len(argv) and not argv[i + 1].startswith("--")
        out[argv[i]] = argv[i + 1] if takes else ""
        i += 1 + takes
    return out


def test_megatron_lm_writes_given_ends_mtp_and_dense_first_blocks():
    flags = _mlm_argv(DSV3, _ds_layout())
    assert flags["--decoder-first-pipeline-num-layers"] == "4"
    assert flags["--decoder-last-pipeline-num-layers"] == "1"
    assert flags["--mtp-num-layers"] == "1"
    assert flags["--moe-layer-freq"] == "[" + ",".join(["0"] * 3 + ["1"] * 58) + "]"
    # Only the first given: Megatron splits the rest over the other 15 stages itself.
    only_first = _mlm_argv(NO_MTP, _ds_layout(5, 0, pp=8, dp=256))
    assert only_first["--decoder-first-pipeline-num-layers"] == "5"
    assert "--decoder-last-pipeline-num-layers" not in only_first
    assert "--mtp-num-layers" not in only_first


def test_megatron_lm_interleaves_uneven_stages_with_virtual_stages_per_rank():
    model = load_model("qwen3-235b-a22b")
    layout = Layout(tp=4, pp=8, dp=8, ep=8, micro_batch=1, global_batch=64,
                    schedule="interleaved", virtual_stages=2, engine="megatron",
                    sharding="zero1", sequence_parallel=True, first_stage_layers=10,
                    last_stage_layers=12)
    flags = _mlm_argv(model, layout)
    assert flags["--num-virtual-stages-per-pipeline-rank"] == "2"
    assert "--num-layers-per-virtual-pipeline-stage" not in flags  # validate_args refuses it
    assert (flags["--decoder-first-pipeline-num-layers"],
            flags["--decoder-last-pipeline-num-layers"]) == ("10", "12")


def test_mtp_is_refused_where_no_trainer_builds_it():
    from frontier_llm.trainers import get
    from frontier_llm.trainers.refusals import ExportRefused

    llama = dataclasses.replace(load_model("tiny-llama"), name="tiny-llama-mtp", mtp_layers=1)
    layout = Layout(dp=2, global_batch=8, sharding="zero3")
    with pytest.raises(ExportRefused, match=r"torchtitan cannot run.*multi-token-prediction"):
        get("torchtitan").check(llama, layout)
    with pytest.raises(ExportRefused, match=r"megatron-deepspeed cannot run.*no MTP module"):
        get("megatron-deepspeed").check(llama, Layout(dp=2, global_batch=8))
    with pytest.raises(ExportRefused, match=r"deepspeed cannot run.*multi-token-prediction"):
        get("deepspeed").check(llama, Layout(dp=2, global_batch=8, engine="deepspeed"))
    gpt = dataclasses.replace(load_model("tiny-gpt"), name="tiny-gpt-mtp", mtp_layers=1)
    with pytest.raises(ExportRefused, match="learned positions"):
        get("megatron-lm").check(gpt, Layout(dp=2, global_batch=8, engine="megatron"))


def test_megatron_log_states_the_ends_and_the_mtp_layers(tmp_path):
    args = {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 16,
            "data_parallel_size": 128, "expert_model_parallel_size": 64,
            "context_parallel_size": 1, "micro_batch_size": 1, "global_batch_size": 15360,
            "decoder_first_pipeline_num_layers": 4, "decoder_last_pipeline_num_layers": 1,
            "num_layers": 61, "mtp_num_layers": 1, "virtual_pipeline_model_parallel_size": None,
            "use_distributed_optimizer": True, "world_size": 2048}
    run = _megatron_run(tmp_path, args)
    assert run.layout["first_stage_layers"] == 4 and run.layout["last_stage_layers"] == 1
    assert run.model["mtp_layers"] == 1


# --- The layout's codecs carry the given ends; flm bench splits by them -----------------------
def test_given_ends_survive_argv_json_and_label():
    from frontier_llm.cli import build_parser
    from frontier_llm.cli.layout_args import layout_from_args
    from frontier_llm.specs.forms import label
    from frontier_llm.specs.identity import layout_hash
    from frontier_llm.specs.layout import layout_argv, layout_json_schema

    layout = Layout(pp=4, dp=2, global_batch=8, engine="megatron", first_stage_layers=3,
                    last_stage_layers=1)
    argv = layout_argv(layout)
    assert argv[argv.index("--first-stage-layers") + 1] == "3"
    args = build_parser("bench").parse_args(["bench", "--model", "tiny-llama", *argv])
    assert layout_from_args(args) == layout
    assert Layout.from_dict(json.loads(json.dumps(layout.to_dict()))) == layout
    assert "first_stage_layers=3" in label(layout) and "last_stage_layers=1" in label(layout)
    # At their default (0) the job line, the label and the hash are as before the knobs.
    plain = Layout(pp=4, dp=2, global_batch=8, engine="megatron")
    assert "--first-stage-layers" not in layout_argv(plain) and "stage_layers" not in label(plain)
    model = load_model("tiny-llama")
    assert layout_hash(model, "cpu-local", plain) != layout_hash(model, "cpu-local", layout)
    schema = layout_json_schema()["properties"]["first_stage_layers"]
    assert schema == {"type": "integer", "minimum": 0}
    with pytest.raises(SpecError, match="need pp >= 2"):
        Layout(first_stage_layers=2)
    with pytest.raises(SystemExit):  # argparse refuses a negative count
        build_parser("bench").parse_args(["bench", "--first-stage-layers", "-1"])


def test_flm_bench_builds_the_given_split_and_refuses_mtp(tmp_path):
    """The native engine's pipeline stages are the layout's chunks (Layout.chunk_layer_ids), so
    given ends reach flm bench as they reach the cost model; a model with MTP is refused."""
    from frontier_llm.bench.config import build_config
    from frontier_llm.cli import build_parser
    from frontier_llm.errors import UserError

    def parse(*argv):
        return build_parser("bench").parse_args(["bench", *argv])

    cfg = build_config(parse("--model", "tiny-gpt-8l", "--tp", "1", "--pp", "2",
                             "--global-batch", "2", "--first-stage-layers", "5"))
    assert cfg.layout.stage_layers(cfg.model) == (5, 3)
    assert cfg.layout.chunk_layer_ids(cfg.model, 1) == [5, 6, 7]
    import yaml

    spec = {**dataclasses.asdict(load_model("tiny-llama")), "name": "tiny-llama-mtp",
            "mtp_layers": 1}
    path = tmp_path / "tiny-llama-mtp.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(UserError, match="no multi-token prediction: tiny-llama-mtp"):
        build_config(parse("--model", str(path)))


# --- A Megatron log's --pipeline-model-parallel-layout, as given ends or refused ---------------
@pytest.mark.parametrize(("text", "pp", "expected"), [
    ("Ettt|(tttt|)*14,ttmL", 16, (3, 2)),  # 61 layers, MTP and loss on the last stage
    ("Et*4|(t*4|)*14,tmL", 16, (0, 1)),  # the first stage holds the middle share
    ("(tttt|)*15,tttt", 16, (0, 0)),  # even: Megatron's own split
    ("Ettt|tt|tt|t|ttt|tt|tt|tL", 4, (6, 2)),  # pp 4 x vp 2: rank r holds chunks r and 4 + r
])
def test_layout_strings_that_are_given_ends(text, pp, expected):
    from frontier_llm.trainers.megatron_pipeline_layout import given_ends_of

    assert given_ends_of(text, pp) == expected


@pytest.mark.parametrize(("text", "pp", "words"), [
    ("Etttt|tttm|L", 3, "multi-token-prediction layers on a stage other than the last"),
    ("E|(tttt|)*15,L", 17, "without decoder layers"),
    ("Etttt|ttt|tttt|tL", 4, "middle stages hold different"),
    ("Ett|t|t|tL", 2, "chunks hold different"),
    ("Ett|tt|t", 2, "not a multiple of pp 2"),
])
def test_layout_strings_flm_can_not_state(text, pp, words):
    from frontier_llm.trainers.megatron_pipeline_layout import given_ends_of

    assert words in given_ends_of(text, pp)


def _megatron_run(tmp_path, args: dict):
    """The run flm reads from a Megatron-LM log: ``args`` as its arguments block, three
    iterations of a 15,360-sequence batch."""
    from frontier_llm.logs.traces import parse_log

    lines = [_arguments(args)]
    lines += [f" iteration {i:8d}/{3:8d} | consumed samples: {i * 15360:12d} | elapsed time per "
              f"iteration (ms): 80000.0 | global batch size: 15360 | lm loss: 9.0E+00 |"
              for i in (1, 2, 3)]
    path = tmp_path / "megatron.log"
    path.write_text("\n".join(lines) + "\n")
    return parse_log(path, "megatron-lm").runs[0]


def _layout_log(tmp_path, text: str, **more):
    args = {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 16,
            "data_parallel_size": 128, "micro_batch_size": 1, "global_batch_size": 15360,
            "decoder_first_pipeline_num_layers": None, "num_layers": 61,
            "pipeline_model_parallel_layout": text, "world_size": 2048, **more}
    return _megatron_run(tmp_path, args)


def test_a_logged_layout_string_is_read_as_given_ends_or_refused(tmp_path):
    run = _layout_log(tmp_path, "Ettt|(tttt|)*14,ttmL")
    assert (run.layout["first_stage_layers"], run.layout["last_stage_layers"]) == (3, 2)
    assert run.status != "refused"
    run = _layout_log(tmp_path, "E|(tttt|)*14,ttttt|L")
    assert run.status == "refused" and "--pipeline-model-parallel-layout" in run.error


def test_logged_account_for_embedding_and_loss_are_given_ends(tmp_path):
    """Megatron's get_num_layers_to_build: (94 + 1 + 1) / 8 = 12 a stage, the first and the
    last building one fewer for the embedding and the loss."""
    run = _layout_log(tmp_path, "None", num_layers=94, pipeline_model_parallel_size=8,
                      account_for_embedding_in_pipeline_split=True,
                      account_for_loss_in_pipeline_split=True)
    assert (run.layout["first_stage_layers"], run.layout["last_stage_layers"]) == (11, 11)
    run = _layout_log(tmp_path, "None", num_layers=94, pipeline_model_parallel_size=8,
                      account_for_embedding_in_pipeline_split=True,
                      account_for_loss_in_pipeline_split=True,
                      virtual_pipeline_model_parallel_size=2)
    assert run.status == "refused" and "only the first/last chunk" in run.error
