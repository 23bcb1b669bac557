"""A layout as torchtitan's job-config TOML (``--job.config_file``), v0.2.2's
``torchtitan/config/job_config.py`` sections and keys (the last release read from TOML; later
torchtitan configures runs in Python).

The model's shape is not a job-config key: torchtitan picks a registered ``TransformerModelArgs``
by ``model.name`` and ``model.flavor``. The TOML names the flm model as the flavor and says, in
comments, the shape that flavor must have. The pipeline split is written explicitly
(``module_fqns_per_model_part``, llama3's module names), the split flm plans for the native
engine, which is torchtitan's own (specs/pipeline_split.py "manual").
"""

from __future__ import annotations

from typing import Any

from frontier_llm.export.refusals import check_engine_rules, refuse
from frontier_llm.specs.layout import DType, Engine, Layout, PlacementKind, Recompute, Schedule
from frontier_llm.specs.model import ModelSpec

TORCHTITAN = "torchtitan"
# torch.distributed.pipelining's schedule names (get_schedule_class), which torchtitan passes on.
SCHEDULES = {Schedule.GPIPE: "GPipe", Schedule.ONE_F_ONE_B: "1F1B",
             Schedule.INTERLEAVED: "Interleaved1F1B"}
PRECISION = {DType.BF16: "bfloat16", DType.FP32: "float32"}


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


def _check(model: ModelSpec, layout: Layout) -> Layout:
    layout = check_engine_rules(TORCHTITAN, Engine.NATIVE, layout, model)
    if layout.recompute == Recompute.SELECTIVE:
        raise refuse(TORCHTITAN, "its selective activation checkpointing is every Nth block "
                     "(selective_ac_option = N) or op by op ('op': flm's selective-op); it has "
                     "no attention-core recomputation (flm's selective)")
    if not layout.flash_attention:
        raise refuse(TORCHTITAN, "its attention is the model flavor's attn_type (sdpa, flex, "
                     "varlen), all fused; it has no unfused attention")
    divisor = layout.tp * 2 * layout.cp
    if model.seq_len % divisor:
        # llama3/infra/parallelize.py asserts seq_len % parallel_dims.seq_len_divisor, which
        # is tp x 2cp (parallel_dims.py v0.2.2): stricter than flm's 2cp and (seq/cp) % tp.
        raise refuse(TORCHTITAN, f"seq_len {model.seq_len} is not divisible by tp x 2 x cp "
                     f"= {divisor}, which its parallelize asserts")
    if layout.tp > 1 and not layout.sequence_parallel:
        raise refuse(TORCHTITAN, "its tensor parallel plan always shards the norms over the TP "
                     "ranks (SequenceParallel in llama3/infra/parallelize.py): add "
                     "--sequence-parallel")
    return layout


def job_config(model: ModelSpec, layout: Layout) -> dict[str, dict[str, Any]]:
    """The job config's sections as a dict (ExportRefused where torchtitan cannot run it)."""
    layout = _check(model, layout)
    shard, replicate = data_parallel_degrees(layout)
    training: dict[str, Any] = {"seq_len": model.seq_len, "global_batch_size": layout.global_batch,
                                "mixed_precision_param": PRECISION[layout.dtype]}
    parallelism: dict[str, Any] = {
        "data_parallel_replicate_degree": replicate, "data_parallel_shard_degree": shard,
        "tensor_parallel_degree": layout.tp, "pipeline_parallel_degree": layout.pp}
    if layout.cp > 1:
        # The load-balanced causal split is its default load balancer ("headtail" for SDPA:
        # rank r holds chunks r and 2cp-1-r); all-gather of the K/V shards is flm's native
        # design and its default rotate method, written out so that the file says it.
        parallelism["context_parallel_degree"] = layout.cp
        parallelism["context_parallel_rotate_method"] = "allgather"
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
    ac: dict[str, Any] = {"mode": {Recompute.NONE: "none", Recompute.FULL: "full",
                                   Recompute.SELECTIVE_OP: "selective"}[layout.recompute]}
    if layout.recompute == Recompute.SELECTIVE_OP:
        ac["selective_ac_option"] = "op"
    return {"model": {"name": "llama3", "flavor": model.name}, "training": training,
            "parallelism": parallelism, "activation_checkpoint": ac}


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


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return "[" + ", ".join(_toml_value(v) for v in value) + "]"


def shape_comment(model: ModelSpec) -> list[str]:
    """What the flavor must be: llama3's TransformerModelArgs names."""
    lines = [f"model.flavor {model.name!r} must be a llama3 TransformerModelArgs with dim="
             f"{model.hidden}, n_layers={model.layers}, n_heads={model.heads}, "
             f"n_kv_heads={model.kv_heads}, vocab_size={model.vocab}, max_seq_len={model.seq_len}, "
             f"and multiple_of / ffn_dim_multiplier giving an FFN of {model.ffn_hidden}"]
    if (model.activation, model.norm, model.position) != ("swiglu", "rmsnorm", "rope"):
        lines.append(f"note: {model.name} is {model.activation}/{model.norm}/{model.position}; "
                     "torchtitan's llama3 is swiglu/rmsnorm/rope")
    return lines


def job_config_text(model: ModelSpec, layout: Layout, header: list[str]) -> str:
    sections = job_config(model, layout)
    out = [f"# {h}" for h in header + shape_comment(model)]
    for name, keys in sections.items():
        out += ["", f"[{name}]"] + [f"{k} = {_toml_value(v)}" for k, v in keys.items()]
    return "\n".join(out) + "\n"
