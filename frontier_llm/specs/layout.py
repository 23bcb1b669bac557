"""Layout: one training layout (TP x PP x DP, micro-batches, schedule, recompute, sharding).

This module owns the layout. Every other form of it is derived from the :class:`Layout` dataclass
and its vocabularies (docs/layout.md): the cost model's numpy columns (``costmodel.layouts``), the
frames' columns, key, label and row codec (``specs.forms``), the searchable space
(``specs.space``), the store's ``flm_layouts`` columns, the trace schema's ``layout`` object, the
CLI's layout flags and the one ``flm bench`` argv codec (:func:`layout_argv`).

Its words are in ``specs.vocab`` and its sharding in ``specs.sharding`` (both re-exported here);
what each engine runs is in ``specs.engine_rules`` and how it splits layers over a pipeline in
``specs.pipeline_split``. None of them imports this module: the layout sits above its rules.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from frontier_llm.errors import SpecError
from frontier_llm.specs import axes
from frontier_llm.specs.engine_rules import check_engine
from frontier_llm.specs.model import ModelSpec
from frontier_llm.specs.pipeline_split import min_chunk_layers
from frontier_llm.specs.pipeline_split import stage_layers as split_layers
from frontier_llm.specs.sharding import COMPONENTS, Placement, Sharding, zero_preset
from frontier_llm.specs.vocab import (
    DType,
    Engine,
    FP8Recipe,
    PlacementKind,
    Recompute,
    Schedule,
    Vocabulary,
)

__all__ = ["COMPONENTS", "MAX_COUNT", "MAX_GPUS", "DType", "Engine", "FP8Recipe", "Layout",
           "ParallelConfig", "Placement", "PlacementKind", "Recompute", "Schedule", "Sharding",
           "Vocabulary",
           "complete_layout", "given_options", "int_minimum", "layout_argv", "layout_fields",
           "layout_json_schema", "layout_types", "merge_schedule", "parse_schedule_label",
           "row_schedule", "schedule_label", "zero_preset"]


# The largest GPU count anything plans, predicts or runs (2**20; Frontier has 75,264 GCDs and the
# largest planned systems a few hundred thousand): above it a request is a typing mistake, and
# refusing it keeps every enumeration bounded. Any other count (batch, steps) is at most
# MAX_COUNT, which keeps products of counts inside int64.
MAX_GPUS = 1_048_576
MAX_COUNT = 2**31 - 1


def _knob(help: str, **meta: Any) -> dict:
    """A layout field's metadata: its CLI help (the flag, choices and default are derived)."""
    return {"help": help, **meta}


