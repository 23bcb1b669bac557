"""A layout as torchtitan's job-config TOML (``--job.config_file``), v0.2.2's
``torchtitan/config/job_config.py`` sections and keys (the last release read from TOML; later
torchtitan configures runs in Python).

The model's shape is not a job-config key: torchtitan picks a registered ``TransformerModelArgs``
by ``model.name`` and ``model.flavor`` (a KeyError for any other). flm's model maps to the flavor
torchtitan registers with the same shape (:data:`FLAVORS`, v0.2.2
``torchtitan/models/llama3/__init__.py``: ``llama3-70b`` is ``70B``); a llama-style model it
lacks keeps flm's name as the flavor and the TOML's comments carry the one line that registers it
(:func:`registration`); a model that is not llama-style (GeLU, LayerNorm, learned positions,
biases) is refused: no flavor of torchtitan's llama3 is that model. The pipeline split is
written explicitly (``module_fqns_per_model_part``, llama3's module names), the split flm plans
for the native engine, which is torchtitan's own (specs/pipeline_split.py "manual").

A Mixture-of-Experts model is a flavor of torchtitan's llama4 (the llama-style decoder with
token-choice MoE blocks, ``torchtitan/models/llama4``, v0.2.2), written as its registration
line (:func:`moe_registration`): its MoE blocks are every ``interleave_moe_layer_step``-th from
the step's last (``(layer_id + 1) % step == 0``, llama4/model/model.py), so flm's MoE models
with an MoE block in every layer are expressible and others are refused. Expert parallelism is
``expert_parallel_degree`` with ``expert_tensor_parallel_degree`` = tp (flm's expert-tp, one of
the two torchtitan allows: "etp = tp" or "etp = 1", config/job_config.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from frontier_llm.specs import axes
from frontier_llm.specs.engine_rules import CP_EXCHANGE
from frontier_llm.specs.layout import DType, Engine, Layout, PlacementKind, Recompute, Schedule
from frontier_llm.specs.model import ModelSpec
from frontier_llm.specs.system import SystemSpec
from frontier_llm.trainers.base import Trainer
from frontier_llm.trainers.refusals import check_engine_rules, check_mtp, refuse
from frontier_llm.trainers.text import comment_lines, toml_value
from frontier_llm.trainers.torchtitan_log import TorchtitanLog
from frontier_llm.trainers.torchtitan_names import AC_MODES, SELECTIVE_OPTION, key

TORCHTITAN = "torchtitan"
JOB_CONFIG = "job_config.toml"
# torchtitan v0.2.2 torchtitan/models/llama3/__init__.py, llama3_args (the sdpa flavors; the
# _flex / _varlen ones differ in attention kernel only): dim, n_layers, n_heads, n_kv_heads,
# ffn_dim_multiplier, multiple_of. vocab_size is TransformerModelArgs' default, 128256
# (model/args.py), for all three; max_seq_len follows training.seq_len (update_from_config).
FLAVORS = {
    "8B": (4096, 32, 32, 8, 1.3, 1024),
    "70B": (8192, 80, 64, 8, 1.3, 4096),
    "405B": (16384, 126, 128, 8, 1.2, 4096),
}
FLAVOR_VOCAB = 128256
# Every llama3 flavor's rope_theta (llama3/__init__.py v0.2.2): a model of the same shape with
# another RoPE base is not that flavor, and gets a registration line of its own.
FLAVOR_ROPE_THETA = 500000
LLAMA_STYLE = ("swiglu", "rmsnorm", "rope")


def ffn_width(dim: int, multiple_of: int, multiplier: float | None) -> int:
    """llama3's FeedForward width (model/model.py v0.2.2): 2/3 of 4 x dim, times the multiplier,
    rounded up to a multiple of ``multiple_of``."""
    hidden = int(2 * (4 * dim) / 3)
    if multiplier is not None:
        hidden = int(multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def _llama_style(model: ModelSpec) -> bool:
    return ((model.activation, model.norm, model.position) == LLAMA_STYLE and not model.bias
            and not model.tied_embeddings)


def flavor(model: ModelSpec) -> str | None:
    """The llama3 flavor torchtitan registers with the model's shape, or None (an MoE model
    is none of them)."""
    if not _llama_style(model) or model.is_moe or model.rope_base != FLAVOR_ROPE_THETA:
        return None
    for name, (dim, layers, heads, kv, mult, multiple) in FLAVORS.items():
        if (model.hidden, model.layers, model.heads, model.kv_heads, model.vocab,
                model.ffn_hidden) == (dim, layers, heads, kv, FLAVOR_VOCAB,
                                      ffn_width(dim, multiple, mult)):
            return name
    return None


def _ffn_args(model: ModelSpec) -> tuple[int, float | None] | None:
    """(multiple_of, ffn_dim_multiplier) that give the model's FFN width, or None."""
    return _ffn_width_args(model.hidden, model.ffn_hidden)


