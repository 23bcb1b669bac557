"""What each training engine can run, and how it schedules its work: one place for all of it.

The planner (which layouts to enumerate), ``flm predict`` and spec validation (which to refuse,
with a reason that names the engine), the cost model (prefetch, resharding, overlap) and
``flm bench`` (which engine to build) all read :data:`RULES`. A rule here is what the engine's own
code or documentation enforces; each entry names its source.

Sources:
- DeepSpeed: "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism" (``deepspeed/runtime/
  pipe/engine.py`` asserts ``zero_optimization_stage() < ZeroStageEnum.gradients``); its pipeline
  engine has one training schedule (``TrainSchedule``, 1F1B) and no interleaving; MiCS
  (``mics_shard_size``: all states sharded in groups) and ZeRO++ hpZ (``zero_hpz_partition_size``:
  a secondary parameter shard inside a group) are ZeRO-3 features; DeepSpeed 0.19 removed MiCS
  (``deepspeed/runtime/config.py``, ``_REMOVED_ZERO_CONFIG_KEYS``: "MiCS ZeRO-3 sharding has
  been removed; 'zero_optimization.mics_shard_size' is no longer supported"), so of the partial
  placements only hpZ runs.
- Megatron-LM: schedules without and with interleaving
  (``--num-layers-per-virtual-pipeline-stage``),
  no GPipe; its own even split (no ``--decoder-first/last-pipeline-num-layers``) needs the
  layers to divide by pp x vp when interleaved (``get_num_layers_to_build`` asserts
  ``num_layers_per_pipeline_rank % vp_size == 0``); given end stages follow Megatron-Core's
  uneven rules, interleaved too (specs/pipeline_split.py ``given_ends``); its distributed
  optimizer (``--use-distributed-optimizer``) shards optimizer states over DP ranks (ZeRO-1),
  nothing further; sequence parallelism and TP communication overlap.
- PyTorch native (FSDP2 ``fully_shard``, DTensor tensor parallel, ``torch.distributed.pipelining``
  with ``ScheduleGPipe``, ``Schedule1F1B``, ``ScheduleInterleaved1F1B``): any AMSP placement
  (HSDP via a 2-D mesh, ``reshard_after_forward=int`` for partial parameter sharding);
  ``Schedule1F1B`` needs at least as many micro-batches as stages (``schedules.py`` raises).
  DeepSpeed's ``TrainSchedule`` runs fewer (measured: pp2 with one micro-batch equals the
  reference). ``flm
  bench``'s native engine does no fp16 loss scaling and shards whole K/V heads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from frontier_llm.errors import SpecError
from frontier_llm.specs.model import ModelSpec
from frontier_llm.specs.sharding import COMPONENTS, Sharding, zero_preset
from frontier_llm.specs.vocab import DType, Engine, PlacementKind, Recompute, Schedule

if TYPE_CHECKING:  # annotations only: the layout imports its rules, never the reverse
    from frontier_llm.specs.layout import Layout


@dataclass(frozen=True)
class EngineRules:
    """One engine's rules (what it runs) and behaviour (how it schedules what it runs)."""

    engine: Engine
    title: str
    schedules: tuple[Schedule, ...]
    # Shardings it runs; None = any AMSP placement.
    shardings: tuple[Sharding, ...] | None
    # Shardings that compose with pp > 1; None = the same as ``shardings``.
    pipeline_shardings: tuple[Sharding, ...] | None
    partial_sharding: bool  # partial:K placements beyond ``shardings``, of ``partial_form``
    sequence_parallel: bool
    dtypes: tuple[DType, ...]
    dtype_reason: str  # why a dtype is missing, when it is
    recomputes: tuple[Recompute, ...]  # activation recomputation it offers
    # Behaviour the cost model reads.
    tp_comm_overlap: bool  # TP collectives overlapped with GEMMs
    prefetch: int  # sharded parameters gathered this many layers ahead (0: no prefetch)
    # At most this many parameters are prefetched ahead (0: whole layers, ``prefetch`` of them).
    prefetch_bucket_params: int
    # Sharded parameters gathered one collective per module (each norm and linear layer) rather
    # than one per layer; gradients reduce-scattered in buckets of at most this many elements
    # (0: one per layer).
    gather_per_module: bool
    reduce_bucket_params: int
    reshard_after_forward: bool  # sharded parameters gathered again in backward
    gradient_bucketing: bool  # DP gradient reduction in buckets overlapped with backward
    reduce_fp32: bool  # 16-bit training reduces gradients in fp32 (else in the training dtype)
    # How layers are split over pipeline chunks (specs/pipeline_split.py), and whether an uneven
    # split composes with the interleaved schedule.
    pipeline_split: str
    uneven_interleaved: bool = True
    # How the data-parallel reduction of parameters that are not sharded is issued (read only
    # where ``gradient_bucketing`` overlaps it at all): replicated gradients (ZeRO-0, DDP)
    # overlapped with backward; sharded gradients (ZeRO-2) reduced after every micro-batch
    # rather than once per step; sharded gradients and optimizer states reduced by an
    # all-reduce of the whole gradient of which each rank keeps its shard (else a
    # reduce-scatter); and the parameters updated from a sharded optimizer gathered behind the
    # next forward (else inside the optimizer step, exposed).
    replicated_grad_overlap: bool = True
    sharded_grad_each_microbatch: bool = False
    # Sharded parameters (FSDP2): the gradients reduce-scattered after every micro-batch's
    # backward (sharded between them) rather than only after the last (kept unsharded in
    # between, ``set_requires_gradient_sync(False)``). A trainer's setting: GRAD_SYNC_EACH.
    fsdp_grad_sync_each_microbatch: bool = False
    # The native engine's context-parallel exchange (read for native layouts with cp > 1 only:
    # Megatron's TransformerEngine ring is its engine's own): "gather" (flm bench's one K/V
    # all-gather and one masked attention over the whole sequence) or "ring" (PyTorch's
    # ``context_parallel``, cp partial attentions merged in fp32). A trainer's setting:
    # CP_EXCHANGE.
    cp_exchange: str = "gather"
    sharded_grad_all_reduce: bool = False
    param_gather_overlap: bool = True
    # The engine's models run fused element-wise kernels whatever the caller asks
    # (Megatron-LM's apex/TransformerEngine norms, bias-activation and RoPE kernels), so an eager
    # pricing (costmodel/steptime.py EAGER_BYTES_PER_TOKEN) never applies to it.
    fused_elementwise: bool = False
    # Model rules of flm bench's native engine: whole K/V heads per TP rank, an exactly split
    # vocabulary.
    whole_kv_heads: bool = False
    vocab_divisible: bool = False
    # Pipeline schedules that need at least one micro-batch per stage (m >= pp).
    microbatch_per_stage: tuple[Schedule, ...] = ()
    # Which partial:K placement ``partial_sharding`` admits: "hpz" (parameters partial, the rest
    # fully sharded: DeepSpeed's ZeRO++) or "hsdp" (all three partial over one group: FSDP2's
    # 2-D mesh, ``fully_shard(mesh=(replicate, shard))``).
    partial_form: str = "hpz"
    # Other knobs the engine runs at some values only: (knob, the values it runs, why). Each is
    # the rule ``only_<knob>``, checked after the rules above and in the planner with no code of
    # its own (planner/space.py), so a knob added to Layout needs no rule code here.
    only: tuple[tuple[str, tuple, str], ...] = ()

    def violations(self, layout: Layout, model: ModelSpec | None = None) -> list[str]:
        """Every rule of this engine that ``layout`` breaks, as messages naming the engine."""
        return [message for _, message in self.broken(layout, model)]

    def broken(self, layout: Layout, model: ModelSpec | None = None) -> list[tuple[str, str]]:
        """(rule, message) for every rule broken, rules in :data:`LAYOUT_RULES` then
        :data:`MODEL_RULES` order (the planner's vectorised reasons follow the same order)."""
        out = []
        name = f"engine {self.engine}"
        if layout.pp > 1 and layout.schedule not in self.schedules:
            out.append(("schedule", f"{name} has no '{layout.schedule}' pipeline schedule "
                                    f"(it has {', '.join(self.schedules)})"))
        if layout.dtype not in self.dtypes:
            out.append(("dtype", f"{name} does not train in {layout.dtype} "
                                 f"(it does {', '.join(self.dtypes)}{self.dtype_reason})"))
        if layout.sequence_parallel and not self.sequence_parallel:
            out.append(("sequence_parallel", f"{name} has no sequence parallelism"))
        if not self.runs_sharding(layout.sharding):
            out.append(("sharding", f"{name} does not run sharding {layout.sharding.describe()} "
                                    f"(it runs {self.describe_shardings(self.shardings)}"
                                    f"{self._partial_words()})"))
        elif layout.pp > 1 and not self.runs_sharding(layout.sharding, pipeline=True):
            out.append(("pipeline_sharding",
                        f"{name} does not compose sharding {layout.sharding.describe()} with "
                        f"pipeline parallelism (with pp > 1 it runs "
                        f"{self.describe_shardings(self.pipeline_shardings)})"))
        if layout.recompute not in self.recomputes:
            out.append(("recompute", f"{name} has no '{layout.recompute}' recomputation "
                                     f"(it has {', '.join(self.recomputes)})"))
        if layout.pp > 1 and layout.schedule in self.microbatch_per_stage \
                and layout.num_microbatches < layout.pp:
            out.append(("pipeline_microbatches",
                        f"{name}'s {layout.schedule} schedule needs at least one micro-batch per "
                        f"stage: pp ({layout.pp}) > micro-batches per step "
                        f"({layout.num_microbatches} = global_batch / (micro_batch x dp))"))
        for knob, values, why in self.only:
            if getattr(layout, knob) not in values:
                runs = " or ".join(_word(v, knob) for v in values)
                out.append((f"only_{knob}", f"{name} runs {knob} = {runs} only: {why}"))
        if model is None:
            return out
        # Given end stages are split by Megatron-Core's own rules, interleaved or not
        # (specs/pipeline_split.py given_ends); the rule here is the engine's own split's.
        if not self.uneven_interleaved and layout.chunks > layout.pp \
                and model.layers % layout.chunks \
                and not (layout.first_stage_layers or layout.last_stage_layers):
            out.append(("uneven_interleaved",
                        f"{name} splits layers unevenly only without interleaving: layers "
                        f"({model.layers}) is not divisible by the {layout.chunks} chunks of "
                        f"its interleaved pipeline"))
        if self.whole_kv_heads and model.kv_heads < layout.tp:
            out.append(("whole_kv_heads", f"{name} shards whole K/V heads: kv_heads "
                                          f"({model.kv_heads}) < tp ({layout.tp})"))
        if self.vocab_divisible and model.vocab % layout.tp:
            out.append(("vocab_tp", f"{name} splits the vocabulary over tp: vocab "
                                    f"({model.vocab}) is not divisible by tp ({layout.tp})"))
        return out

    def has_rule(self, rule: str) -> bool:
        """Whether this engine's ``rule`` can refuse anything (the planner lists only those)."""
        if rule.startswith("only_"):
            return any(knob == rule[5:] for knob, _, _ in self.only)
        return {
            "schedule": set(self.schedules) != set(Schedule),
            "dtype": set(self.dtypes) != set(DType),
            "sequence_parallel": not self.sequence_parallel,
            "sharding": self.shardings is not None,
            "pipeline_sharding": self.pipeline_shardings is not None,
            "recompute": set(self.recomputes) != set(Recompute),
            "pipeline_microbatches": bool(self.microbatch_per_stage),
            "uneven_interleaved": not self.uneven_interleaved,
            "whole_kv_heads": self.whole_kv_heads,
            "vocab_tp": self.vocab_divisible,
        }[rule]

    def reason(self, rule: str) -> str:
        """The short form of ``rule`` for the planner's rejection counts, naming the engine."""
        name = f"engine {self.engine}"
        for knob, values, _ in self.only:
            if rule == f"only_{knob}":
                return f"{name} runs {knob} = {' or '.join(_word(v, knob) for v in values)} only"
        missing = [str(w) for w in Schedule if w not in self.schedules]
        return {
            "schedule": f"{name} has no {' or '.join(missing)} pipeline schedule",
            "dtype": f"{name} does not train in "
                     f"{' or '.join(str(d) for d in DType if d not in self.dtypes)}",
            "sequence_parallel": f"{name} has no sequence parallelism",
            "sharding": f"{name} runs only {self.describe_shardings(self.shardings)}"
                        + ((" and HSDP (params, grads and optimizer all partial:k)"
                            if self.partial_form == "hsdp" else " and partial ZeRO-3 placements")
                           if self.partial_sharding else ""),
            "pipeline_sharding": f"{name} runs only "
                                 f"{self.describe_shardings(self.pipeline_shardings)} with pp > 1",
            "recompute": f"{name} has no "
                         f"{' or '.join(str(r) for r in Recompute if r not in self.recomputes)} "
                         "recomputation",
            "pipeline_microbatches": f"{name} needs a micro-batch per stage with "
                                     f"{' or '.join(self.microbatch_per_stage)}",
            "uneven_interleaved": f"{name} splits layers unevenly only without interleaving",
            "whole_kv_heads": f"{name} shards whole K/V heads (kv_heads < tp)",
            "vocab_tp": f"{name} needs vocab divisible by tp",
        }[rule]

    def runs_sharding(self, sharding: Sharding, pipeline: bool = False) -> bool:
        allowed = self.pipeline_shardings if pipeline and self.pipeline_shardings is not None \
            else self.shardings
        if allowed is None:
            return True
        if sharding in allowed:
            return True
        if not self.partial_sharding:
            return False
        if self.partial_form == "hsdp":
            return _is_hsdp(sharding)
        return _is_partial_of_zero3(sharding) and not pipeline

    def _partial_words(self) -> str:
        """The partial placements it runs beyond ``shardings``, as the refusal words them."""
        if not self.partial_sharding:
            return ""
        if self.partial_form == "hsdp":
            return " and HSDP: params, grads and optimizer all partial:k"
        return " and ZeRO++ hpZ: p=partial:k,g=full,o=full"

    @staticmethod
    def describe_shardings(shardings: tuple[Sharding, ...] | None) -> str:
        if shardings is None:
            return "any placement"
        return ", ".join(s.describe() for s in shardings)


