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
from frontier_llm.trainers.refusals import refuse
from frontier_llm.trainers.text import comment_lines, shell_word

DEFAULT_DS_CONFIG = "ds_config.json"

# Each layout degree's and batch's flag (flag -> layout field), spelled alike by both trainers:
# the export writes these, and the log reader (trainers/megatron_log.py) reads the values the
# arguments block prints under each flag's argparse dest (:func:`dest`:
# ``tensor_model_parallel_size``).
DEGREE_FLAGS = {
    "--tensor-model-parallel-size": "tp", "--pipeline-model-parallel-size": "pp",
    "--context-parallel-size": "cp", "--expert-model-parallel-size": "ep",
    "--micro-batch-size": "micro_batch", "--global-batch-size": "global_batch",
}
FLAG = {field: flag for flag, field in DEGREE_FLAGS.items()}
SEQUENCE_PARALLEL_FLAG = "--sequence-parallel"
# The experts' tensor-parallel degree (Megatron-LM's _add_moe_args at 309ffca: "Default is None,
# which will be set to the value of --tensor-model-paralle-size"; validate_args then prints tp
# under it). Written only where the layout's etp differs from tp (specs/axes.py: stored 0).
EXPERT_TP_FLAG = "--expert-tensor-parallel-size"
RECOMPUTE_FLAG = "--recompute-granularity"
# Settings no flag sets as such: validate_args computes them and the block prints them
# (megatron/training/arguments.py at 309ffca: data_parallel_size = world / (tp x pp x cp);
# virtual_pipeline_model_parallel_size = --num-virtual-stages-per-pipeline-rank, None for 1).
VIRTUAL_STAGES_FLAG = "--num-virtual-stages-per-pipeline-rank"
PRINTED = {"data_parallel_size": "dp", "virtual_pipeline_model_parallel_size": "virtual_stages"}
# Uneven pipeline stages (flag -> layout field; Megatron-LM only, _add_distributed_args at
# 309ffca; TransformerConfig's num_layers_in_first/last_pipeline_stage take their values):
# the export writes the layout's given ends, or the ends of Megatron's split flm plans where the
# layers do not divide (specs/pipeline_split.py); the log reader reads them back.
STAGE_LAYER_FLAGS = {"--decoder-first-pipeline-num-layers": "first_stage_layers",
                     "--decoder-last-pipeline-num-layers": "last_stage_layers"}
# Multi-token prediction modules (model field mtp_layers; arguments.py at 309ffca:
# ``--mtp-num-layers``, "Number of Multi-Token Prediction (MTP) Layers").
MTP_FLAG = "--mtp-num-layers"
# The sharding flags: Megatron-LM's distributed optimizer (ZeRO-1), Megatron-DeepSpeed's stage.
DISTRIBUTED_OPTIMIZER_FLAG = "--use-distributed-optimizer"
ZERO_STAGE_FLAG = "--zero-stage"


def dest(flag: str) -> str:
    """The name argparse stores a flag's value under, as the arguments block prints it."""
    return flag.removeprefix("--").replace("-", "_")


def model_args(model: ModelSpec, deepspeed: bool) -> list[str]:
    """The model's shape and style. The two trainers spell GQA, RoPE and the norm differently."""
    argv = ["--num-layers", str(model.layers), "--hidden-size", str(model.hidden),
            "--ffn-hidden-size", str(model.ffn_hidden),
            "--num-attention-heads", str(model.heads)]
    if model.is_mla:
        argv += mla_args(model, deepspeed)
    elif model.kv_heads != model.heads:
        argv += (["--num-key-value-heads", str(model.kv_heads)] if deepspeed else
                 ["--group-query-attention", "--num-query-groups", str(model.kv_heads)])
    if not model.is_mla and model.head_dim * model.heads != model.hidden:
        # Both default kv_channels to hidden / heads (validate_args); Qwen3's and gpt-oss's
        # heads are wider or narrower than that.
        argv += [KV_CHANNELS_FLAG, str(model.head_dim)]
    argv += ["--seq-length", str(model.seq_len), "--max-position-embeddings", str(model.seq_len),
             "--vocab-size", str(model.vocab)]
    if model.position == "rope":
        argv += (["--use-rotary-position-embeddings", "--no-position-embedding"] if deepspeed
                 else ["--position-embedding-type", "rope"])
        # The model's RoPE base; both default to 10000 and take an integer (Megatron-LM
        # --rotary-base, Megatron-DeepSpeed --rotary-position-embeddings-theta, dest rope_theta).
        argv += [ROPE_BASE_FLAG[deepspeed], rope_base(model, deepspeed)]
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


