"""A layout as ``pretrain_gpt.py`` flags of Megatron-LM and of Megatron-DeepSpeed.

Every flag name is one its ``arguments.py`` defines at the version docs/export.md cites
(Megatron-LM ``core_v0.15.3``, Megatron-DeepSpeed ``4efb479``; DeepSpeed's own
``--deepspeed`` / ``--deepspeed_config`` come from ``deepspeed.add_config_arguments``). Data,
tokenizer, optimizer and checkpoint flags are the user's: only the model's shape and the layout
are written here.
"""

from __future__ import annotations

import shlex

from frontier_llm.export.deepspeed import zero_stage
from frontier_llm.export.refusals import check_engine_rules, check_megatron_deepspeed
from frontier_llm.specs.layout import DType, Engine, Layout, Recompute, Schedule
from frontier_llm.specs.model import ModelSpec

MEGATRON_LM, MEGATRON_DEEPSPEED = "megatron-lm", "megatron-deepspeed"
DEFAULT_DS_CONFIG = "ds_config.json"


def _model_args(model: ModelSpec, deepspeed: bool) -> list[str]:
    """The model's shape and style. The two trainers spell GQA, RoPE and the norm differently."""
    argv = ["--num-layers", str(model.layers), "--hidden-size", str(model.hidden),
            "--ffn-hidden-size", str(model.ffn_hidden),
            "--num-attention-heads", str(model.heads)]
    if model.kv_heads != model.heads:
        argv += (["--num-key-value-heads", str(model.kv_heads)] if deepspeed else
                 ["--group-query-attention", "--num-query-groups", str(model.kv_heads)])
    argv += ["--seq-length", str(model.seq_len), "--max-position-embeddings", str(model.seq_len),
             "--vocab-size", str(model.vocab)]
    if model.position == "rope":
        argv += (["--use-rotary-position-embeddings", "--no-position-embedding"] if deepspeed
                 else ["--position-embedding-type", "rope"])
    elif not deepspeed:
        argv += ["--position-embedding-type", "learned_absolute"]
    rms = model.norm == "rmsnorm"
    # Megatron-LM's choices are 'LayerNorm'/'RMSNorm', Megatron-DeepSpeed's 'layernorm'/'rmsnorm'.
    norm = ("rmsnorm" if rms else "layernorm") if deepspeed else ("RMSNorm" if rms else "LayerNorm")
    argv += ["--normalization", norm]
    if model.activation == "swiglu":
        argv.append("--swiglu")
    if not model.bias:
        argv.append("--disable-bias-linear")
    if not model.tied_embeddings:
        argv.append("--untie-embeddings-and-output-weights")
    # Both default to 0.1 dropout; the model's own value (Llama: 0) is written out.
    argv += ["--attention-dropout", f"{model.dropout:g}", "--hidden-dropout", f"{model.dropout:g}"]
    return argv


def _recompute_args(layout: Layout) -> list[str]:
    """``--recompute-granularity selective`` recomputes the attention core (its default module,
    ``core_attn``); full recomputes every block, one at a time. Megatron-DeepSpeed's
    ``GPTModelPipe`` reads the same flags (full + uniform: its PipelineModule's checkpoint
    interval is ``--recompute-num-layers``; megatron/model/gpt_model.py)."""
    if layout.recompute == Recompute.SELECTIVE:
        return ["--recompute-granularity", "selective"]
    if layout.recompute == Recompute.FULL:
        return ["--recompute-granularity", "full", "--recompute-method", "uniform",
                "--recompute-num-layers", "1"]
    return []


def _dtype_args(layout: Layout) -> list[str]:
    return {DType.BF16: ["--bf16"], DType.FP16: ["--fp16"], DType.FP32: []}[layout.dtype]


def _batch_and_degrees(layout: Layout) -> list[str]:
    return ["--tensor-model-parallel-size", str(layout.tp),
            "--pipeline-model-parallel-size", str(layout.pp),
            "--micro-batch-size", str(layout.micro_batch),
            "--global-batch-size", str(layout.global_batch)]