@dataclass(frozen=True)
class Layout:
    """A layout. ``global_batch`` is in sequences; ``micro_batch`` is per pipeline micro-step.

    To add a knob: add a field here (type: int, bool or a Vocabulary; ``metadata=_knob(help)``)
    and give it its meaning (cost model, engine, rules below); docs/layout.md lists the rest.
    """

    # grid_open: a sweep's or study's space that does not list the knob leaves it to the
    # planner's list (specs/space.py) rather than the default; written_with: the knob is
    # written as part of another's text (the schedule's: interleaved:4); new_knob: traces from
    # before it may lack it; argv_quiet: layout_argv leaves it out at its default.
    tp: int = field(default=1, metadata=_knob("tensor-parallel degree", grid_open=True))
    # Context parallelism (torchtitan's context_parallel_degree, Megatron-LM's
    # --context-parallel-size): each sequence split over cp ranks in 2·cp chunks, rank r holding
    # chunks r and 2·cp-1-r so causal attention's work is even; the cp ranks share parameters,
    # so sharded data parallelism runs over dp x cp (shard_ranks).
    cp: int = field(default=1, metadata=_knob(
        "context-parallel degree: each sequence split over cp ranks (load-balanced causal "
        "split; seq_len divisible by 2 x cp)", new_knob=True, argv_quiet=True))
    pp: int = field(default=1, metadata=_knob("pipeline-parallel degree", grid_open=True))
    dp: int = field(default=1, metadata=_knob("data-parallel degree"))
    # Expert parallelism (Megatron-LM's --expert-model-parallel-size, torchtitan's
    # expert_parallel_degree): a Mixture-of-Experts block's routed experts split over ep ranks
    # taken from the dp x cp ranks (specs/axes.py: it adds no GPUs); tokens reach their experts
    # by an all-to-all over those ranks.
    ep: int = field(default=1, metadata=_knob(
        "expert-parallel degree: each MoE block's routed experts split over ep of the dp x cp "
        "ranks (adds no GPUs; num_experts divisible by ep)", new_knob=True, argv_quiet=True))
    micro_batch: int = field(default=1, metadata=_knob("sequences per micro-batch"))
    global_batch: int = field(default=1, metadata=_knob(
        "sequences per iteration (default micro-batch x dp)", default_text=None))
    schedule: Schedule = field(default=Schedule.ONE_F_ONE_B, metadata=_knob(
        "pipeline schedule (default 1f1b; interleaved when --virtual-stages > 1)",
        default_text=None))
    virtual_stages: int = field(default=1, metadata=_knob(
        "model chunks per pipeline rank for the interleaved schedule", grid_open=True,
        written_with="schedule"))
    sequence_parallel: bool = field(default=False, metadata=_knob(
        "shard norms and dropout over the TP ranks (needs tp >= 2)"))
    recompute: Recompute = field(default=Recompute.NONE, metadata=_knob(
        "activation recomputation"))
    # search: what a space that leaves the knob open searches (specs/space.py).
    flash_attention: bool = field(default=True, metadata=_knob(
        "model unfused attention (keeps the softmax scores)", search=(True,)))
    dtype: DType = field(default=DType.BF16, metadata=_knob(
        "training precision", default_text=None))
    sharding: Sharding = field(default_factory=Sharding, metadata=_knob(
        "per-component sharding (AMSP): params, grads, optim each replicate | full | "
        "partial:K, e.g. p=replicate,g=full,o=partial:8, or a ZeRO preset zero0..zero3"))
    engine: Engine = field(default=Engine.NATIVE, metadata=_knob(
        "training engine: native (PyTorch FSDP2 / tensor parallel / pipelining, flm bench's "
        "own), megatron (Megatron-LM) or deepspeed; each runs only what its rules allow",
        new_knob=True, search=("native",)))
    # FSDP's reshard_after_forward (PyTorch fully_shard; torchtitan's fsdp_reshard_after_forward,
    # which turns it off under pipeline parallelism, where every micro-batch would gather the
    # stage's parameters again): off keeps each layer's gathered parameters from its forward to
    # its backward, one all-gather fewer per layer and micro-batch for the memory of a whole
    # unsharded stage. It changes nothing where parameters are not sharded.
    reshard_after_forward: bool = field(default=True, metadata=_knob(
        "free sharded parameters after each layer's forward and gather them again in its "
        "backward (FSDP's reshard_after_forward); off keeps them: more memory, less "
        "communication", new_knob=True, search=(True,)))
    # FP8 scaling (specs/vocab.py FP8Recipe), read only with dtype fp8: which recipes an engine
    # and a GPU run is checked where the system is known (costmodel/fp8.py check_fp8).
    fp8_recipe: FP8Recipe = field(default=FP8Recipe.TENSORWISE, metadata=_knob(
        "FP8 scaling with --dtype fp8: tensorwise (current per-tensor scale), delayed "
        "(amax history), blockwise (1x128 / 128x128, DeepSeek-V3), mxfp8 (Blackwell, MI355X)",
        new_knob=True, argv_quiet=True, search=("tensorwise",)))
    # Uneven pipeline stages as Megatron-LM states them (--decoder-first-pipeline-num-layers,
    # --decoder-last-pipeline-num-layers): the first / last stage's transformer layers, the
    # middle stages splitting the rest evenly (specs/pipeline_split.py given_ends); 0 leaves
    # the split to the engine's own rule. Published MoE runs give them (DeepSeek-V3's 61 layers
    # over pp 16). A run's choice, not a searched knob (specs/space.py NOT_SEARCHED).
    first_stage_layers: int = field(default=0, metadata=_knob(
        "transformer layers of the first pipeline stage (Megatron-LM "
        "--decoder-first-pipeline-num-layers; 0: the engine's split); the middle stages share "
        "the rest evenly", new_knob=True, argv_quiet=True, minimum=0))
    last_stage_layers: int = field(default=0, metadata=_knob(
        "transformer layers of the last pipeline stage, which also holds the head, the loss "
        "and any multi-token-prediction layers (Megatron-LM --decoder-last-pipeline-num-layers; "
        "0: the engine's split)", new_knob=True, argv_quiet=True, minimum=0))
    # Expert tensor parallelism (Megatron-LM's --expert-tensor-parallel-size, torchtitan
    # v0.2.2's expert_tensor_parallel_degree): the routed experts' own tensor-parallel degree,
    # folded like ep over the stage's tp x cp x dp ranks (specs/axes.py). 0 means "the same as
    # tp", both trainers' default, and a layout given etp = tp stores 0: one layout, one key.
    etp: int = field(default=0, metadata=_knob(
        "expert-tensor-parallel degree: each routed expert's MLP split over etp ranks, the "
        "experts re-folding the stage's tp x cp x dp ranks as etp x ep x expert-dp "
        "(Megatron-Core MoE parallel folding; etp x ep must divide tp x cp x dp; e.g. --tp 4 "
        "--etp 1). Default: the same as tp", default_text=None, new_knob=True,
        argv_quiet=True, minimum=0))

    def __post_init__(self) -> None:
        if not isinstance(self.sharding, Sharding):
            object.__setattr__(self, "sharding", Sharding.parse(self.sharding))
        for name, kind in layout_types().items():
            if isinstance(kind, type) and issubclass(kind, Vocabulary):
                object.__setattr__(self, name, kind.parse(getattr(self, name), name))
            elif kind is int and getattr(self, name) < int_minimum(name):
                raise SpecError(f"{name} must be at least {int_minimum(name)} "
                                f"(got {getattr(self, name)})", name)
            elif kind is int and getattr(self, name) > MAX_COUNT:
                raise SpecError(f"{name} must be at most {MAX_COUNT:,} (got {getattr(self, name)})",
                                name)
        if self.world_size > MAX_GPUS:
            raise SpecError(f"tp x cp x pp x dp = {self.world_size:,} GPUs is above the maximum of "
                            f"{MAX_GPUS:,}", "dp")
        self._check_expert_tp()
        if not self.etp and self.shard_ranks % self.ep:
            raise SpecError(
                f"ep ({self.ep}) does not divide "
                + (f"dp x cp ({self.dp} x {self.cp})" if self.cp > 1 else f"dp ({self.dp})")
                + ": expert parallelism splits the experts over ranks that share the dense "
                "parameters (Megatron-Core: expert-dp = tp x cp x dp / (expert-tp x ep))",
                "ep",
            )
        per_step = self.micro_batch * self.dp
        if self.global_batch % per_step:
            raise SpecError(
                f"global_batch ({self.global_batch}) is not divisible by micro_batch x dp "
                f"({self.micro_batch} x {self.dp} = {per_step})",
                "global_batch",
            )
        if self.virtual_stages > 1 and self.schedule != Schedule.INTERLEAVED:
            raise SpecError(
                f"virtual_stages ({self.virtual_stages}) > 1 needs schedule 'interleaved' "
                f"(got '{self.schedule}')",
                "virtual_stages",
            )
        if self.schedule == Schedule.INTERLEAVED:
            if self.pp < 2:
                raise SpecError("schedule 'interleaved' needs pp >= 2", "schedule")
            if self.num_microbatches % self.pp:
                raise SpecError(
                    f"schedule 'interleaved' needs the number of micro-batches "
                    f"({self.num_microbatches}) to be a multiple of pp ({self.pp})",
                    "schedule",
                )
        if self.sequence_parallel and self.tp < 2:
            raise SpecError("sequence_parallel needs tp >= 2", "sequence_parallel")
        if self.pp < 2 and (self.first_stage_layers or self.last_stage_layers):
            raise SpecError("first_stage_layers / last_stage_layers need pp >= 2",
                            "first_stage_layers" if self.first_stage_layers
                            else "last_stage_layers")
        for comp in COMPONENTS:
            place: Placement = getattr(self.sharding, comp)
            if place.kind == PlacementKind.PARTIAL and (place.group < 1
                                                        or self.shard_ranks % place.group):
                raise SpecError(
                    f"sharding.{comp} partial group ({place.group}) does not divide "
                    + (f"dp x cp ({self.dp} x {self.cp})" if self.cp > 1 else f"dp ({self.dp})"),
                    "sharding",
                )
        # Sharded state can not be coarser than what is built from it: parameters are updated
        # from gradients, gradients from optimizer shards (AMSP section 3).
        deg = {c: getattr(self.sharding, c).degree(self.shard_ranks) for c in COMPONENTS}
        if not deg["params"] <= deg["grads"] <= deg["optim"] or (
            deg["optim"] % deg["grads"] or deg["grads"] % deg["params"]
        ):
            raise SpecError(
                "sharding must shard optimizer states at least as finely as gradients, and "
                f"gradients at least as finely as parameters (got {self.sharding.describe()})",
                "sharding",
            )
        check_engine(self)

    def _check_expert_tp(self) -> None:
        """Store etp = tp as 0 (the default) and refuse an expert fold that does not tile the
        stage: Megatron-Core raises unless etp x ep x pp divides the world
        (parallel_state.py initialize_model_parallel, specs/axes.py), i.e. etp x ep divides
        tp x cp x dp."""
        if self.etp == self.tp:
            object.__setattr__(self, "etp", 0)
        if self.etp and (self.tp * self.shard_ranks) % (self.etp * self.ep):
            raise SpecError(
                f"etp x ep ({self.etp} x {self.ep}) does not divide tp x cp x dp ({self.tp} x "
                f"{self.cp} x {self.dp}): the experts re-fold a pipeline stage's ranks as "
                "etp x ep x expert-dp (Megatron-Core: expert-dp = tp x cp x dp / (etp x ep))",
                "etp",
            )

    @property
    def expert_tp(self) -> int:
        """The routed experts' tensor-parallel degree: etp, or tp where etp is 0 (default)."""
        return int(axes.expert_tensor_parallel(self))

    @property
    def world_size(self) -> int:
        return axes.world_size(self)

    @property
    def shard_ranks(self) -> int:
        """Ranks that hold the same parameters and shard their state: dp x cp (the cp ranks of a
        replica see different tokens of the same sequences, like data-parallel ranks;
        torchtitan's dp_shard_cp mesh, Megatron's data-parallel-with-context group)."""
        return axes.shard_ranks(self)

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per step per data-parallel replica (gradient accumulation steps)."""
        return self.global_batch // (self.micro_batch * self.dp)

    @property
    def zero_stage(self) -> int | None:
        return self.sharding.zero_stage()

    def check_model(self, model: ModelSpec) -> None:
        """Raise SpecError when ``model`` can not be split this way; the message names the rule."""
        if model.heads % self.tp:
            raise SpecError(f"heads ({model.heads}) is not divisible by tp ({self.tp})", "tp")
        if model.kv_heads % self.tp and self.tp % model.kv_heads:
            raise SpecError(
                f"kv_heads ({model.kv_heads}) and tp ({self.tp}) must divide one another", "tp"
            )
        if model.ffn_hidden % self.tp:
            raise SpecError(
                f"ffn_hidden ({model.ffn_hidden}) is not divisible by tp ({self.tp})", "tp"
            )
        if self.ep > 1 and not model.is_moe:
            raise SpecError(f"ep ({self.ep}) needs a Mixture-of-Experts model ({model.name} is "
                            "dense: num_experts 0)", "ep")
        if model.num_experts % self.ep:
            raise SpecError(f"num_experts ({model.num_experts}) is not divisible by ep "
                            f"({self.ep})", "ep")
        if model.is_moe and model.expert_ffn_hidden % self.expert_tp:
            # Each expert's MLP splits over expert-tp (tp unless etp says otherwise).
            name = "etp" if self.etp else "tp"
            raise SpecError(f"expert_ffn_hidden ({model.expert_ffn_hidden}) is not divisible by "
                            f"{name} ({self.expert_tp})", name)
        if self.etp and not model.is_moe:
            raise SpecError(f"etp ({self.etp}) needs a Mixture-of-Experts model ({model.name} "
                            "is dense: num_experts 0)", "etp")
        chunks = self.pp * self.virtual_stages
        if chunks > 1 and min_chunk_layers(model, self.pp, self.virtual_stages, self.engine,
                                           *self.given_ends) < 1:
            # Uneven splits are fine (specs/pipeline_split.py); a chunk with no layer is not.
            raise SpecError(
                f"layers ({model.layers}) split over pp x virtual_stages "
                f"({self.pp} x {self.virtual_stages} = {chunks}) chunks the way engine "
                f"{self.engine} splits them leaves a chunk without layers",
                "pp",
            )
        if self.cp > 1 and model.seq_len % (2 * self.cp):
            raise SpecError(
                f"seq_len ({model.seq_len}) is not divisible by 2 x cp ({2 * self.cp}): the "
                "load-balanced causal split cuts each sequence into 2 x cp equal chunks",
                "cp",
            )
        if self.sequence_parallel and (model.seq_len // self.cp) % self.tp:
            raise SpecError(
                f"seq_len ({model.seq_len}) is not divisible by tp ({self.tp}) for sequence "
                "parallelism" if self.cp == 1 else
                f"the sequence share of a cp rank ({model.seq_len} / cp {self.cp}) is not "
                f"divisible by tp ({self.tp}) for sequence parallelism",
                "sequence_parallel",
            )
        check_engine(self, model)

    def stage_layers(self, model: ModelSpec) -> tuple[int, ...]:
        """Layers of each model chunk in pipeline order, split the way this layout's engine
        splits them, or around its given end stages by Megatron-Core's rules
        (``specs/pipeline_split.py``), after :meth:`check_model`."""
        self.check_model(model)
        return split_layers(model.layers, self.pp, self.virtual_stages, self.engine, model,
                            *self.given_ends)

    @property
    def given_ends(self) -> tuple[int, int]:
        """(first_stage_layers, last_stage_layers): the end stages' layers as given, 0 where
        the engine's split decides."""
        return self.first_stage_layers, self.last_stage_layers

    @property
    def chunks(self) -> int:
        """Model chunks of the pipeline: pp stages, each holding virtual_stages of them."""
        return self.pp * self.virtual_stages

    def rank_chunks(self, pp_rank: int) -> list[int]:
        """The chunks pipeline rank ``pp_rank`` holds, in execution order: chunk ``c`` of rank
        ``r`` is global chunk ``c·pp + r`` (Narayanan et al. 2021's interleaving)."""
        return [c * self.pp + pp_rank for c in range(self.virtual_stages)]

    def chunk_layer_ids(self, model: ModelSpec, chunk: int) -> list[int]:
        """The indices of the transformer layers global chunk ``chunk`` holds, by this layout's
        engine's split (:meth:`stage_layers`)."""
        counts = self.stage_layers(model)
        start = sum(counts[:chunk])
        return list(range(start, start + counts[chunk]))

    def check_world(self, world_size: int) -> None:
        if self.world_size != world_size:
            cp = f" x {self.cp}" if self.cp > 1 else ""
            raise SpecError(
                f"tp x {'cp x ' if cp else ''}pp x dp = {self.tp}{cp} x {self.pp} x {self.dp} = "
                f"{self.world_size} does not match the {world_size} GPUs/ranks available",
                "dp",
            )

    def to_dict(self) -> dict:
        """Plain JSON types: the trace's, the manifest's and ``layout_hash``'s form."""
        d: dict[str, Any] = {}
        for name, kind in layout_types().items():
            value = getattr(self, name)
            if kind is Sharding:
                d[name] = value.to_dict()
            elif isinstance(value, Vocabulary):
                d[name] = value.value
            else:
                d[name] = value
        d["zero_stage"] = self.zero_stage
        return d

    @classmethod
    def from_dict(cls, data: dict) -> Layout:
        from frontier_llm.specs.build import build

        data = data.copy()  # a LineMap's copy keeps its line numbers
        data.pop("zero_stage", None)
        zero = data.pop("zero", None)
        if zero is not None and "sharding" not in data:
            data["sharding"] = zero
        return build(cls, data, nested={"sharding": Sharding.parse})