ROPE_BASE_FLAG = {False: "--rotary-base", True: "--rotary-position-embeddings-theta"}
# Each head's width: Megatron-LM's and Megatron-DeepSpeed's --kv-channels (both arguments.py,
# "_add_network_size_args"; default hidden_size // num_attention_heads).
KV_CHANNELS_FLAG = "--kv-channels"
# Megatron-LM's multi-head latent attention (core_v0.15.3, megatron/training/arguments.py:
# --multi-latent-attention in _add_network_size_args, the rest in _add_mla_args): field -> flag.
# Its --qk-head-dim is the per-head Q·K width without RoPE ("q_head_dim = qk_head_dim +
# qk_pos_emb_head_dim"), flm's qk_nope_head_dim; --q-lora-rank's default None is a full-rank
# query projection, flm's 0.
MLA_FLAG = "--multi-latent-attention"
MLA_FLAGS = {"q_lora_rank": "--q-lora-rank", "kv_lora_rank": "--kv-lora-rank",
             "qk_nope_head_dim": "--qk-head-dim", "qk_rope_head_dim": "--qk-pos-emb-head-dim",
             "v_head_dim": "--v-head-dim"}


def mla_args(model: ModelSpec, deepspeed: bool) -> list[str]:
    """Megatron-LM's MLA flags; Megatron-DeepSpeed has no MLA (refused)."""
    if deepspeed:
        raise refuse("megatron-deepspeed", f"{model.name} uses multi-head latent attention, "
                     "which Megatron-DeepSpeed does not implement; use --to megatron-lm "
                     "(--multi-latent-attention)")
    argv = [MLA_FLAG]
    for field, flag in MLA_FLAGS.items():
        if field == "q_lora_rank" and not model.q_lora_rank:
            continue  # None: the full-rank query projection
        argv += [flag, str(getattr(model, field))]
    # MLA takes YaRN RoPE by default (--rope-type help; MLATransformerConfig.rope_type "yarn"):
    # flm's model is plain RoPE (its rope_base), as pre-training runs before context extension.
    return [*argv, "--rope-type", "rope"]


def rope_base(model: ModelSpec, deepspeed: bool) -> str:
    """The RoPE base as the integer both trainers' ``type=int`` flags take."""
    if model.rope_base != int(model.rope_base):
        raise refuse("megatron-deepspeed" if deepspeed else "megatron-lm",
                     f"{ROPE_BASE_FLAG[deepspeed]} takes an integer (type=int) and "
                     f"{model.name}'s rope_base is {model.rope_base:g}")
    return str(int(model.rope_base))


def moe_layer_freq(model: ModelSpec) -> str:
    """``--moe-layer-freq``: an integer N where the MoE blocks are every N-th from the first
    (Megatron's pattern ``i % N == 0``, megatron/core/models/gpt/gpt_layer_specs.py), else the
    list form its ``moe_freq_type`` evaluates (digits, commas, brackets, ``+``, ``*`` only:
    ``_eval_pattern``, megatron/training/arguments.py), one 0/1 per block."""
    if model.dense_layers == 0:
        return str(model.moe_layer_freq)
    pattern = [int(model.moe_block(i)) for i in range(model.layers)]
    return "[" + ",".join(map(str, pattern)) + "]"


def moe_args(model: ModelSpec, layout: Layout) -> list[str]:
    """Megatron-LM's MoE flags (``_add_moe_args``, megatron/training/arguments.py at 309ffca)
    for an MoE model; nothing for a dense one. Expert-tp stays at its default, tp
    (``--expert-tensor-parallel-size`` None), unless the layout's etp differs from tp."""
    if not model.is_moe:
        return []
    argv = ["--num-experts", str(model.num_experts), "--moe-router-topk", str(model.top_k),
            "--moe-ffn-hidden-size", str(model.expert_ffn_hidden),
            "--moe-layer-freq", moe_layer_freq(model)]
    if model.shared_experts:
        # "num_shared_experts * ffn_size_of_each_shared_expert" (its help).
        argv += ["--moe-shared-expert-intermediate-size",
                 str(model.shared_experts * model.expert_ffn_hidden)]
    if model.router_aux_loss > 0:
        # aux_loss: "the load balancing loss used in GShard and SwitchTransformer", on each
        # micro-batch; global_aux_loss: "calculated at global batch level"
        # (transformer_config.py, NVIDIA/Megatron-LM@d98e8a64).
        kind = "global_aux_loss" if model.router_balance == "aux-loss-global" else "aux_loss"
        argv += ["--moe-router-load-balancing-type", kind,
                 "--moe-aux-loss-coeff", f"{model.router_aux_loss:g}"]
    else:
        argv += ["--moe-router-load-balancing-type", "none"]
    if model.router_balance == "aux-free":
        # "TopK routing with dynamic per-expert bias in the aux-loss-free load balancing
        # strategy" (transformer_config.py, NVIDIA/Megatron-LM@d98e8a64).
        argv += ["--moe-router-enable-expert-bias"]
    elif model.router_balance == "forced":
        argv += ["--moe-router-force-load-balancing"]
    if model.n_group:
        # Group-limited routing (node-limited with a group per node), same file.
        argv += ["--moe-router-num-groups", str(model.n_group),
                 "--moe-router-group-topk", str(model.topk_group)]
    if model.capacity_factor is not None:
        argv += ["--moe-expert-capacity-factor", f"{model.capacity_factor:g}"]
    if layout.ep > 1:
        # "We recommend using 'alltoall' when applying expert parallelism" (its help): the
        # all-to-all dispatch and combine flm's cost model and flm bench stand for.
        argv += [FLAG["ep"], str(layout.ep),
                 "--moe-token-dispatcher-type", "alltoall"]
    if layout.etp:
        argv += [EXPERT_TP_FLAG, str(layout.etp)]
    return argv