def megatron_lm_argv(model: ModelSpec, layout: Layout) -> list[str]:
    """Megatron-LM ``pretrain_gpt.py`` flags (ExportRefused where it cannot run the layout)."""
    layout = check_engine_rules(MEGATRON_LM, Engine.MEGATRON, layout, model)
    argv = _model_args(model, deepspeed=False) + _batch_and_degrees(layout)
    if layout.cp > 1:
        # Its --cp-comm-type stays at its default, p2p: the ring exchange of K/V blocks that
        # the megatron engine stands for. Megatron's own seq-length check (a multiple of 2 x cp)
        # is the layout's (Layout.check_model).
        argv += ["--context-parallel-size", str(layout.cp)]
    if layout.schedule == Schedule.INTERLEAVED:
        argv += ["--num-virtual-stages-per-pipeline-rank", str(layout.virtual_stages)]
    elif layout.pp > 1:
        # Megatron's split: the middle stages take the even share, the ends what the
        # --decoder-first/last flags give them (specs/pipeline_split.py "first_last").
        counts = layout.stage_layers(model)
        if len(set(counts)) > 1:
            argv += ["--decoder-first-pipeline-num-layers", str(counts[0]),
                     "--decoder-last-pipeline-num-layers", str(counts[-1])]
    if layout.sequence_parallel:
        argv.append("--sequence-parallel")
    argv += _recompute_args(layout)
    if layout.zero_stage == 1 and layout.shard_ranks > 1:
        # The distributed optimizer shards optimizer states over the DP ranks: ZeRO-1. With
        # cp those are dp x cp (its data-parallel group "with context parallel", as flm's).
        argv.append("--use-distributed-optimizer")
    argv += _dtype_args(layout)
    argv += ["--attention-backend", "flash" if layout.flash_attention else "unfused"]
    return argv


def megatron_deepspeed_argv(model: ModelSpec, layout: Layout,
                            ds_config: str = DEFAULT_DS_CONFIG) -> list[str]:
    """Megatron-DeepSpeed ``pretrain_gpt.py`` flags with ``--deepspeed``: ZeRO, micro-batch and
    precision also live in the ds_config at ``ds_config`` (``flm export --to
    megatron-deepspeed --ds-config PATH`` writes it)."""
    layout = check_megatron_deepspeed(MEGATRON_DEEPSPEED, layout, model)
    argv = _model_args(model, deepspeed=True) + _batch_and_degrees(layout)
    if layout.pp == 1:
        # Without it Megatron-DeepSpeed builds GPTModelPipe even for one stage.
        argv.append("--no-pipeline-parallel")
    if layout.sequence_parallel:
        argv.append("--sequence-parallel")
    argv += _recompute_args(layout)
    argv += _dtype_args(layout)
    if layout.flash_attention:
        argv.append("--use-flash-attn-v2")
    argv += ["--deepspeed", "--deepspeed_config", ds_config,
             "--zero-stage", str(zero_stage(MEGATRON_DEEPSPEED, layout))]
    return argv


def render_argv(argv: list[str], header: list[str]) -> str:
    """Flags one per line (a flag with its value), continued with backslashes, under ``#``
    comment lines: pasted after ``pretrain_gpt.py`` in a job script."""
    lines, i = [], 0
    while i < len(argv):
        takes_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
        lines.append(" ".join(shlex.quote(a) for a in argv[i:i + 1 + takes_value]))
        i += 1 + takes_value
    body = " \\\n".join(lines)
    return "".join(f"# {h}\n" for h in header) + body + "\n"


__all__ = ["DEFAULT_DS_CONFIG", "MEGATRON_DEEPSPEED", "MEGATRON_LM", "megatron_deepspeed_argv",
           "megatron_lm_argv", "render_argv"]
