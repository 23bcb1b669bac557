"""Layout: one training layout (TP x PP x DP, micro-batches, schedule, recompute, sharding).

This module owns the layout. Every other form of it is derived from the :class:`Layout` dataclass
and its vocabularies (docs/layout.md): the cost model's numpy columns (``costmodel.layouts``), the
plan's DataFrame columns, the store's ``flm_layouts`` columns, the trace schema's ``layout``
object, the CLI's layout flags and the one ``flm bench`` argv codec (:func:`layout_argv`).

Vocabularies are ``StrEnum`` s: a member *is* its text (``Schedule.GPIPE == "gpipe"``), and its
position in the class is its numpy code (``Recompute.FULL.code == 2``), so formulas compare with
``Recompute.FULL.code``, never with a bare integer.

Sharding follows AMSP (arXiv 2311.00257): parameters, gradients and optimizer states each choose
``replicate`` (Full-Replica), ``full`` (Full-Sharding over all DP ranks) or ``partial`` (sharding
over groups of ``k`` DP ranks, replicated across groups). ZeRO-0..3, FSDP, HSDP and MiCS are points
of that space; :func:`zero_preset` names the ZeRO ones. Its one text form is
:meth:`Sharding.describe` (``zero2`` or ``p=replicate,g=full,o=partial:8``), read back by
:meth:`Sharding.parse`.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cache
from typing import Any

from frontier_llm.errors import SpecError
from frontier_llm.specs.model import ModelSpec


class Vocabulary(StrEnum):
    """A closed set of words; the member order is the numpy code (never reorder, only append)."""

    @property
    def code(self) -> int:
        """This member's position: its code in numpy columns and formulas."""
        return _code(type(self), self)

    @classmethod
    def words(cls) -> tuple[str, ...]:
        """The members' texts in code order (CLI ``choices``, schema ``enum``, categories)."""
        return tuple(m.value for m in _members(cls))

    @classmethod
    def from_code(cls, code: int):
        return _members(cls)[int(code)]

    @classmethod
    def parse(cls, value: Any, name: str):
        """The member for ``value`` (a member or its text); SpecError naming the field."""
        try:
            return cls(value)
        except ValueError:
            raise SpecError(f"{name} must be one of {', '.join(cls.words())} (got {value!r})",
                            name) from None


@cache
def _members(cls: type[Vocabulary]) -> tuple:
    return tuple(cls)


@cache
def _code(cls: type[Vocabulary], member: Vocabulary) -> int:
    # Keyed by class too: members of two vocabularies may share a word ("full") and a hash.
    return _members(cls).index(member)


class Schedule(Vocabulary):
    """Pipeline schedule (Narayanan et al. 2021)."""

    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"


class Recompute(Vocabulary):
    """Activation recomputation. ``selective`` and ``full`` are Korthikanti et al. 2022's
    (the attention core, the whole block); ``selective-op`` is PyTorch's op-level selective
    activation checkpointing as torchtitan applies it (``mode = 'selective'``,
    ``selective_ac_option = 'op'``): each block keeps the outputs of its 1st, 3rd, 5th, ...
    matrix multiply and of the attention kernel and recomputes everything else."""

    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"
    SELECTIVE_OP = "selective-op"


class DType(Vocabulary):
    """Training precision."""

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"


class Engine(Vocabulary):
    """The training engine that runs a layout (its rules: ``specs/engine_rules.py``)."""

    NATIVE = "native"
    MEGATRON = "megatron"
    DEEPSPEED = "deepspeed"


class PlacementKind(Vocabulary):
    """How one model-state component is spread over the DP ranks (AMSP)."""

    REPLICATE = "replicate"
    FULL = "full"
    PARTIAL = "partial"


COMPONENTS = ("params", "grads", "optim")
# The largest GPU count anything plans, predicts or runs (2**20; Frontier has 75,264 GCDs and the
# largest planned systems a few hundred thousand): above it a request is a typing mistake, and
# refusing it keeps every enumeration bounded. Any other count (batch, steps) is at most
# MAX_COUNT, which keeps products of counts inside int64.
MAX_GPUS = 1_048_576
MAX_COUNT = 2**31 - 1
# The short names of the sharding text form (p=..,g=..,o=..); the long names are accepted too.
_SHORT = {"p": "params", "g": "grads", "o": "optim"}


