"""flm export: goldens for each trainer on a table of layouts, read back by the trainer's own
parser where it installs here (DeepSpeed's config class) and otherwise by a parser of the names
the cited source defines (torchtitan's TOML with tomllib, Megatron's flags with argparse);
refusals; the CLI's three ways to give a layout and its bad input.

Regenerate the goldens after an intended change with FLM_REGEN_GOLDEN=1.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import tomllib
from pathlib import Path

import pytest

from frontier_llm.catalog import load_model, load_system
from frontier_llm.cli import main
from frontier_llm.cli.layout_args import add_layout_args
from frontier_llm.export import (
    DEEPSPEED,
    MEGATRON_DEEPSPEED,
    MEGATRON_LM,
    TORCHTITAN,
    TRAINERS,
    ExportRefused,
    ds_config,
    export,
    job_config,
    layout_for,
)
from frontier_llm.specs.layout import given_options

GOLDEN = Path(__file__).parent / "golden" / "export"
SUFFIX = {MEGATRON_LM: "args", MEGATRON_DEEPSPEED: "args", TORCHTITAN: "toml",
          DEEPSPEED: "json"}

# (id, model, flm layout flags, {trainer: None for a golden, or words of its refusal}). The
# layouts are given as flm's own flags, so the table also goes through the CLI's layout codec.
CASES = [
    ("gpt-tp2-pp2-sp-full-zero1", "gpt3-125m",
     "--tp 2 --pp 2 --dp 2 --global-batch 16 --sequence-parallel --recompute full --zero 1",
     {MEGATRON_LM: None, MEGATRON_DEEPSPEED: None,
      TORCHTITAN: "shards parameters, gradients and optimizer states differently",
      DEEPSPEED: "no sequence parallelism"}),
    ("llama-interleaved-fsdp-sac-op", "llama3-8b",
     "--tp 2 --pp 2 --dp 2 --global-batch 16 --virtual-stages 2 --sequence-parallel "
     "--recompute selective-op --zero 3",
     {MEGATRON_LM: "Megatron-FSDP (--use-megatron-fsdp",
      MEGATRON_DEEPSPEED: "TrainSchedule is 1F1B only",
      TORCHTITAN: None, DEEPSPEED: "no 'interleaved' pipeline schedule"}),
    ("llama-dp8-zero3-full", "llama3-8b",
     "--dp 8 --micro-batch 2 --global-batch 64 --zero 3 --recompute full",
     {MEGATRON_LM: "shards optimizer states only (ZeRO-1)", MEGATRON_DEEPSPEED: None,
      TORCHTITAN: None, DEEPSPEED: None}),
    ("gpt-pp5-uneven-fp16-selective", "gpt3-125m",
     "--pp 5 --global-batch 10 --dtype fp16 --recompute selective --no-flash-attention",
     {MEGATRON_LM: None, MEGATRON_DEEPSPEED: None, TORCHTITAN: "does not train in fp16",
      # DeepSpeed balances parameters: the embedding fills a stage of a 12-layer model.
      DEEPSPEED: "leaves a chunk without layers"}),
    ("llama-hsdp-keep-gathered", "tiny-llama",
     "--dp 8 --global-batch 8 --sharding p=partial:4,g=partial:4,o=partial:4 "
     "--no-reshard-after-forward",
     {MEGATRON_LM: "cannot run this layout", MEGATRON_DEEPSPEED: "cannot run this layout",
      TORCHTITAN: None, DEEPSPEED: "cannot run this layout"}),
    ("gpt-hpz-amsp", "tiny-gpt",
     "--dp 8 --global-batch 16 --sharding p=partial:4,g=full,o=full",
     # FSDP2 has no hpZ: the native engine's rules refuse it (HSDP is all three partial).
     {MEGATRON_LM: "does not run sharding p=partial:4,g=full,o=full",
      MEGATRON_DEEPSPEED: None,
      TORCHTITAN: "runs zero0, zero1, zero2, zero3 and HSDP",
      DEEPSPEED: None}),
    ("llama-tp2-no-sp", "tiny-llama", "--tp 2 --dp 2 --global-batch 4 --zero 3",
     # torchtitan: sequence parallelism is implied (it applies SequenceParallel with TP), so
     # the export writes the run with it and says so (test_torchtitan_sp_is_implied...).
     {MEGATRON_LM: "Megatron-FSDP", MEGATRON_DEEPSPEED: None, TORCHTITAN: None,
      DEEPSPEED: None}),
    # Context parallelism (issue 30): Megatron-LM's --context-parallel-size, torchtitan's
    # context_parallel_degree; Megatron-DeepSpeed and DeepSpeed have only Ulysses.
    ("gpt-cp2-dp2-zero1", "tiny-gpt", "--cp 2 --dp 2 --global-batch 8 --zero 1",
     {MEGATRON_LM: None, MEGATRON_DEEPSPEED: "has no context parallelism",
      TORCHTITAN: "shards parameters, gradients and optimizer states differently",
      DEEPSPEED: "DeepSpeed-Ulysses"}),
    ("llama-tp2-cp2-fsdp", "tiny-llama",
     "--tp 2 --cp 2 --dp 2 --global-batch 8 --sequence-parallel --zero 3",
     {MEGATRON_LM: "Megatron-FSDP", MEGATRON_DEEPSPEED: "has no context "
      "parallelism", TORCHTITAN: None, DEEPSPEED: "no sequence parallelism"}),
    # FP8 (issue 52): torchtitan's float8 converter with float8 FSDP all-gather; Megatron-LM's
    # --fp8-format hybrid / --fp8-recipe / --fp8-param-gather; Megatron-DeepSpeed and
    # DeepSpeed say what they support.
    ("llama-fp8-fsdp-tensorwise", "llama3-8b",
     "--dp 8 --global-batch 8 --zero 3 --recompute selective-op --dtype fp8",
     {MEGATRON_LM: "shards optimizer states only (ZeRO-1)",
      MEGATRON_DEEPSPEED: "supports FP8 only as --transformer-impl transformer_engine",
      TORCHTITAN: None, DEEPSPEED: "no fp8 precision of its own"}),
    ("llama-fp8-tp2-zero1-blockwise", "llama3-8b",
     "--tp 2 --dp 4 --global-batch 8 --zero 1 --sequence-parallel --dtype fp8 "
     "--fp8-recipe blockwise",
     {MEGATRON_LM: None, MEGATRON_DEEPSPEED: "supports FP8 only as",
      TORCHTITAN: "scaling is TransformerEngine's", DEEPSPEED: "does not train in fp8"}),
    ("llama-fp8-mxfp8-fsdp", "tiny-llama", "--dp 4 --global-batch 4 --zero 3 --dtype fp8 "
     "--fp8-recipe mxfp8", {MEGATRON_LM: "shards optimizer states only", TORCHTITAN: None,
                            MEGATRON_DEEPSPEED: "supports FP8 only as",
                            DEEPSPEED: "does not train in fp8"}),
]


def layout_of(flags: str, trainer: str = MEGATRON_DEEPSPEED):
    """flm's layout flags as `flm export --to trainer` reads them (the engine is the trainer's)."""
    p = argparse.ArgumentParser()
    add_layout_args(p, required=False)
    return layout_for(trainer, {"dtype": "bf16", **given_options(p.parse_args(shlex.split(flags)))})


GOLDEN_CASES = [(cid, m, f, t) for cid, m, f, out in CASES for t, r in out.items() if r is None]
REFUSALS = [(cid, m, f, t, r) for cid, m, f, out in CASES for t, r in out.items() if r]


@pytest.mark.parametrize("cid, model, flags, trainer", GOLDEN_CASES,
                         ids=[f"{c[0]}-{c[3]}" for c in GOLDEN_CASES])
def test_golden(cid, model, flags, trainer):
    text = export(trainer, load_model(model), layout_of(flags, trainer), load_system("frontier"))
    path = GOLDEN / f"{cid}.{trainer}.{SUFFIX[trainer]}"
    if os.environ.get("FLM_REGEN_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"{path.name} changed (FLM_REGEN_GOLDEN=1 rewrites it)"


@pytest.mark.parametrize("cid, model, flags, trainer, words", REFUSALS,
                         ids=[f"{c[0]}-{c[3]}" for c in REFUSALS])
def test_refusal_is_one_line_that_says_why(cid, model, flags, trainer, words):
    with pytest.raises(ExportRefused) as exc:
        export(trainer, load_model(model), layout_of(flags, trainer))
    message = str(exc.value)
    assert "\n" not in message and message.startswith(f"{trainer} cannot run this layout: ")
    assert words in message


def test_every_trainer_has_a_golden_and_a_refusal():
    # The table must keep exercising each exporter both ways.
    assert {c[3] for c in GOLDEN_CASES} == set(TRAINERS) == {c[3] for c in REFUSALS}


# --- Megatron: the names its arguments.py defines at the cited versions ------------------------
# Transcribed from megatron/training/arguments.py (Megatron-LM core_v0.15.3) and
# megatron/arguments.py (Megatron-DeepSpeed 4efb479): name -> type, or a tuple of choices, or
# None for a store_true switch, or StoreFalse(dest) for a store_false one. Only the names the
# exporter writes.
class StoreFalse(str):
    """A ``store_false`` switch and the dest it clears (its default is True)."""


_COMMON = {"--num-layers": int, "--hidden-size": int, "--ffn-hidden-size": int,
           "--num-attention-heads": int, "--seq-length": int, "--max-position-embeddings": int,
           "--vocab-size": int, "--swiglu": None, "--disable-bias-linear": None,
           "--untie-embeddings-and-output-weights": None, "--attention-dropout": float,
           "--hidden-dropout": float, "--tensor-model-parallel-size": int,
           "--pipeline-model-parallel-size": int, "--micro-batch-size": int,
           "--global-batch-size": int, "--sequence-parallel": None,
           "--recompute-granularity": ("full", "selective"),
           "--recompute-method": ("uniform", "block"), "--recompute-num-layers": int,
           "--bf16": None, "--fp16": None}
MEGATRON_LM_FLAGS = {**_COMMON, "--group-query-attention": None, "--num-query-groups": int,
                     "--position-embedding-type": ("learned_absolute", "rope", "mrope",
                                                   "relative", "none"),
                     "--normalization": ("LayerNorm", "RMSNorm"),
                     "--num-virtual-stages-per-pipeline-rank": int,
                     "--decoder-first-pipeline-num-layers": int,
                     "--decoder-last-pipeline-num-layers": int,
                     "--use-distributed-optimizer": None, "--context-parallel-size": int,
                     "--rotary-base": int, "--overlap-grad-reduce": None,
                     "--overlap-param-gather": None,
                     # AttnBackend in megatron/core/transformer/enums.py
                     "--attention-backend": ("flash", "fused", "unfused", "local", "auto"),
                     # _add_transformer_engine_args (core_v0.15.3 arguments.py)
                     "--fp8-format": ("e4m3", "hybrid"),
                     "--fp8-recipe": ("tensorwise", "delayed", "mxfp8", "blockwise"),
                     "--fp8-param-gather": None,
                     # _add_network_size_args (core_v0.15.3 arguments.py: type=int)
                     "--mtp-num-layers": int,
                     # _add_distributed_args (core_v0.15.3, 309ffca, arguments.py):
                     # action='store_false', dest='overlap_p2p_comm': the overlap is on unless
                     # given.
                     "--no-overlap-p2p-communication": StoreFalse("overlap_p2p_comm"),
                     # _add_training_args (core_v0.15.3, 309ffca, arguments.py):
                     # action='store_true', dest tp_comm_overlap: off unless given.
                     "--tp-comm-overlap": None}
MEGATRON_DEEPSPEED_FLAGS = {**_COMMON, "--num-key-value-heads": int,
                            "--use-rotary-position-embeddings": None,
                            "--no-position-embedding": None,
                            "--normalization": ("layernorm", "rmsnorm"),
                            "--no-pipeline-parallel": None, "--use-flash-attn-v2": None,
                            "--zero-stage": int, "--rotary-position-embeddings-theta": int,
                            # deepspeed.add_config_arguments (deepspeed/__init__.py)
                            "--deepspeed": None, "--deepspeed_config": str}


def megatron_parser(names: dict) -> argparse.ArgumentParser:
    return add_flags(argparse.ArgumentParser(exit_on_error=False), names)


def add_flags(p: argparse.ArgumentParser, names: dict) -> argparse.ArgumentParser:
    """Each flag as the trainer's parser declares it: None a switch, a tuple its choices, else
    its type."""
    for name, kind in names.items():
        if isinstance(kind, StoreFalse):
            p.add_argument(name, action="store_false", dest=str(kind))
        elif kind is None:
            p.add_argument(name, action="store_true")
        elif isinstance(kind, tuple):
            p.add_argument(name, choices=kind)
        else:
            p.add_argument(name, type=kind)
    return p


def argv_of(text: str) -> list[str]:
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    return shlex.split(body.replace("\\\n", " "))


@pytest.mark.parametrize("trainer, names", [(MEGATRON_LM, MEGATRON_LM_FLAGS),
                                            (MEGATRON_DEEPSPEED, MEGATRON_DEEPSPEED_FLAGS)])
def test_megatron_flags_parse_with_the_trainers_names(trainer, names):
    parser = megatron_parser(names)
    for _cid, model_name, flags, t in GOLDEN_CASES:
        if t != trainer:
            continue
        model, layout = load_model(model_name), layout_of(flags, trainer)
        ns = parser.parse_args(argv_of(export(trainer, model, layout)))  # unknown name: error
        assert (ns.tensor_model_parallel_size, ns.pipeline_model_parallel_size) == \
            (layout.tp, layout.pp)
        assert ns.global_batch_size == layout.global_batch
        assert ns.micro_batch_size == layout.micro_batch
        assert (ns.num_layers, ns.hidden_size, ns.ffn_hidden_size) == \
            (model.layers, model.hidden, model.ffn_hidden)
        assert ns.sequence_parallel == layout.sequence_parallel
        if trainer == MEGATRON_LM:  # its argparse default is 1
            assert (ns.context_parallel_size or 1) == layout.cp
        # fp8 is bf16 training with FP8 linears (--fp8-format hybrid on top of --bf16).
        assert (ns.bf16, ns.fp16) == (layout.dtype in ("bf16", "fp8"), layout.dtype == "fp16")
        if trainer == MEGATRON_LM and layout.dtype == "fp8":
            assert (ns.fp8_format, ns.fp8_recipe) == ("hybrid", str(layout.fp8_recipe))
            # arguments.py asserts the distributed optimizer for --fp8-param-gather.
            assert ns.fp8_param_gather and ns.use_distributed_optimizer
        # Full recomputation one block at a time: what GPTModelPipe also reads with pp > 1.
        assert ns.recompute_granularity == {"none": None, "selective": "selective",
                                            "full": "full"}[layout.recompute]
        assert (ns.recompute_method, ns.recompute_num_layers) == \
            (("uniform", 1) if layout.recompute == "full" else (None, None))


def test_megatron_lm_uneven_pipeline_and_interleaving():
    # gpt3-125m has 12 layers over 5 stages: Megatron's ends take what the middle leaves.
    model = load_model("gpt3-125m")
    ns = megatron_parser(MEGATRON_LM_FLAGS).parse_args(argv_of(export(
        MEGATRON_LM, model, layout_of("--pp 5 --global-batch 10"))))
    middle = 3 * -(-12 // 5)
    assert ns.decoder_first_pipeline_num_layers + ns.decoder_last_pipeline_num_layers \
        == 12 - middle
    # Interleaved over 2 stages runs only with the p2p overlap (test_megatron_lm_p2p_overlap).
    ns = megatron_parser(MEGATRON_LM_FLAGS).parse_args(argv_of(export(
        MEGATRON_LM, model, layout_of("--pp 2 --virtual-stages 3 --global-batch 4"),
        p2p_overlap=True)))
    assert ns.num_virtual_stages_per_pipeline_rank == 3
    assert ns.decoder_first_pipeline_num_layers is None


def test_megatron_lm_p2p_overlap_is_the_run_priced():
    """Megatron-LM core_v0.15.3 overlaps an interleaved schedule's pipeline sends unless
    --no-overlap-p2p-communication is given (store_false, dest overlap_p2p_comm); flm prices
    them exposed unless the user asks (--overlap-p2p-comm on). So the interleaved command
    carries the off-flag by default and leaves Megatron's default on when asked; 1F1B gets
    neither (validate_args turns the overlap off itself) and the setting is refused there, as
    by every trainer without it. Interleaved pp 2 with the overlap off is what validate_args
    asserts against (pp > 2), so it is refused without the overlap."""
    model, parser = load_model("gpt3-125m"), megatron_parser(MEGATRON_LM_FLAGS)
    inter = layout_of("--pp 3 --virtual-stages 2 --global-batch 6", MEGATRON_LM)
    off = export(MEGATRON_LM, model, inter)
    assert "\n--no-overlap-p2p-communication \\\n" in off  # a line of its own
    assert parser.parse_args(argv_of(off)).overlap_p2p_comm is False
    on = export(MEGATRON_LM, model, inter, p2p_overlap=True)
    assert "overlap-p2p" not in on
    assert parser.parse_args(argv_of(on)).overlap_p2p_comm is True
    assert off.replace("--no-overlap-p2p-communication \\\n", "") == on
    plain = layout_of("--pp 3 --global-batch 6", MEGATRON_LM)
    assert "overlap-p2p" not in export(MEGATRON_LM, model, plain)
    with pytest.raises(ExportRefused, match="applies to Megatron-LM's interleaved schedule"):
        export(MEGATRON_LM, model, plain, p2p_overlap=True)
    two = layout_of("--pp 2 --virtual-stages 3 --global-batch 4", MEGATRON_LM)
    with pytest.raises(ExportRefused, match="greater than 2"):
        export(MEGATRON_LM, model, two)
    assert parser.parse_args(argv_of(export(MEGATRON_LM, model, two, p2p_overlap=True))
                             ).overlap_p2p_comm is True
    llama = load_model("tiny-llama")  # a model torchtitan's llama3 builds
    titan = layout_of("--pp 2 --virtual-stages 2 --global-batch 4", TORCHTITAN)
    export(TORCHTITAN, llama, titan)
    with pytest.raises(ExportRefused, match="torchtitan has no such setting"):
        export(TORCHTITAN, llama, titan, p2p_overlap=True)


def test_export_overlap_p2p_comm_flag_and_from_plan(capsys):
    """flm export --overlap-p2p-comm on renders the overlapped run; with --from-plan the
    setting is the plan's (--plan-args), and a different one given beside it is refused."""
    base = ["export", "--to", "megatron-lm", "--model", "llama3-8b"]
    layout = ["--pp", "4", "--virtual-stages", "2", "--global-batch", "8"]
    capsys.readouterr()
    assert main([*base, *layout]) == 0
    assert "--no-overlap-p2p-communication" in capsys.readouterr().out
    assert main([*base, *layout, "--overlap-p2p-comm", "on"]) == 0
    assert "overlap-p2p" not in capsys.readouterr().out
    plan = [*base, "--system", "dgx-h100", "--from-plan", "--gpus", "16", "--global-batch",
            "64", "--plan-args"]
    inter = "--schedule interleaved --virtual-stages 2 --pp 4"
    assert main([*plan, inter]) == 0
    out = capsys.readouterr().out
    assert "--num-virtual-stages-per-pipeline-rank 2" in out
    assert "--no-overlap-p2p-communication" in out
    assert main([*plan, inter + " --overlap-p2p-comm on"]) == 0
    out = capsys.readouterr().out
    assert "--num-virtual-stages-per-pipeline-rank 2" in out and "overlap-p2p" not in out
    assert main([*plan, inter, "--overlap-p2p-comm", "on"]) == 2
    assert "give it in --plan-args" in capsys.readouterr().err