def _ffn_width_args(dim: int, width: int) -> tuple[int, float | None] | None:
    """(multiple_of, ffn_dim_multiplier) that give an FFN ``width`` at ``dim``, or None."""
    base = int(2 * (4 * dim) / 3)
    if width >= base:
        # Rounding base up to a multiple of the width itself gives the width.
        return width, None
    for mult in (width / base, (width + 0.5) / base):
        if ffn_width(dim, 1, mult) == width:
            return 1, round(mult, 12)
    return None


def registration(model: ModelSpec) -> str:
    """The line that registers the model as a flavor of torchtitan's llama3 (in
    torchtitan/models/llama3/__init__.py, after ``llama3_args = {...}``)."""
    ffn = _ffn_args(model)
    if ffn is None:
        raise refuse(TORCHTITAN, f"no multiple_of / ffn_dim_multiplier of llama3's FeedForward "
                     f"gives {model.name}'s FFN width {model.ffn_hidden} at dim {model.hidden}")
    multiple, mult = ffn
    return (f"llama3_args[{model.name!r}] = TransformerModelArgs(dim={model.hidden}, "
            f"n_layers={model.layers}, n_heads={model.heads}, n_kv_heads={model.kv_heads}, "
            f"vocab_size={model.vocab}, multiple_of={multiple}, ffn_dim_multiplier={mult}, "
            f"rope_theta={_number(model.rope_base)})")
def _number(value: float) -> str:
    """A Python literal of the value: an integer where it is one (500000, not 500000.0)."""
    return str(int(value)) if value == int(value) else repr(float(value))


def moe_registration(model: ModelSpec) -> str:
    """The line that registers an MoE model as a flavor of torchtitan's llama4 (in
    torchtitan/models/llama4/__init__.py, after ``llama4_args = {...}``). Its experts' width is
    llama4's FeedForward rule without ``auto_scale_hidden_dim`` (2/3 of 4 x dim, times the
    multiplier, rounded up to ``multiple_of``: llama4/model/model.py), so the same
    ``multiple_of`` / ``ffn_dim_multiplier`` search as llama3's gives it; the router is softmax
    over the experts with the top-k scores renormalised (``score_func="softmax"``,
    ``route_norm=True``, moe/moe.py), Mixtral's top-k softmax, and the scores weight the
    experts' outputs (``score_before_experts=False``; its default True scales their inputs,
    which through a SwiGLU expert is another function than Mixtral's weighted sum of outputs:
    moe/moe.py ``MoE.forward``)."""
    ffn = _ffn_width_args(model.hidden, model.expert_ffn_hidden)
    if ffn is None:
        raise refuse(TORCHTITAN, f"no multiple_of / ffn_dim_multiplier of llama4's FeedForward "
                     f"gives {model.name}'s expert width {model.expert_ffn_hidden} at dim "
                     f"{model.hidden}")
    multiple, mult = ffn
    return (f"llama4_args[{model.name!r}] = TransformerModelArgs(dim={model.hidden}, "
            f"n_layers={model.layers}, n_heads={model.heads}, n_kv_heads={model.kv_heads}, "
            f"vocab_size={model.vocab}, multiple_of={multiple}, ffn_dim_multiplier={mult}, "
            f"rope_theta={_number(model.rope_base)}, interleave_moe_layer_step=1, "
            f"auto_scale_hidden_dim=False, moe_args=MoEArgs(num_experts={model.num_experts}, "
            f"num_shared_experts={model.shared_experts}, top_k={model.top_k}, "
            "score_func='softmax', route_norm=True, score_before_experts=False))")