@dataclass(frozen=True)
class Placement:
    """How one model-state component is spread over the DP ranks.

    ``group`` is the sharding degree for ``partial`` (it must divide dp); ignored otherwise.
    """

    kind: PlacementKind = PlacementKind.REPLICATE
    group: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", PlacementKind.parse(self.kind, "sharding"))

    def degree(self, dp: int) -> int:
        """Number of DP ranks one copy of this component is sharded over."""
        if self.kind == PlacementKind.REPLICATE:
            return 1
        if self.kind == PlacementKind.FULL:
            return dp
        return self.group

    def __str__(self) -> str:
        return f"partial:{self.group}" if self.kind == PlacementKind.PARTIAL else str(self.kind)

    @classmethod
    def parse(cls, text: str | dict | Placement) -> Placement:
        if isinstance(text, Placement):
            return text
        if isinstance(text, dict):
            return cls(kind=text.get("kind", "replicate"), group=int(text.get("group", 1)))
        kind, _, group = str(text).partition(":")
        if kind not in PlacementKind.words():
            raise SpecError(
                f"a placement is replicate, full or partial:K (got {text!r})", "sharding"
            )
        if kind == PlacementKind.PARTIAL:
            if not group.isdigit() or int(group) < 1:
                raise SpecError(
                    f"partial sharding needs a group size, e.g. partial:8 (got {text!r})",
                    "sharding",
                )
            return cls(kind=PlacementKind.PARTIAL, group=int(group))
        return cls(kind=PlacementKind(kind))


@dataclass(frozen=True)
class Sharding:
    """Placement of parameters, gradients and optimizer states (AMSP's three choices)."""

    params: Placement = field(default_factory=Placement)
    grads: Placement = field(default_factory=Placement)
    optim: Placement = field(default_factory=Placement)

    def zero_stage(self) -> int | None:
        """The ZeRO stage this equals when all sharded parts are fully sharded, else None."""
        for stage in range(4):
            if self == zero_preset(stage):
                return stage
        return None

    def describe(self) -> str:
        """The one text form: ``zero0``..``zero3`` for the presets, else
        ``p=<placement>,g=<placement>,o=<placement>``; :meth:`parse` reads it back."""
        stage = self.zero_stage()
        if stage is not None:
            return f"zero{stage}"
        return f"p={self.params},g={self.grads},o={self.optim}"

    def to_dict(self) -> dict[str, str]:
        """Component -> placement text (the trace's and the manifest's form)."""
        return {c: str(getattr(self, c)) for c in COMPONENTS}

    @classmethod
    def parse(cls, value: dict | str | int | Sharding) -> Sharding:
        """Accept a ZeRO stage (``2``, ``"zero2"``), the text of :meth:`describe`
        (``p=replicate,g=full,o=partial:8``; ``params=``.. too) or a mapping of component ->
        placement."""
        if isinstance(value, Sharding):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return zero_preset(value)
        if isinstance(value, str):
            if "=" in value:
                return cls.parse(_components(value))
            text = value.lower().removeprefix("zero").removeprefix("-")
            if text.isdigit():
                return zero_preset(int(text))
            raise SpecError(f"sharding is a ZeRO stage 0-3 or a mapping (got {value!r})",
                            "sharding")
        if isinstance(value, dict):
            unknown = set(value) - set(COMPONENTS)
            if unknown:
                raise SpecError(
                    f"sharding has unknown component(s) {', '.join(sorted(unknown))} "
                    f"(valid: {', '.join(COMPONENTS)})",
                    "sharding",
                )
            return cls(**{k: Placement.parse(v) for k, v in value.items()})
        raise SpecError(f"sharding is a ZeRO stage 0-3 or a mapping (got {value!r})", "sharding")


def _components(text: str) -> dict[str, str]:
    """``p=..,g=..,o=..`` (or long names) as a component -> placement mapping."""
    parts = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, sep, value = item.partition("=")
        name = _SHORT.get(key, key)
        if not sep or name not in COMPONENTS:
            raise SpecError(f"sharding takes p=..,g=..,o=.. (got {item!r})", "sharding")
        parts[name] = value
    return parts


@cache
def zero_preset(stage: int) -> Sharding:
    """ZeRO stage 0-3 (Rajbhandari et al. 2020) as an AMSP placement."""
    full, rep = Placement(PlacementKind.FULL), Placement(PlacementKind.REPLICATE)
    presets = {
        0: Sharding(rep, rep, rep),
        1: Sharding(rep, rep, full),
        2: Sharding(rep, full, full),
        3: Sharding(full, full, full),
    }
    if stage not in presets:
        raise SpecError(f"zero stage must be 0, 1, 2 or 3 (got {stage})", "zero")
    return presets[stage]


def _knob(help: str, **meta: Any) -> dict:
    """A layout field's metadata: its CLI help (the flag, choices and default are derived)."""
    return {"help": help, **meta}