# The old name, kept for one release.
ParallelConfig = Layout


@cache
def layout_types() -> dict[str, type]:
    """Field name -> its type (int, bool, a Vocabulary or Sharding), in field order."""
    hints = typing.get_type_hints(Layout)
    return {f.name: hints[f.name] for f in dataclasses.fields(Layout)}


def layout_fields() -> tuple[dataclasses.Field, ...]:
    return dataclasses.fields(Layout)


@cache
def int_minimum(name: str) -> int:
    """The least value of int field ``name``: 1, or the field's ``minimum`` metadata (0 for a
    count where 0 means "not given": first_stage_layers)."""
    meta = next(f.metadata for f in layout_fields() if f.name == name)
    return int(meta.get("minimum", 1))


def given_options(options: Any) -> dict:
    """The layout options an object (an argparse namespace) holds, without those left None:
    every field, and ``zero``, the sharding's ZeRO shorthand."""
    names = (*layout_types(), "zero")
    return {n: getattr(options, n) for n in names if getattr(options, n, None) is not None}


def schedule_label(schedule: str, virtual_stages: int) -> str:
    """The schedule with its interleaving, the one way it is written: ``1f1b``, ``gpipe``,
    ``interleaved:4``."""
    if str(schedule) == Schedule.INTERLEAVED:
        return f"{Schedule.INTERLEAVED}:{int(virtual_stages)}"
    return str(schedule)