def check_moe(model: ModelSpec) -> None:
    """Refuse the MoE models llama4's blocks cannot be (one line each)."""
    if model.dense_layers and model.moe_layer_freq == 1:
        # DeepSeek's form (first k dense, then MoE in every block) is torchtitan's deepseek_v3
        # (models/deepseek_v3, n_dense_layers), whose attention is multi-head latent attention
        # only: this model's (grouped-query) attention is no deepseek_v3 flavor.
        raise refuse(TORCHTITAN, f"{model.name}'s first {model.dense_layers} dense block(s) "
                     "then experts in every block: llama4 has no first-k dense blocks, and "
                     "torchtitan's deepseek_v3 (n_dense_layers) attends with multi-head latent "
                     "attention (MLA) only, which this model does not use; use --to "
                     "megatron-lm (--moe-layer-freq)")
    if model.dense_layers or model.moe_layer_freq != 1:
        raise refuse(TORCHTITAN, f"{model.name}'s dense blocks (dense_layers "
                     f"{model.dense_layers}, moe_layer_freq {model.moe_layer_freq}): llama4 "
                     "places its MoE blocks last in every interleave_moe_layer_step blocks and "
                     "has no first-k dense blocks; use --to megatron-lm (--moe-layer-freq)")
    if model.capacity_factor is not None:
        raise refuse(TORCHTITAN, f"capacity_factor {model.capacity_factor:g}: torchtitan's "
                     "token-choice router drops no token (moe/moe.py), so a capacity is not "
                     "expressible; use --to megatron-lm (--moe-expert-capacity-factor)")
    moe_registration(model)


# torch.distributed.pipelining's schedule names (get_schedule_class), which torchtitan passes on.
SCHEDULES = {Schedule.GPIPE: "GPipe", Schedule.ONE_F_ONE_B: "1F1B",
             Schedule.INTERLEAVED: "Interleaved1F1B"}
# fp8 trains bf16 parameters whose linears multiply in float8 (its converter, :func:`fp8_sections`).
PRECISION = {DType.BF16: "bfloat16", DType.FP32: "float32", DType.FP8: "bfloat16"}
# flm's FP8 recipe -> torchtitan v0.2.2's converter and its section (job_config.py:
# Model.converters, Float8Linear / MXLinear under [quantize.linear];
# components/quantization/float8.py and mx.py register "quantize.linear.float8" and
# "quantize.linear.mx").
FP8_CONVERTERS = {"tensorwise": "quantize.linear.float8", "mxfp8": "quantize.linear.mx"}


def data_parallel_degrees(layout: Layout) -> tuple[int, int]:
    """(data_parallel_shard_degree, data_parallel_replicate_degree) for the sharding: FSDP2
    shards parameters, gradients and optimizer states together, so only placements that treat
    the three alike are expressible (zero0: DDP, zero3: FSDP, partial:K for all: HSDP).

    With cp > 1 torchtitan's FSDP mesh is dp_shard x cp (``fsdp = dp_shard * cp`` and
    ``fsdp_enabled = dp_shard > 1 or cp > 1``, distributed/parallel_dims.py v0.2.2), as flm
    shards over dp x cp (``Layout.shard_ranks``): zero3 is dp_shard = dp, partial:K (K of the
    dp x cp ranks) is dp_shard = K / cp, and replicas (zero0) cannot be kept."""
    if layout.dp == 1 and layout.cp == 1:
        return 1, 1
    places = {(p.kind, p.group) for p in (layout.sharding.params, layout.sharding.grads,
                                          layout.sharding.optim)}
    if len(places) != 1:
        raise refuse(TORCHTITAN, f"sharding {layout.sharding.describe()} shards parameters, "
                     "gradients and optimizer states differently, and FSDP2 (fully_shard) "
                     "shards the three together: use zero0 (DDP), zero3 (FSDP) or "
                     "partial:K for all three (HSDP)")
    kind, group = places.pop()
    if kind == PlacementKind.REPLICATE and layout.cp > 1:
        raise refuse(TORCHTITAN, f"zero0 with cp {layout.cp}: torchtitan applies FSDP over the "
                     "dp_shard x cp ranks whenever cp > 1 (parallel_dims.py fsdp_enabled), so "
                     "parameters are never replicated over the cp ranks; shard with zero3 or HSDP")
    if kind == PlacementKind.REPLICATE:
        if layout.tp > 1 or layout.pp > 1:
            # llama3/infra/parallelize.py: "DDP has not supported > 1D parallelism".
            raise refuse(TORCHTITAN, "zero0 (DDP) with tp or pp > 1: torchtitan's DDP does not "
                         "compose with other parallelism; shard with zero3 or HSDP")
        return 1, layout.dp
    if kind == PlacementKind.FULL:
        return layout.dp, 1
    if group % layout.cp:
        raise refuse(TORCHTITAN, f"a shard group of {group} ranks with cp {layout.cp}: "
                     "torchtitan's shard group is dp_shard x cp, a multiple of cp")
    shard = group // layout.cp
    return shard, layout.dp // shard