@dataclass(frozen=True)
class Layout:
    """A layout. ``global_batch`` is in sequences; ``micro_batch`` is per pipeline micro-step.

    To add a knob: add a field here (type: int, bool or a Vocabulary; ``metadata=_knob(help)``)
    and give it its meaning (cost model, engine, rules below); docs/layout.md lists the rest.
    """

    tp: int = field(default=1, metadata=_knob("tensor-parallel degree"))
    pp: int = field(default=1, metadata=_knob("pipeline-parallel degree"))
    dp: int = field(default=1, metadata=_knob("data-parallel degree"))
    micro_batch: int = field(default=1, metadata=_knob("sequences per micro-batch"))
    global_batch: int = field(default=1, metadata=_knob(
        "sequences per iteration (default micro-batch x dp)", default_text=None))
    schedule: Schedule = field(default=Schedule.ONE_F_ONE_B, metadata=_knob(
        "pipeline schedule (default 1f1b; interleaved when --virtual-stages > 1)",
        default_text=None))
    virtual_stages: int = field(default=1, metadata=_knob(
        "model chunks per pipeline rank for the interleaved schedule"))
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

    def __post_init__(self) -> None:
        if not isinstance(self.sharding, Sharding):
            object.__setattr__(self, "sharding", Sharding.parse(self.sharding))
        for name, kind in layout_types().items():
            if isinstance(kind, type) and issubclass(kind, Vocabulary):
                object.__setattr__(self, name, kind.parse(getattr(self, name), name))
            elif kind is int and getattr(self, name) < 1:
                raise SpecError(f"{name} must be at least 1 (got {getattr(self, name)})", name)
            elif kind is int and getattr(self, name) > MAX_COUNT:
                raise SpecError(f"{name} must be at most {MAX_COUNT:,} (got {getattr(self, name)})",
                                name)
        if self.world_size > MAX_GPUS:
            raise SpecError(f"tp x pp x dp = {self.world_size:,} GPUs is above the maximum of "
                            f"{MAX_GPUS:,}", "dp")
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
        for comp in COMPONENTS:
            place: Placement = getattr(self.sharding, comp)
            if place.kind == PlacementKind.PARTIAL and (place.group < 1 or self.dp % place.group):
                raise SpecError(
                    f"sharding.{comp} partial group ({place.group}) does not divide dp ({self.dp})",
                    "sharding",
                )
        # Sharded state can not be coarser than what is built from it: parameters are updated
        # from gradients, gradients from optimizer shards (AMSP section 3).
        deg = {c: getattr(self.sharding, c).degree(self.dp) for c in COMPONENTS}
        if not deg["params"] <= deg["grads"] <= deg["optim"] or (
            deg["optim"] % deg["grads"] or deg["grads"] % deg["params"]
        ):
            raise SpecError(
                "sharding must shard optimizer states at least as finely as gradients, and "
                f"gradients at least as finely as parameters (got {self.sharding.describe()})",
                "sharding",
            )
        from frontier_llm.specs.engine_rules import check_engine

        check_engine(self)

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per step per data-parallel replica (gradient accumulation steps)."""
        return self.global_batch // (self.micro_batch * self.dp)

    @property
    def zero_stage(self) -> int | None:
        return self.sharding.zero_stage()

    def check_model(self, model: ModelSpec) -> None:
        """Raise SpecError when ``model`` can not be split this way; the message names the rule."""
        from frontier_llm.specs.pipeline_split import min_chunk_layers

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
        chunks = self.pp * self.virtual_stages
        if chunks > 1 and min_chunk_layers(model, self.pp, self.virtual_stages, self.engine) < 1:
            # Uneven splits are fine (specs/pipeline_split.py); a chunk with no layer is not.
            raise SpecError(
                f"layers ({model.layers}) split over pp x virtual_stages "
                f"({self.pp} x {self.virtual_stages} = {chunks}) chunks the way engine "
                f"{self.engine} splits them leaves a chunk without layers",
                "pp",
            )
        if self.sequence_parallel and model.seq_len % self.tp:
            raise SpecError(
                f"seq_len ({model.seq_len}) is not divisible by tp ({self.tp}) for sequence "
                "parallelism",
                "sequence_parallel",
            )
        from frontier_llm.specs.engine_rules import check_engine

        check_engine(self, model)

    def stage_layers(self, model: ModelSpec) -> tuple[int, ...]:
        """Layers of each model chunk in pipeline order, split the way this layout's engine
        splits them (``specs/pipeline_split.py``), after :meth:`check_model`."""
        from frontier_llm.specs.pipeline_split import stage_layers

        self.check_model(model)
        return stage_layers(model.layers, self.pp, self.virtual_stages, self.engine, model)

    def check_world(self, world_size: int) -> None:
        if self.world_size != world_size:
            raise SpecError(
                f"tp x pp x dp = {self.tp} x {self.pp} x {self.dp} = {self.world_size} does not "
                f"match the {world_size} GPUs/ranks available",
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


def given_options(options: Any) -> dict:
    """The layout options an object (an argparse namespace) holds, without those left None:
    every field, and ``zero``, the sharding's ZeRO shorthand."""
    names = (*layout_types(), "zero")
    return {n: getattr(options, n) for n in names if getattr(options, n, None) is not None}


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
            props[name] = {"type": "integer", "minimum": 1}
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