def row_schedule(row: Any) -> str:
    """:func:`schedule_label` of a mapping or frame row holding the two fields."""
    return schedule_label(str(row["schedule"]), int(row["virtual_stages"]))


def parse_schedule_label(text: str) -> dict[str, Any]:
    """``interleaved:4`` -> schedule and virtual_stages (the inverse of :func:`schedule_label`)."""
    schedule, _, v = str(text).partition(":")
    return {"schedule": schedule, "virtual_stages": int(v) if v else 1}


def merge_schedule(lists: dict[str, Any]) -> dict[str, Any]:
    """Value lists with the schedule and its interleaving depths as one list of labels
    (``1f1b``, ``interleaved:2``, ``interleaved:4``): depth means something only interleaved,
    so a study searches the two as one parameter."""
    out = dict(lists)
    schedules, depths = out.pop("schedule"), out.pop("virtual_stages") or [1]
    out["schedule"] = [schedule_label(x, v) for x in schedules
                       for v in (depths if x == Schedule.INTERLEAVED else [1])]
    return out


def complete_layout(values: dict) -> dict:
    """Fill what a command line or a config file may leave out, the same way everywhere:
    ``zero`` is a sharding preset, ``global_batch`` defaults to micro_batch x dp and the schedule
    to interleaved when virtual_stages > 1. Returns a new mapping for :meth:`Layout.from_dict`."""
    out = values.copy()
    zero = out.pop("zero", None)
    if zero is not None and out.get("sharding") is None:
        out["sharding"] = zero
    for key in [k for k, v in out.items() if v is None]:
        del out[key]
    out.setdefault("global_batch", out.get("micro_batch", 1) * out.get("dp", 1))
    if "schedule" not in out and out.get("virtual_stages", 1) > 1:
        out["schedule"] = Schedule.INTERLEAVED.value
    return out