def _word(value: object, knob: str = "") -> str:
    """A knob value as the user writes it (on/off for a boolean, etp's stored 0 as tp)."""
    if knob == "etp" and value == 0:
        return "tp"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def _is_partial_of_zero3(sharding: Sharding) -> bool:
    """ZeRO++ hpZ (parameters partial, the rest fully sharded): the partial placement DeepSpeed
    builds on ZeRO-3. MiCS (every component partial over one group) was the other, removed in
    DeepSpeed 0.19 (module docstring)."""
    kinds = [getattr(sharding, c).kind for c in COMPONENTS]
    return kinds == [PlacementKind.PARTIAL, PlacementKind.FULL, PlacementKind.FULL]


def _is_hsdp(sharding: Sharding) -> bool:
    """FSDP2's hybrid sharding: every component partial over the same group of k ranks."""
    parts = [getattr(sharding, c) for c in COMPONENTS]
    return (all(p.kind == PlacementKind.PARTIAL for p in parts)
            and len({p.group for p in parts}) == 1)


# Korthikanti et al. 2022's recomputation (none, the attention core, whole blocks).
_BLOCK_RECOMPUTES = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)

RULES: dict[Engine, EngineRules] = {
    Engine.NATIVE: EngineRules(
        engine=Engine.NATIVE, title="PyTorch native (FSDP2, DTensor TP, pipelining)",
        schedules=(Schedule.GPIPE, Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED),
        # FSDP2 expresses ZeRO-1/2/3 (replicated or resharded parameters over one mesh
        # dimension) and HSDP (its 2-D mesh); an AMSP mix such as p=partial:8,g=full,o=full
        # has no ``fully_shard`` equivalent, so the planner never proposes it (flm bench's
        # mesh_dims refuses it too).
        shardings=tuple(zero_preset(s) for s in range(4)), pipeline_shardings=None,
        partial_sharding=True, partial_form="hsdp",
        # fp8: torchao's float8 linears (``convert_to_float8_training``), torchtitan's path.
        sequence_parallel=True, dtypes=(DType.FP32, DType.BF16, DType.FP8),
        dtype_reason="; fp16 needs loss scaling, which flm bench's native engine does not do",
        # torch.utils.checkpoint: whole blocks, the attention core, or op by op with a policy
        # (create_selective_checkpoint_contexts; costmodel/checkpoint_policy.py).
        recomputes=tuple(Recompute),
        # FSDP2 ``fully_shard``: reshard_after_forward=True by default, implicit prefetch of the
        # next layer's all-gather in forward and backward; torchtitan's (and flm bench's)
        # mixed precision reduces gradients in fp32 (``mixed_precision_reduce = "float32"``).
        # ``fully_shard`` on each block gathers the block's parameters in one all-gather and
        # reduce-scatters its gradients in one reduce-scatter.
        tp_comm_overlap=False, prefetch=1, prefetch_bucket_params=0, gather_per_module=False,
        reduce_bucket_params=0, reshard_after_forward=True, gradient_bucketing=True,
        reduce_fp32=True, pipeline_split="manual", whole_kv_heads=True, vocab_divisible=True,
        # torch.distributed.pipelining's Schedule1F1B raises "Number of microbatches (m) must be
        # greater than or equal to the number of stages" (its GPipe runs m < pp; the
        # interleaved schedule's own rule, m a multiple of pp, already implies m >= pp).
        microbatch_per_stage=(Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED),
    ),
    Engine.MEGATRON: EngineRules(
        engine=Engine.MEGATRON, title="Megatron-LM", fused_elementwise=True,
        schedules=(Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED),
        shardings=(zero_preset(0), zero_preset(1)), pipeline_shardings=None,
        partial_sharding=False, sequence_parallel=True,
        # fp8: ``--fp8-format hybrid`` with TransformerEngine's linears (``--fp8-recipe``).
        dtypes=(DType.FP32, DType.BF16, DType.FP16, DType.FP8), dtype_reason="",
        # ``--recompute-granularity selective|full``: the attention core or whole blocks.
        recomputes=_BLOCK_RECOMPUTES,
        # ``--tp-comm-overlap``, ``--overlap-grad-reduce`` / ``--overlap-param-gather`` (bucketed
        # DP communication behind backward / the next forward: the README's measured setting);
        # main gradients in fp32 and reduced in fp32 (``--accumulate-allreduce-grads-in-fp32``,
        # the default for bf16). No parameter sharding, so nothing to prefetch.
        tp_comm_overlap=True, prefetch=0, prefetch_bucket_params=0, gather_per_module=False,
        reduce_bucket_params=0, reshard_after_forward=False, gradient_bucketing=True,
        reduce_fp32=True, pipeline_split="first_last", uneven_interleaved=False,
        only=(("reshard_after_forward", (True,),
               "it shards no parameters (its distributed optimizer shards optimizer states), so "
               "there is nothing to keep gathered"),),
    ),
    Engine.DEEPSPEED: EngineRules(
        engine=Engine.DEEPSPEED, title="DeepSpeed",
        schedules=(Schedule.ONE_F_ONE_B,),
        shardings=tuple(zero_preset(s) for s in range(4)),
        pipeline_shardings=(zero_preset(0), zero_preset(1)), partial_sharding=True,
        sequence_parallel=False, dtypes=(DType.FP32, DType.BF16, DType.FP16),
        # DeepSpeed's config has bf16 / fp16 sections and no fp8 one (deepspeed/runtime/
        # precision_config.py); FP8 there means the model's own TransformerEngine layers, which
        # neither flm's DeepSpeed engine nor Megatron-DeepSpeed's GPT model use.
        dtype_reason=("; DeepSpeed has no fp8 precision of its own (its config: fp32, bf16, fp16): "
                      "train fp8 with --engine megatron or native"),
        # Its activation checkpointing (``deepspeed.checkpointing``) checkpoints functions the
        # model wraps: whole blocks or the attention core, not op by op.
        recomputes=_BLOCK_RECOMPUTES,
        # ZeRO-3 frees gathered parameters after each module's forward and gathers them again in
        # backward, prefetching at most ``stage3_prefetch_bucket_size`` parameters ahead (default
        # 5e7: a fraction of a large model's layer; deepspeed/runtime/zero/config.py);
        # ``overlap_comm`` is on by
        # default for stage 3 (reduction in ``reduce_bucket_size`` buckets behind backward);
        # gradients are reduced in the training dtype (``communication_data_type`` unset).
        # Parameters are fetched by a hook on each submodule (``fetch_sub_module``: one
        # all-gather per norm or linear layer), gradients reduced in ``reduce_bucket_size``
        # buckets (default 5e8 elements).
        tp_comm_overlap=False, prefetch=1, prefetch_bucket_params=50_000_000,
        gather_per_module=True, reduce_bucket_params=500_000_000,
        reshard_after_forward=True, gradient_bucketing=True, reduce_fp32=False,
        # Stages 0-2 as flm configures them (trainers/deepspeed_config.py: overlap_comm on),
        # from DeepSpeed 0.19's runtime/engine.py ``allreduce_gradients`` and
        # runtime/zero/stage_1_and_2.py: ZeRO-0 all-reduces the gradients after backward
        # (``buffered_allreduce_fallback``, not overlapped); ZeRO-1 reduces in backward hooks at
        # the accumulation boundary only, ZeRO-2 after every micro-batch
        # (``reduce_ready_partitions_and_remove_grads``: "ZeRO stage >= 2 communicates during
        # non gradient accumulation boundaries as well"); each bucket is all-reduced whole and
        # each rank keeps its slice (``use_multi_rank_bucket_allreduce``, default True since
        # 0.12.4, PR #4695); the updated parameters are all-gathered inside ``step``
        # (``all_gather_dp_groups``). Measured with DeepSpeed 0.19.8 on CPU:
        # tests/test_deepspeed_reduction.py.
        replicated_grad_overlap=False, sharded_grad_each_microbatch=True,
        sharded_grad_all_reduce=True, param_gather_overlap=False,
        # ZeRO-3 reduces each gradient from its backward hook on every micro-batch
        # (stage3.py ``reduce_ready_partitions_and_remove_grads``), as ZeRO-2 above.
        fsdp_grad_sync_each_microbatch=True,
        pipeline_split="parameters",
        # ZeRO-3 releases a module's parameters after its forward; what it keeps is bounded by
        # stage3_max_live_parameters and stage3_param_persistence_threshold (small parameters),
        # not a switch that keeps every layer gathered (deepspeed/runtime/zero/config.py).
        only=(("reshard_after_forward", (True,),
               "ZeRO-3 frees each module's parameters after its forward"),
              # DeepSpeed's sequence parallelism is Ulysses (all-to-all over heads,
              # ``sequence_parallel_size`` with its own process groups), not a ring or
              # all-gather context split, and flm bench's DeepSpeed engine does not build it.
              ("cp", (1,), "flm models and runs context parallelism as a ring/all-gather K/V "
                           "exchange (native, Megatron-LM), not DeepSpeed-Ulysses' all-to-all "
                           "over heads"),
              # DeepSpeed-MoE's expert groups are built by deepspeed.moe.layer.MoE(ep_size=...)
              # in the model code (deepspeed/moe/layer.py, 0.19); flm bench's DeepSpeed engine
              # builds no MoE block and the cost model prices Megatron-Core/torchtitan's
              # all-to-all dispatch, not DeepSpeed-MoE's.
              ("ep", (1,), "flm does not build or model DeepSpeed-MoE's expert-parallel groups "
                           "(deepspeed.moe.layer.MoE ep_size)"),
              # PipelineModule(partition_method=...) takes "parameters", "uniform" or
              # "type:REGEX" (deepspeed/runtime/pipe/module.py _partition_layers), no per-stage
              # counts: the split is its parameter balance.
              ("first_stage_layers", (0,), "DeepSpeed's PipelineModule balances stages by its "
                                           "partition_method, with no per-stage layer counts"),
              ("last_stage_layers", (0,), "DeepSpeed's PipelineModule balances stages by its "
                                          "partition_method, with no per-stage layer counts"),
              # DeepSpeed-MoE's experts follow the model's own tensor parallelism (its
              # enable_expert_tensor_parallelism switch: tp or none; deepspeed/moe/layer.py at
              # edaa7221267243c7be7fb49c5d5f5c4fb97b4641), with no degree of their own; flm
              # stores etp = tp as 0 (specs/axes.py).
              ("etp", (0,), "flm does not model DeepSpeed-MoE's expert tensor parallelism "
                            "(deepspeed.moe.layer.MoE enable_expert_tensor_parallelism): its "
                            "experts' tp is the model's, never an etp of its own")),
    ),
}