def _check(model: ModelSpec, layout: Layout, implied_sp: bool = True) -> Layout:
    layout = check_engine_rules(TORCHTITAN, Engine.NATIVE, layout, model)
    if layout.dtype == DType.FP8 and str(layout.fp8_recipe) not in FP8_CONVERTERS:
        raise refuse(TORCHTITAN, f"its float8 converter scales tensorwise or rowwise and its MX "
                     f"converter runs mxfp8 (job_config.py v0.2.2 Float8Linear.recipe_name, "
                     f"MXLinear); {layout.fp8_recipe} scaling is TransformerEngine's: use "
                     "--to megatron-lm")
    if layout.recompute == Recompute.SELECTIVE:
        raise refuse(TORCHTITAN, "its selective activation checkpointing is every Nth block "
                     "(selective_ac_option = N) or op by op ('op': flm's selective-op); it has "
                     "no attention-core recomputation (flm's selective)")
    if not layout.flash_attention:
        raise refuse(TORCHTITAN, "its attention is the model flavor's attn_type (sdpa, flex, "
                     "varlen), all fused; it has no unfused attention")
    divisor = 2 * axes.sequence_split(layout)
    if model.seq_len % divisor:
        # llama3/infra/parallelize.py asserts seq_len % parallel_dims.seq_len_divisor, which
        # is tp x 2cp (parallel_dims.py v0.2.2): stricter than flm's 2cp and (seq/cp) % tp.
        raise refuse(TORCHTITAN, f"seq_len {model.seq_len} is not divisible by tp x 2 x cp "
                     f"= {divisor}, which its parallelize asserts")
    _check_expert_tp(layout)
    if layout.tp > 1 and not layout.sequence_parallel:
        if not implied_sp:
            raise refuse(TORCHTITAN, "sequence parallelism is implied: its tensor parallel plan "
                         "always shards the norms over the TP ranks (SequenceParallel in "
                         "llama3/infra/parallelize.py), so the run is this layout with "
                         "sequence_parallel: true; write that, for the job's trace to state "
                         "what ran")
        layout = dataclasses.replace(layout, sequence_parallel=True)
    return layout


def _check_expert_tp(layout: Layout) -> None:
    """torchtitan v0.2.2's expert tensor parallelism: "Currently we only support either etp =
    tp or etp = 1" (job_config.py; parallel_dims.py asserts it), and it has "No effect ... when
    ep = 1" (the experts then follow tp)."""
    if not layout.etp:
        return
    if layout.etp != 1:
        raise refuse(TORCHTITAN, f"etp {layout.etp} with tp {layout.tp}: it runs etp = tp or "
                     "etp = 1 only (parallel_dims.py v0.2.2 asserts \"Currently we only support "
                     "ETP=TP or ETP=1\")")
    if layout.ep == 1:
        raise refuse(TORCHTITAN, f"etp 1 with tp {layout.tp} and ep 1: its "
                     "expert_tensor_parallel_degree has \"No effect ... when ep = 1\" "
                     "(job_config.py v0.2.2), the experts following tp; use ep > 1 or etp = tp")


