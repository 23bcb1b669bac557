"""What Megatron-LM's and Megatron-DeepSpeed's ``pretrain_gpt.py`` flags share: the model's shape,
recomputation, precision, degrees and batches, and the flags file's form.

Every flag name is one its ``arguments.py`` defines at the version docs/export.md cites
(Megatron-LM ``core_v0.15.3``, Megatron-DeepSpeed ``4efb479``; DeepSpeed's own
``--deepspeed`` / ``--deepspeed_config`` come from ``deepspeed.add_config_arguments``). Data,
tokenizer, optimizer and checkpoint flags are the user's: only the model's shape and the layout
are written here.
"""

from __future__ import annotations

from frontier_llm.specs.layout import DType, Layout, Recompute
from frontier_llm.specs.model import ModelSpec
from frontier_llm.trainers.text import comment_lines, shell_word

DEFAULT_DS_CONFIG = "ds_config.json"


def model_args(model: ModelSpec, deepspeed: bool) -> list[str]:
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


def recompute_args(layout: Layout) -> list[str]:
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


def dtype_args(layout: Layout) -> list[str]:
    return {DType.BF16: ["--bf16"], DType.FP16: ["--fp16"], DType.FP32: []}[layout.dtype]


def batch_and_degrees(layout: Layout) -> list[str]:
    return ["--tensor-model-parallel-size", str(layout.tp),
            "--pipeline-model-parallel-size", str(layout.pp),
            "--micro-batch-size", str(layout.micro_batch),
            "--global-batch-size", str(layout.global_batch)]


def render_argv(argv: list[str], header: list[str]) -> str:
    """Flags one per line (a flag with its value), continued with backslashes, under ``#``
    comment lines: pasted after ``pretrain_gpt.py`` in a job script, or read back whole by the
    shell (docs/export.md: ``eval "set -- $(cat FILE)"``). Every value is one shell word
    (shlex.quote) and every comment one line (trainers/text.py), so no name or path, whatever
    it holds, becomes a flag of its own."""
    lines, i = [], 0
    while i < len(argv):
        takes_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
        lines.append(" ".join(shell_word(a) for a in argv[i:i + 1 + takes_value]))
        i += 1 + takes_value
    return comment_lines(header) + " \\\n".join(lines) + "\n"


__all__ = ["DEFAULT_DS_CONFIG", "batch_and_degrees", "dtype_args", "model_args",
           "recompute_args", "render_argv"]