def test_megatron_lm_tp_comm_overlap_is_the_run_priced():
    """Megatron-LM core_v0.15.3 overlaps TP communication with the GEMMs only when
    --tp-comm-overlap is given (store_true), and validate_args asserts sequence parallelism
    for it. flm prices it only when asked (--tp-comm-overlap on), so the command carries the
    flag exactly then; a layout without sequence parallelism is refused with it (Megatron would
    assert), and every other trainer refuses the setting, naming what it has instead."""
    model, parser = load_model("gpt3-125m"), megatron_parser(MEGATRON_LM_FLAGS)
    sp = layout_of("--tp 2 --pp 2 --global-batch 4 --sequence-parallel", MEGATRON_LM)
    off = export(MEGATRON_LM, model, sp)
    assert "tp-comm-overlap" not in off
    assert parser.parse_args(argv_of(off)).tp_comm_overlap is False
    on = export(MEGATRON_LM, model, sp, tp_comm_overlap=True)
    assert "\n--tp-comm-overlap \\\n" in on  # a line of its own
    ns = parser.parse_args(argv_of(on))
    assert ns.tp_comm_overlap is True and ns.sequence_parallel is True
    assert on.replace("--tp-comm-overlap \\\n", "") == off
    no_sp = layout_of("--tp 2 --pp 2 --global-batch 4", MEGATRON_LM)
    export(MEGATRON_LM, model, no_sp)
    with pytest.raises(ExportRefused, match="only when sequence parallelism is enabled"):
        export(MEGATRON_LM, model, no_sp, tp_comm_overlap=True)
    llama = load_model("tiny-llama")  # a model torchtitan's llama3 builds
    titan = layout_of("--tp 2 --global-batch 4", TORCHTITAN)
    export(TORCHTITAN, llama, titan)
    with pytest.raises(ExportRefused, match="enable_async_tensor_parallel") as why:
        export(TORCHTITAN, llama, titan, tp_comm_overlap=True)
    assert len(str(why.value).splitlines()) == 1
    with pytest.raises(ExportRefused, match="has no --tp-comm-overlap"):
        export(MEGATRON_DEEPSPEED, model, layout_of("--tp 2 --pp 2 --global-batch 4"),
               tp_comm_overlap=True)
    with pytest.raises(ExportRefused, match="DeepSpeed has no such setting"):
        export(DEEPSPEED, llama, layout_of("--dp 4 --zero 1 --global-batch 4", DEEPSPEED),
               tp_comm_overlap=True)