# The rules of :meth:`EngineRules.broken`, in its order: those of the layout alone (checked by
# Layout.__post_init__) and those against a model (checked by Layout.check_model).
ONLY_KNOBS = tuple(dict.fromkeys(knob for r in RULES.values() for knob, _, _ in r.only))
LAYOUT_RULES = ("schedule", "dtype", "sequence_parallel", "sharding", "pipeline_sharding",
                "recompute", "pipeline_microbatches", *(f"only_{k}" for k in ONLY_KNOBS))
MODEL_RULES = ("uneven_interleaved", "whole_kv_heads", "vocab_tp")


def rules_for(engine: Engine | str) -> EngineRules:
    return RULES[Engine.parse(engine, "engine")]


def check_engine(layout: Layout, model: ModelSpec | None = None) -> None:
    """Raise SpecError (field ``engine``) for the first rule of the layout's engine it breaks."""
    problems = rules_for(layout.engine).violations(layout, model)
    if problems:
        raise SpecError(problems[0], "engine")


# Whether a trainer's FSDP2 gradient accumulation reduce-scatters after every micro-batch
# (``fsdp_grad_sync_each_microbatch``), from each trainer's own loop. flm bench (the native
# engine's rule): bench/engine.py ``_fwd_bwd`` calls ``set_requires_gradient_sync(i == n - 1)``,
# so unsharded gradients accumulate until the last micro-batch (``flm bench
# --grad-sync-each-microbatch`` runs the other way). torchtitan: ``Trainer.train_step``
# (torchtitan/train.py, pytorch/torchtitan@000204a4a8bf3d0f31adc44fc29855fbb6ea13d8) runs
# ``forward_backward_step`` -> ``loss.backward()`` for each of its
# ``gradient_accumulation_steps`` without touching FSDP's sync, so FSDP2 reduce-scatters every
# backward and keeps only sharded gradients between them.
GRAD_SYNC_EACH = {"flm-bench": False, "torchtitan": True}