def check_model(model: ModelSpec) -> None:
    """The model as a flavor of torchtitan's llama3: registered, registrable, or refused."""
    if model.is_mla:
        # torchtitan's MLA model is deepseek_v3 (DeepSeekV3ModelArgs q_lora_rank, kv_lora_rank,
        # qk_nope_head_dim, qk_rope_head_dim, v_head_dim; models/deepseek_v3, v0.2.2), another
        # model.name with its own parallelize plan and module names: flm does not write it.
        raise refuse(TORCHTITAN, f"{model.name} uses multi-head latent attention: torchtitan "
                     "runs it as its deepseek_v3 model (DeepSeekV3ModelArgs), which flm does "
                     "not export (it writes llama3 and llama4 flavors); use --to megatron-lm "
                     "(--multi-latent-attention)")
    check_mtp(TORCHTITAN, model, "the llama3 / llama4 models flm writes for torchtitan v0.2.2 "
              "build no multi-token-prediction module")
    if model.head_dim * model.heads != model.hidden:
        raise refuse(TORCHTITAN, f"{model.name}'s heads are {model.head_dim} wide, not dim / "
                     f"n_heads = {model.hidden / model.heads:g}: torchtitan's llama3 and llama4 "
                     "take each head's width as dim // n_heads (model/model.py, v0.2.2), so no "
                     "flavor of them is this model; use --to megatron-lm (--kv-channels)")
    if not _llama_style(model):
        raise refuse(TORCHTITAN, f"{model.name} is {model.activation}/{model.norm}/"
                     f"{model.position}{' with biases' if model.bias else ''}"
                     f"{' and tied embeddings' if model.tied_embeddings else ''}; torchtitan's "
                     "llama3 (the model this TOML names) is swiglu/rmsnorm/rope without biases, "
                     "untied, so no flavor of it is this model: use --to megatron-lm")
    if model.is_moe:
        check_moe(model)
    elif flavor(model) is None:
        registration(model)  # refused here when no FeedForward arguments give the width