def test_export_tp_comm_overlap_flag_and_from_plan(capsys):
    """flm export --tp-comm-overlap on renders the overlapped run (its command parses with
    Megatron-LM's names); with --from-plan the setting is the plan's (--plan-args), a
    different one beside it is refused, and a plan priced with it skips the layouts without
    sequence parallelism, which Megatron-LM would not run with it."""
    parser = megatron_parser(MEGATRON_LM_FLAGS)
    base = ["export", "--to", "megatron-lm", "--model", "llama3-8b"]
    layout = ["--tp", "2", "--pp", "2", "--global-batch", "8", "--sequence-parallel"]
    capsys.readouterr()
    assert main([*base, *layout]) == 0
    assert "tp-comm-overlap" not in capsys.readouterr().out
    assert main([*base, *layout, "--tp-comm-overlap", "on"]) == 0
    assert parser.parse_args(argv_of(capsys.readouterr().out)).tp_comm_overlap is True
    assert main([*base, *layout[:-1], "--tp-comm-overlap", "on"]) == 2
    assert "only when sequence parallelism is enabled" in capsys.readouterr().err
    plan = [*base, "--system", "dgx-h100", "--from-plan", "--gpus", "16", "--global-batch",
            "64", "--plan-args"]
    assert main([*plan, "--tp 2"]) == 0
    assert "tp-comm-overlap" not in capsys.readouterr().out
    assert main([*plan, "--tp 2 --sequence-parallel off --tp-comm-overlap on"]) == 2
    assert "runnable by megatron-lm" in capsys.readouterr().err  # every one refused
    assert main([*plan, "--tp 2 --tp-comm-overlap on"]) == 0
    ns = parser.parse_args(argv_of(capsys.readouterr().out))
    assert ns.tp_comm_overlap is True and ns.sequence_parallel is True
    assert main([*plan, "--tp 2", "--tp-comm-overlap", "on"]) == 2
    assert "give it in --plan-args" in capsys.readouterr().err
    assert main(["export", "--to", "torchtitan", "--model", "llama3-8b", "--system",
                 "dgx-h100", "--from-plan", "--gpus", "16", "--global-batch", "64",
                 "--plan-args", "--tp-comm-overlap on"]) == 2
    err = capsys.readouterr().err
    assert "async tensor parallelism" in err and len(err.strip().splitlines()) == 1