def layout_argv(layout: Layout) -> list[str]:
    """The one ``flm bench`` argv codec (sweep jobs and the local spawner): every field, fully
    resolved; the flags are those :func:`frontier_llm.cli.layout_args.add_layout_args` derives
    from the same fields, so ``layout_argv`` -> parse -> ``Layout`` is the identity."""
    argv: list[str] = []
    for f in layout_fields():
        value, flag = getattr(layout, f.name), "--" + f.name.replace("_", "-")
        kind = layout_types()[f.name]
        if f.metadata.get("argv_quiet") and value == f.default:
            continue  # left out at its default: job lines stay as before the knob existed
        if kind is bool:
            if value != f.default:
                argv.append(flag if value else "--no-" + f.name.replace("_", "-"))
        elif kind is Sharding:
            argv += [flag, value.describe()]
        else:
            argv += [flag, str(value)]
    return argv


def layout_json_schema() -> dict:
    """The trace schema's ``layout`` object, derived from the fields (bench/trace.py injects it
    into trace_schema.json)."""
    props: dict[str, Any] = {}
    for name, kind in layout_types().items():
        if kind is bool:
            props[name] = {"type": "boolean"}
        elif kind is int:
            props[name] = {"type": "integer", "minimum": int_minimum(name)}
        elif kind is Sharding:
            props[name] = {
                "type": "object", "required": list(COMPONENTS),
                "properties": {c: {"type": "string"} for c in COMPONENTS},
            }
        else:
            props[name] = {"enum": list(kind.words())}
    props["zero_stage"] = {"type": ["integer", "null"]}
    # A knob added later is optional: traces written before it still validate (at its default).
    required = [f.name for f in layout_fields() if not f.metadata.get("new_knob")]
    return {"type": "object", "required": required, "properties": props}