# How a trainer's context parallelism exchanges K/V and what it keeps for backward (the native
# engine's ``cp_exchange``; docs/costmodel.md "Context parallelism"), from each trainer's own
# attention. flm bench (the native engine's rule): bench/context_parallel.py all-gathers K and V
# once per layer (``CPContext.gather``, reduce-scattered in backward) and runs ONE attention of
# the local queries over the whole sequence under an (s/cp) x s mask kept for the step; autograd
# saves the gathered K/V. torchtitan: ``context_parallel`` (torchtitan/utils.py
# ``create_context_parallel_ctx`` at 9dec370, rotate method "allgather" by default,
# config_manager.py) dispatches SDPA to PyTorch's ``_templated_ring_attention``
# (torch/distributed/tensor/experimental/_context_parallel/_attention.py, torch 2.13.0 at
# cf30153c; _attention.py at 0123248a): cp partial flash attentions merged in fp32, no mask, the
# gathered K/V a transient of the layer's attention, gathered again in backward.
CP_EXCHANGES = ("gather", "ring")
CP_EXCHANGE = {"flm-bench": "gather", "torchtitan": "ring"}


def check_cp_exchange(value: str | None) -> str | None:
    """``value`` if it names a CP exchange (or is None: the engine's rule), else SpecError."""
    if value is not None and value not in CP_EXCHANGES:
        raise SpecError(f"cp_exchange {value!r} is not one of {', '.join(CP_EXCHANGES)} "
                        "(gather: flm bench's one K/V all-gather and masked attention; ring: "
                        "PyTorch's context_parallel, as torchtitan runs it)", "cp_exchange")
    return value