def test_megatron_gqa_spelled_per_trainer():
    model, layout = load_model("llama3-8b"), layout_of("--tp 8 --pp 1 --global-batch 1")
    lm = megatron_parser(MEGATRON_LM_FLAGS).parse_args(argv_of(export(MEGATRON_LM, model,
                                                                      layout)))
    assert lm.group_query_attention and lm.num_query_groups == 8
    assert lm.position_embedding_type == "rope" and lm.normalization == "RMSNorm"
    ds = megatron_parser(MEGATRON_DEEPSPEED_FLAGS).parse_args(argv_of(export(
        MEGATRON_DEEPSPEED, model, layout)))
    assert ds.num_key_value_heads == 8 and ds.use_rotary_position_embeddings


# --- torchtitan: tomllib and the keys of job_config.py (v0.2.2) --------------------------------
# Section -> key -> the type its dataclass field has in torchtitan/config/job_config.py.
TORCHTITAN_KEYS = {
    "model": {"name": str, "flavor": str},
    "training": {"local_batch_size": int, "global_batch_size": int, "seq_len": int,
                 "mixed_precision_param": str},
    "parallelism": {"data_parallel_replicate_degree": int, "data_parallel_shard_degree": int,
                    "fsdp_reshard_after_forward": str, "tensor_parallel_degree": int,
                    "pipeline_parallel_degree": int, "pipeline_parallel_schedule": str,
                    "pipeline_parallel_microbatch_size": int, "module_fqns_per_model_part": list,
                    "context_parallel_degree": int, "context_parallel_rotate_method": str},
    "activation_checkpoint": {"mode": str, "selective_ac_option": str},
    # fp8: Model.converters, Compile, and [quantize.linear.float8] / [quantize.linear.mx]
    # (Float8Linear, MXLinear; test_torchtitan_fp8_sections checks their keys).
    "compile": {"enable": bool, "components": list},
    "quantize": {"linear": dict},
}
TORCHTITAN_KEYS["model"]["converters"] = list
# job_config.py v0.2.2: Float8Linear's and MXLinear's fields and types.
TORCHTITAN_QUANTIZE = {
    "float8": {"enable_fsdp_float8_all_gather": bool,
               "precompute_float8_dynamic_scale_for_fsdp": bool, "recipe_name": str,
               "filter_fqns": list, "emulate": bool},
    "mx": {"mxfp8_dim1_cast_kernel_choice": str, "recipe_name": str, "filter_fqns": list},
}
TORCHTITAN_LITERALS = {"fsdp_reshard_after_forward": ("default", "always", "never"),
                       "mixed_precision_param": ("bfloat16", "float32"),
                       "mode": ("selective", "full", "memory_budget", "none"),
                       "pipeline_parallel_schedule": ("1F1B", "GPipe", "Interleaved1F1B"),
                       "context_parallel_rotate_method": ("allgather", "alltoall")}