def stage_layer_args(model: ModelSpec, layout: Layout) -> list[str]:
    """``--decoder-first/last-pipeline-num-layers``: the layout's given ends (only those given:
    Megatron splits the rest evenly over the other stages, as flm does); without them, both ends
    of the split flm plans where the layers do not divide over pp (not interleaved: the
    engine's rule refuses its own uneven split interleaved). Nothing for an even split."""
    if layout.pp < 2:
        return []
    first, last = layout.given_ends
    if not (first or last):
        counts = layout.stage_layers(model)
        if len(set(counts)) == 1:
            return []
        first, last = counts[0], counts[-1]
    flags = dict(zip(STAGE_LAYER_FLAGS, (first, last), strict=True))
    return [a for flag, n in flags.items() if n for a in (flag, str(n))]


def mtp_args(model: ModelSpec) -> list[str]:
    """``--mtp-num-layers`` for a model with multi-token-prediction modules. Megatron-Core puts
    them on the last pipeline stage's last chunk (get_mtp_num_layers_to_build at 309ffca), where
    flm prices them."""
    return [MTP_FLAG, str(model.mtp_layers)] if model.mtp_layers else []


def recompute_args(layout: Layout) -> list[str]:
    """``--recompute-granularity selective`` recomputes the attention core (its default module,
    ``core_attn``); full recomputes every block, one at a time. Megatron-DeepSpeed's
    ``GPTModelPipe`` reads the same flags (full + uniform: its PipelineModule's checkpoint
    interval is ``--recompute-num-layers``; megatron/model/gpt_model.py)."""
    if layout.recompute == Recompute.SELECTIVE:
        return [RECOMPUTE_FLAG, "selective"]
    if layout.recompute == Recompute.FULL:
        return [RECOMPUTE_FLAG, "full", "--recompute-method", "uniform",
                "--recompute-num-layers", "1"]
    return []


def dtype_args(layout: Layout) -> list[str]:
    """The precision flags. fp8 is bf16 training with TransformerEngine's FP8 linears:
    ``--fp8-format hybrid`` (E4M3 forward, E5M2 gradients) and ``--fp8-recipe`` (choices
    tensorwise, delayed, mxfp8, blockwise: Megatron-LM core_v0.15.3
    megatron/training/arguments.py, _add_transformer_engine_args)."""
    if layout.dtype == DType.FP8:
        return ["--bf16", "--fp8-format", "hybrid", "--fp8-recipe", str(layout.fp8_recipe)]
    return {DType.BF16: ["--bf16"], DType.FP16: ["--fp16"], DType.FP32: []}[layout.dtype]


def batch_and_degrees(layout: Layout) -> list[str]:
    return [FLAG["tp"], str(layout.tp), FLAG["pp"], str(layout.pp),
            FLAG["micro_batch"], str(layout.micro_batch),
            FLAG["global_batch"], str(layout.global_batch)]


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


__all__ = ["DEFAULT_DS_CONFIG", "DEGREE_FLAGS", "DISTRIBUTED_OPTIMIZER_FLAG", "EXPERT_TP_FLAG",
           "FLAG", "MTP_FLAG", "PRINTED", "RECOMPUTE_FLAG", "SEQUENCE_PARALLEL_FLAG",
           "STAGE_LAYER_FLAGS", "VIRTUAL_STAGES_FLAG", "ZERO_STAGE_FLAG", "batch_and_degrees",
           "dest", "dtype_args", "model_args", "moe_args", "moe_layer_freq", "mtp_args",
           "recompute_args", "render_argv", "stage_layer_args"]