def job_config(model: ModelSpec, layout: Layout, implied_sp: bool = True,
               compiled: bool = True) -> dict[str, dict[str, Any]]:
    """The job config's sections as a dict (ExportRefused where torchtitan cannot run it).
    ``implied_sp``: tp > 1 without sequence parallelism is exported as torchtitan runs it (with
    it); a sweep job refuses it instead, so that its trace states what ran. ``compiled``: the
    layout was priced with fused element-wise kernels (flm plan's default; False after
    ``--eager``), which torchtitan runs only with ``[compile] enable = true`` (Compile.enable,
    default false, job_config.py v0.2.2): without it the run is the eager one, about 4x the
    element-wise traffic (docs/costmodel.md section 5)."""
    layout = _check(model, layout, implied_sp)
    shard, replicate = data_parallel_degrees(layout)
    # Last: a layout refusal above holds for any model; this one is of the model alone.
    check_model(model)
    training: dict[str, Any] = {"seq_len": model.seq_len, "global_batch_size": layout.global_batch,
                                "mixed_precision_param": PRECISION[layout.dtype]}
    parallelism: dict[str, Any] = {
        key("dp_replicate"): replicate, key("dp_shard"): shard,
        key("tp"): layout.tp, key("pp"): layout.pp}
    if layout.cp > 1:
        # The load-balanced causal split is its default load balancer ("headtail" for SDPA:
        # rank r holds chunks r and 2cp-1-r); "allgather" is its default rotate method,
        # written out so that the file says it: PyTorch's context_parallel ring of cp partial
        # attentions (the cost model's cp_exchange "ring"; flm bench's own CP, one gather and
        # a masked attention, is not what this runs).
        parallelism[key("cp")] = layout.cp
        parallelism["context_parallel_rotate_method"] = "allgather"
    if layout.ep > 1:
        # Its expert mesh takes ep from dp_shard x cp x tp / etp (efsdp = dp_shard x cp x tp /
        # (etp x ep), distributed/parallel_dims.py v0.2.2); with etp = tp, ep divides
        # dp_shard x cp, with etp 1 dp_shard x cp x tp: replicas (dp_replicate) are not lent
        # to experts.
        lent = shard * layout.cp * (layout.tp // layout.expert_tp)
        if lent % layout.ep:
            ranks = f"{shard} x {layout.cp}" + (f" x tp {layout.tp}" if layout.etp else "")
            raise refuse(TORCHTITAN, f"ep {layout.ep} does not divide data_parallel_shard_degree "
                         f"x cp{' x tp / etp' if layout.etp else ''} = {ranks}: torchtitan's "
                         "experts borrow ranks from the FSDP shard group only (parallel_dims.py "
                         "efsdp); shard over more ranks (zero3) or lower ep")
        parallelism[key("ep")] = layout.ep
        parallelism[key("etp")] = layout.expert_tp
    if shard > 1 or layout.cp > 1:
        parallelism["fsdp_reshard_after_forward"] = (
            "always" if layout.reshard_after_forward else "never")
    if layout.pp > 1:
        # local_batch_size is the batch of one DP rank per step, split into micro-batches.
        training["local_batch_size"] = layout.global_batch // layout.dp
        parallelism.update(
            pipeline_parallel_schedule=SCHEDULES[layout.schedule],
            pipeline_parallel_microbatch_size=layout.micro_batch,
            module_fqns_per_model_part=module_fqns(model, layout))
    else:
        # Without pipelines torchtitan accumulates global / (local x dp) micro-batches.
        training["local_batch_size"] = layout.micro_batch
    ac: dict[str, Any] = {"mode": AC_MODES[layout.recompute]}
    if layout.recompute == Recompute.SELECTIVE_OP:
        ac["selective_ac_option"] = SELECTIVE_OPTION
    out = {"model": {"name": "llama4" if model.is_moe else "llama3",
                     "flavor": flavor(model) or model.name},
           "training": training,
           "parallelism": parallelism, "activation_checkpoint": ac}
    if layout.dtype == DType.FP8:
        # The fp8 sections turn torch.compile on themselves (it fuses the casts).
        out["model"]["converters"] = [FP8_CONVERTERS[str(layout.fp8_recipe)]]
        out.update(fp8_sections(layout, fsdp=shard > 1 or layout.cp > 1))
    elif compiled:
        out["compile"] = {"enable": True}  # components: its default, ["model", "loss"]
    return out


def fp8_sections(layout: Layout, fsdp: bool) -> dict[str, dict[str, Any]]:
    """The float8 / MX converter's section (job_config.py v0.2.2 Float8Linear, MXLinear) and
    torch.compile, which fuses its scaling and casting kernels (torchao: "enable torch.compile
    to generate fused kernels for float8 scaling and casting"). Tensorwise under FSDP gathers
    weights in float8 with the scales precomputed once per step, as the cost model prices it;
    the output head stays bf16 (``filter_fqns``)."""
    if str(layout.fp8_recipe) == "tensorwise":
        section = {"recipe_name": "tensorwise", "enable_fsdp_float8_all_gather": fsdp,
                   "precompute_float8_dynamic_scale_for_fsdp": fsdp, "filter_fqns": ["output"]}
        name = "quantize.linear.float8"
    else:
        section = {"recipe_name": "mxfp8_cublas", "filter_fqns": ["output"]}
        name = "quantize.linear.mx"
    return {name: section, "compile": {"enable": True, "components": ["model", "loss"]}}


def module_fqns(model: ModelSpec, layout: Layout) -> list[list[str]]:
    """llama3's module names per model chunk, in chunk order: the embedding on the first, the
    final norm and output head on the last, the layers as flm's native split places them."""
    parts, start = [], 0
    counts = layout.stage_layers(model)
    for i, n in enumerate(counts):
        names = (["tok_embeddings"] if i == 0 else []) + [f"layers.{k}"
                                                         for k in range(start, start + n)]
        if i == len(counts) - 1:
            names += ["norm", "output"]
        parts.append(names)
        start += n
    return parts


def aux_loss_note(model: ModelSpec) -> str:
    """torchtitan has no auxiliary load-balancing loss: said, not silently dropped."""
    return (f"torchtitan v0.2.2's MoE has no auxiliary load-balancing loss: it balances experts "
            "by its expert-bias update instead (MoEArgs.load_balance_coeff, default 1e-3: "
            "moe/moe.py, components/optimizer.py), so the run trains without "
            f"{model.name}'s router_aux_loss {model.router_aux_loss:g}")


def model_comment(model: ModelSpec) -> list[str]:
    """Which flavor, and the registration line when torchtitan lacks the model."""
    if model.is_moe:
        return [f"torchtitan v0.2.2 registers no llama4 flavor with {model.name}'s shape: add "
                "this line to torchtitan/models/llama4/__init__.py after llama4_args = {...}",
                moe_registration(model)] + (
                    [aux_loss_note(model)] if model.router_aux_loss > 0 else [])
    name = flavor(model)
    if name is not None:
        return [f"model.flavor {name!r} is {model.name}'s shape in torchtitan v0.2.2 "
                "(torchtitan/models/llama3/__init__.py)"]
    return [f"torchtitan v0.2.2 registers no llama3 flavor with {model.name}'s shape: add this "
            "line to torchtitan/models/llama3/__init__.py after llama3_args = {...}",
            registration(model)]


def job_config_text(model: ModelSpec, layout: Layout, header: list[str],
                    implied_sp: bool = True, compiled: bool = True) -> str:
    """The TOML: comment lines, then each section (trainers/text.py writes every value)."""
    sections = job_config(model, layout, implied_sp, compiled)
    out = [comment_lines(header + model_comment(model)).rstrip("\n")]
    for name, keys in sections.items():
        out += ["", f"[{name}]"] + [f"{k} = {toml_value(v)}" for k, v in keys.items()]
    return "\n".join(out) + "\n"


class Torchtitan(Trainer):
    name = TORCHTITAN
    aliases = ("titan", "torch-titan")
    title = "torchtitan"
    order = 3
    source = "torchtitan v0.2.2 (73a0e69) torchtitan/config/job_config.py"
    engines = (Engine.NATIVE,)
    # PyTorch's context_parallel ring (context_parallel_rotate_method, written below), not
    # flm bench's single gather.
    cp_exchange = CP_EXCHANGE["torchtitan"]
    # Its nearest to Megatron-LM's --tp-comm-overlap is async TP (torch's symmetric-memory
    # micro-pipelining under torch.compile), a different mechanism the cost model does not
    # price: flm export refuses the setting rather than map it.
    tp_overlap_instead = ("async tensor parallelism instead ([parallelism] "
                          "enable_async_tensor_parallel, only with torch.compile: "
                          "torchtitan/config/job_config.py at v0.2.2), a different mechanism "
                          "flm neither prices nor maps")
    log_reader = TorchtitanLog()
    # [training] steps as a command-line override (job_config.py v0.2.2, Training.steps).
    step_flag = "--training.steps"
    save_flag = "--checkpoint.folder"
    # torchtitan has no signal handler that saves a checkpoint (v0.2.2: train.py installs none;
    # checkpoints are every checkpoint.interval steps): the job's SIGTERM only stops it.

    def check(self, model: ModelSpec, layout: Layout) -> Layout:
        job_config(model, layout, implied_sp=False)
        return _check(model, layout, implied_sp=False)

    def argv(self, model: ModelSpec, layout: Layout, job_dir: str) -> list[str]:
        self.check(model, layout)
        return ["--job.config_file", f"{job_dir}/{JOB_CONFIG}"]

    def files(self, model: ModelSpec, layout: Layout, system: SystemSpec | None = None,
              **options: object) -> dict[str, str]:
        return {JOB_CONFIG: job_config_text(model, layout, self.header(model, layout, system),
                                            implied_sp=False)}

    def export_text(self, model: ModelSpec, layout: Layout, system: SystemSpec | None = None,
                    **options: object) -> str:
        return job_config_text(model, layout, self.header(model, layout, system),
                               compiled=bool(options.get("compiled", True)))

    def notes(self, model: ModelSpec, layout: Layout, **options: object) -> list[str]:
        out = super().notes(model, layout, **options)
        if layout.tp > 1 and not layout.sequence_parallel:
            out.append("sequence parallelism is implied: torchtitan applies SequenceParallel "
                       "with TP (llama3/infra/parallelize.py), so the TOML runs this layout with "
                       "it; flm predict --sequence-parallel predicts what runs")
        if flavor(model) is None:
            out.append(f"torchtitan registers no flavor with {model.name}'s shape: the TOML's "
                       "comments hold the line that registers it")
        if model.is_moe and model.router_aux_loss > 0:
            out.append(aux_loss_note(model))
        if layout.cp > 1:
            out.append(f"context parallelism runs as PyTorch's context_parallel ring (cp "
                       f"{layout.cp} partial attentions merged in fp32, no mask), not flm "
                       "bench's single gather: flm predict/plan --cp-exchange ring predicts "
                       "what runs")
        return out


TRAINER = Torchtitan()