def test_torchtitan_toml_has_only_job_config_keys_and_consistent_degrees():
    for _cid, model_name, flags, t in GOLDEN_CASES:
        if t != TORCHTITAN:
            continue
        model, layout = load_model(model_name), layout_of(flags, TORCHTITAN)
        doc = tomllib.loads(export(TORCHTITAN, model, layout))
        for section, keys in doc.items():
            for key, value in keys.items():
                assert isinstance(value, TORCHTITAN_KEYS[section][key]), (section, key)
                if key in TORCHTITAN_LITERALS:
                    assert value in TORCHTITAN_LITERALS[key], (key, value)
        par, tr = doc["parallelism"], doc["training"]
        world = (par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
                 * par["tensor_parallel_degree"] * par["pipeline_parallel_degree"]
                 * par.get("context_parallel_degree", 1))
        assert world == layout.world_size
        assert tr["global_batch_size"] == layout.global_batch
        if layout.pp > 1:
            parts = par["module_fqns_per_model_part"]
            assert len(parts) == layout.pp * layout.virtual_stages
            assert sum(len([m for m in p if m.startswith("layers.")]) for p in parts) \
                == model.layers
            assert tr["local_batch_size"] % par["pipeline_parallel_microbatch_size"] == 0


def test_torchtitan_fp8_sections():
    """The converter the TOML names has its section, with Float8Linear's / MXLinear's keys;
    tensorwise under FSDP gathers in float8 (the cost model's FP8 all-gather)."""
    seen = set()
    for _cid, model_name, flags, t in GOLDEN_CASES:
        if t != TORCHTITAN or "--dtype fp8" not in flags:
            continue
        model, layout = load_model(model_name), layout_of(flags, TORCHTITAN)
        doc = tomllib.loads(export(TORCHTITAN, model, layout))
        (kind, keys), = doc["quantize"]["linear"].items()
        assert doc["model"]["converters"] == [f"quantize.linear.{kind}"]
        for key, value in keys.items():
            assert isinstance(value, TORCHTITAN_QUANTIZE[kind][key]), (kind, key)
        assert keys["filter_fqns"] == ["output"] and doc["compile"]["enable"] is True
        if kind == "float8":
            assert keys["recipe_name"] in ("tensorwise", "rowwise", "rowwise_with_gw_hp")
            assert keys["enable_fsdp_float8_all_gather"] is True
        seen.add(kind)
    assert seen == {"float8", "mx"}


def test_torchtitan_hsdp_degrees():
    cfg = job_config(load_model("tiny-llama"), layout_of(
        "--dp 8 --global-batch 8 --sharding p=partial:2,g=partial:2,o=partial:2", TORCHTITAN))
    assert (cfg["parallelism"]["data_parallel_shard_degree"],
            cfg["parallelism"]["data_parallel_replicate_degree"]) == (2, 4)


def test_torchtitan_shards_over_dp_shard_times_cp():
    # flm shards over dp x cp; torchtitan's FSDP mesh is dp_shard x cp (parallel_dims.py).
    model = load_model("tiny-llama")
    cfg = job_config(model, layout_of(
        "--cp 2 --dp 4 --global-batch 8 --sharding p=partial:4,g=partial:4,o=partial:4",
        TORCHTITAN))["parallelism"]
    assert (cfg["data_parallel_shard_degree"], cfg["data_parallel_replicate_degree"],
            cfg["context_parallel_degree"]) == (2, 2, 2)
    cfg = job_config(model, layout_of("--cp 4 --global-batch 8 --zero 3", TORCHTITAN))
    assert cfg["parallelism"]["data_parallel_shard_degree"] == 1
    assert cfg["parallelism"]["context_parallel_degree"] == 4
    # seq_len 18 passes flm's rules at tp 2, cp 3 (18 % 6, 18 / 3 % 2) but not torchtitan's
    # seq_len_divisor, tp x 2 x cp = 12.
    short = model.__class__(**{**model.to_dict(), "seq_len": 18})
    with pytest.raises(ExportRefused, match="not divisible by tp x 2 x cp = 12"):
        job_config(short, layout_of("--tp 2 --cp 3 --global-batch 8 --sequence-parallel "
                                    "--zero 3", TORCHTITAN))
    for flags, words in (("--cp 2 --dp 2 --global-batch 8 --zero 0", "never replicated"),
                         ("--cp 4 --dp 2 --global-batch 8 --sharding "
                          "p=partial:2,g=partial:2,o=partial:2", "a multiple of cp")):
        with pytest.raises(ExportRefused, match=words):
            job_config(model, layout_of(flags, TORCHTITAN))


# --- DeepSpeed: its own config class reads what we emit ----------------------------------------
class _DataParallelOnly:
    """The mpu DeepSpeedConfig asks for the data-parallel world size (no process group)."""

    def __init__(self, dp: int) -> None:
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp


def test_autotp_ds_config_never_yields_a_tp_times_larger_batch(monkeypatch):
    """Issue 36 d: an AutoTP ds_config without train_batch_size let DeepSpeed, given no mpu,
    count the tp x dp world as data parallel and derive a batch (and samples/s) tp x too large.
    Stated, DeepSpeed's own DeepSpeedConfig either agrees with the layout (an mpu of dp) or
    refuses it (no mpu): it never takes the inflated figure."""
    pytest.importorskip("deepspeed")
    from deepspeed.runtime import config as ds_runtime_config
    from deepspeed.runtime.config import DeepSpeedConfig

    model, layout = load_model("tiny-llama"), layout_of(
        "--tp 2 --dp 2 --global-batch 4 --zero 3", DEEPSPEED)
    cfg = json.loads(export(DEEPSPEED, model, layout))
    assert cfg["tensor_parallel"]["autotp_size"] == 2
    assert cfg["train_batch_size"] == layout.global_batch == 4
    assert (cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"]
            * layout.dp) == layout.global_batch
    monkeypatch.setattr(ds_runtime_config.dist, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(ds_runtime_config.dist, "get_world_size",
                        lambda *a, **k: layout.world_size)
    assert DeepSpeedConfig(dict(cfg), mpu=_DataParallelOnly(layout.dp)).train_batch_size == 4
    with pytest.raises(AssertionError, match="train_batch_size is not equal"):
        DeepSpeedConfig(dict(cfg), mpu=None)


@pytest.mark.parametrize("trainer", [DEEPSPEED, MEGATRON_DEEPSPEED])
def test_deepspeed_config_class_accepts_the_ds_config(trainer, monkeypatch):
    pytest.importorskip("deepspeed")
    from deepspeed.runtime import config as ds_runtime_config
    from deepspeed.runtime.config import DeepSpeedConfig

    # Rank 0 of a world of the layout's size, without a process group: DeepSpeedConfig then
    # checks train_batch_size against that world (or the mpu's data-parallel size) as it would
    # in the job, instead of falling back to a world of one.
    monkeypatch.setattr(ds_runtime_config.dist, "get_rank", lambda *a, **k: 0)

    checked = 0
    for _cid, model_name, flags, t in GOLDEN_CASES:
        if t != trainer:
            continue
        model, layout = load_model(model_name), layout_of(flags, trainer)
        cfg = ds_config(model, layout, for_megatron=trainer == MEGATRON_DEEPSPEED)
        if trainer == DEEPSPEED:
            assert cfg == json.loads(export(DEEPSPEED, model, layout))
        # The mpu gives dp: Megatron's, or for AutoTP the one flm export tells the user to pass.
        monkeypatch.setattr(ds_runtime_config.dist, "get_world_size",
                            lambda *a, w=layout.world_size, **k: w)
        parsed = DeepSpeedConfig(json.loads(json.dumps(cfg)), mpu=_DataParallelOnly(layout.dp))
        # The batch DeepSpeed divides by the step time for its samples/s (issue 36 d).
        assert parsed.train_batch_size == layout.global_batch
        assert parsed.zero_optimization_stage == cfg["zero_optimization"]["stage"]
        assert parsed.train_micro_batch_size_per_gpu == layout.micro_batch
        assert parsed.gradient_accumulation_steps == layout.num_microbatches
        assert parsed.bfloat16_config.enabled == (layout.dtype == "bf16")
        checked += 1
    assert checked >= 2


# --- the command line --------------------------------------------------------------------------
def _run(capsys, argv):
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse's refusal
        rc = exc.code
    out = capsys.readouterr()
    return rc, out.out, out.err.strip().splitlines()


@pytest.mark.parametrize("argv, words", [
    (["export", "--to", "nemo", "--model", "tiny-gpt", "--tp", "1"], "invalid choice: 'nemo'"),
    (["export", "--to", "deepspeed", "--tp", "1"], "required: --model"),
    (["export", "--to", "deepspeed", "--model", "tiny-gpt"], "give the layout one way"),
    (["export", "--to", "deepspeed", "--model", "tiny-gpt", "--tp", "2", "--from-plan",
      "--gpus", "2"], "got layout flags and --from-plan"),
    (["export", "--to", "megatron-lm", "--model", "tiny-gpt", "--dp", "4", "--global-batch", "4",
      "--zero", "3"], "megatron-lm cannot run this layout"),
    (["export", "--to", "megatron-lm", "--model", "tiny-gpt", "--system", "cpu-local-fit",
      "--from-plan", "--gpus", "2", "--rank", "100000"], "there is no rank 100000"),
    (["export", "--to", "torchtitan", "--model", "tiny-gpt", "--from-best", "{tmp}/none.yaml"],
     "none.yaml"),
    (["export", "--to", "megatron-lm", "--model", "tiny-gpt", "--from-plan", "--gpus", "8",
      "--plan-args=--bogus"], "unrecognized arguments: --bogus"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, argv, words):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    rc, out, err = _run(capsys, argv)
    assert rc == 2 and out == ""
    assert len(err) == 1 and words in err[0], err


def test_from_plan_is_flm_plans_rank(capsys, tmp_path):
    from frontier_llm.planner import SearchSpace, plan

    model, system = load_model("tiny-gpt"), load_system("cpu-local-fit")
    # What `flm plan --model tiny-gpt --system cpu-local-fit --gpus 8 --engine megatron` ranks.
    result = plan(model, system, 8, None, SearchSpace(dtype="bf16", engine=("megatron",)))
    second = result.layout(int(result.ranked_indices(None, fits_only=True, frontier=True)[1]))
    assert second.engine == "megatron"
    out = tmp_path / "args.txt"
    rc, _, err = _run(capsys, ["export", "--to", "megatron-deepspeed", "--model", "tiny-gpt",
                               "--system", "cpu-local-fit", "--from-plan", "--gpus", "8",
                               "--plan-args", "--engine megatron", "--rank", "2",
                               "--out", str(out), "--ds-config", str(tmp_path / "ds.json")])
    assert rc == 0, err
    assert out.read_text() == export(MEGATRON_DEEPSPEED, model, second, system,
                                     ds_config_path=str(tmp_path / "ds.json"))
    written = json.loads((tmp_path / "ds.json").read_text())
    assert written == ds_config(model, second, for_megatron=True)


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_from_best_reads_the_tune_best_document(capsys, tmp_path, fmt):
    import yaml

    model, layout = load_model("tiny-llama"), layout_of("--tp 2 --dp 2 --global-batch 8 "
                                                        "--sequence-parallel --zero 3", TORCHTITAN)
    # The shape `flm tune best` writes (tune/report.py best_document): the layout with the bench
    # arguments folded into it in the trial, popped out beside it.
    doc = {"study": "s", "trial": 3, "throughput_per_gpu": 1.0,
           "layout": layout.to_dict(), "bench_args": {"steps": 5}, "measured": {},
           "predicted": {}, "run_id": "r", "flm_bench": "flm bench ..."}
    path = tmp_path / f"best.{fmt}"
    path.write_text(yaml.safe_dump(doc) if fmt == "yaml" else json.dumps(doc))
    rc, out, err = _run(capsys, ["export", "--to", "torchtitan", "--model", "tiny-llama",
                                 "--from-best", str(path)])
    assert rc == 0, err
    assert out == export(TORCHTITAN, model, layout)


def test_torchtitan_compiles_what_the_plan_priced_fused():
    """flm plan prices element-wise work fused (torch.compile) unless --eager; torchtitan runs
    eager unless [compile] enable = true (Compile.enable defaults to false, job_config.py
    v0.2.2). The TOML had no [compile]: the run was not the layout that was ranked."""
    model = load_model("llama3-8b")
    layout = layout_of("--tp 2 --dp 4 --zero 3 --global-batch 64", TORCHTITAN)
    assert tomllib.loads(export(TORCHTITAN, model, layout))["compile"] == {"enable": True}
    assert "compile" not in tomllib.loads(export(TORCHTITAN, model, layout, compiled=False))


@pytest.mark.parametrize(("trainer", "words"), [
    (MEGATRON_LM, "its distributed optimizer (--use-distributed-optimizer) shards optimizer "
                  "states only"),
    (TORCHTITAN, "torchtitan's llama3"),
])
def test_a_pipeline_without_a_global_batch_is_refused_for_the_trainers_reason(trainer, words):
    """Unstated, the global batch was micro_batch x dp: one micro-batch for a pipeline, which no
    schedule runs, so pp 2 was refused by that engine rule ('needs at least one micro-batch per
    stage', 'engine megatron does not run sharding zero3') before the trainer's own reason."""
    with pytest.raises(ExportRefused) as exc:
        export(trainer, load_model("gpt-22b"), layout_of("--pp 2 --dp 4 --zero 3", trainer))
    assert words in str(exc.value), str(exc.value)


def test_a_pipeline_without_a_global_batch_gets_one_micro_batch_per_stage():
    layout = layout_of("--pp 4 --dp 2 --micro-batch 2", MEGATRON_LM)
    assert layout.global_batch == 2 * 2 * 4
    stated = layout_of("--pp 4 --dp 2 --global-batch 64", MEGATRON_LM)
    assert stated.global_batch == 64
