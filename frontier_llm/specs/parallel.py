"""ParallelConfig: one training layout (TP x PP x DP, micro-batches, schedule, recompute, sharding).

Sharding follows AMSP (arXiv 2311.00257): parameters, gradients and optimizer states each choose
``replicate`` (Full-Replica), ``full`` (Full-Sharding over all DP ranks) or ``partial`` (sharding
over groups of ``k`` DP ranks, replicated across groups). ZeRO-0..3, FSDP, HSDP and MiCS are points
of that space; :func:`zero_preset` names the ZeRO ones.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from frontier_llm.errors import SpecError
from frontier_llm.specs.model import ModelSpec

Schedule = Literal["gpipe", "1f1b", "interleaved"]
Recompute = Literal["none", "selective", "full"]
DType = Literal["fp32", "bf16", "fp16"]
PlacementKind = Literal["replicate", "full", "partial"]

COMPONENTS = ("params", "grads", "optim")


@dataclass(frozen=True)
class Placement:
    """How one model-state component is spread over the DP ranks.

    ``group`` is the sharding degree for ``partial`` (it must divide dp); ignored otherwise.
    """

    kind: PlacementKind = "replicate"
    group: int = 1

    def degree(self, dp: int) -> int:
        """Number of DP ranks one copy of this component is sharded over."""
        if self.kind == "replicate":
            return 1
        if self.kind == "full":
            return dp
        return self.group

    def __str__(self) -> str:
        return f"partial:{self.group}" if self.kind == "partial" else self.kind

    @classmethod
    def parse(cls, text: str | dict | Placement) -> Placement:
        if isinstance(text, Placement):
            return text
        if isinstance(text, dict):
            return cls(kind=text.get("kind", "replicate"), group=int(text.get("group", 1)))
        kind, _, group = str(text).partition(":")
        if kind not in ("replicate", "full", "partial"):
            raise SpecError(
                f"a placement is replicate, full or partial:K (got {text!r})", "sharding"
            )
        if kind == "partial":
            if not group.isdigit() or int(group) < 1:
                raise SpecError(
                    f"partial sharding needs a group size, e.g. partial:8 (got {text!r})",
                    "sharding",
                )
            return cls(kind="partial", group=int(group))
        return cls(kind=kind)


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
        stage = self.zero_stage()
        if stage is not None:
            return f"zero{stage}"
        return f"p={self.params},g={self.grads},o={self.optim}"

    @classmethod
    def parse(cls, value: dict | str | int | Sharding) -> Sharding:
        """Accept a ZeRO stage (``2``, ``"zero2"``) or a mapping of component -> placement."""
        if isinstance(value, Sharding):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return zero_preset(value)
        if isinstance(value, str):
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


def zero_preset(stage: int) -> Sharding:
    """ZeRO stage 0-3 (Rajbhandari et al. 2020) as an AMSP placement."""
    full, rep = Placement("full"), Placement("replicate")
    presets = {
        0: Sharding(rep, rep, rep),
        1: Sharding(rep, rep, full),
        2: Sharding(rep, full, full),
        3: Sharding(full, full, full),
    }
    if stage not in presets:
        raise SpecError(f"zero stage must be 0, 1, 2 or 3 (got {stage})", "zero")
    return presets[stage]


@dataclass(frozen=True)
class ParallelConfig:
    """A layout. ``global_batch`` is in sequences; ``micro_batch`` is per pipeline micro-step."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    micro_batch: int = 1
    global_batch: int = 1
    schedule: Schedule = "1f1b"
    virtual_stages: int = 1
    sequence_parallel: bool = False
    recompute: Recompute = "none"
    flash_attention: bool = True
    dtype: DType = "bf16"
    sharding: Sharding = field(default_factory=Sharding)

    def __post_init__(self) -> None:
        if isinstance(self.sharding, dict | str | int):
            object.__setattr__(self, "sharding", Sharding.parse(self.sharding))
        for name in ("tp", "pp", "dp", "micro_batch", "global_batch", "virtual_stages"):
            if getattr(self, name) < 1:
                raise SpecError(f"{name} must be at least 1 (got {getattr(self, name)})", name)
        per_step = self.micro_batch * self.dp
        if self.global_batch % per_step:
            raise SpecError(
                f"global_batch ({self.global_batch}) is not divisible by micro_batch x dp "
                f"({self.micro_batch} x {self.dp} = {per_step})",
                "global_batch",
            )
        if self.virtual_stages > 1 and self.schedule != "interleaved":
            raise SpecError(
                f"virtual_stages ({self.virtual_stages}) > 1 needs schedule 'interleaved' "
                f"(got '{self.schedule}')",
                "virtual_stages",
            )
        if self.schedule == "interleaved":
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
            if place.kind == "partial" and (place.group < 1 or self.dp % place.group):
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
        if model.layers % chunks:
            raise SpecError(
                f"layers ({model.layers}) is not divisible by pp x virtual_stages "
                f"({self.pp} x {self.virtual_stages} = {chunks})",
                "pp",
            )
        if self.sequence_parallel and model.seq_len % self.tp:
            raise SpecError(
                f"seq_len ({model.seq_len}) is not divisible by tp ({self.tp}) for sequence "
                "parallelism",
                "sequence_parallel",
            )

    def check_world(self, world_size: int) -> None:
        if self.world_size != world_size:
            raise SpecError(
                f"tp x pp x dp = {self.tp} x {self.pp} x {self.dp} = {self.world_size} does not "
                f"match the {world_size} GPUs/ranks available",
                "dp",
            )

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["sharding"] = {c: str(getattr(self.sharding, c)) for c in COMPONENTS}
        d["zero_stage"] = self.zero_stage
        return d

    @classmethod
    def from_dict(cls, data: dict) -> ParallelConfig:
        from frontier_llm.specs.build import build

        data = data.copy()  # a LineMap's copy keeps its line numbers
        data.pop("zero_stage", None)
        zero = data.pop("zero", None)
        if zero is not None and "sharding" not in data:
            data["sharding"] = zero
        return build(cls, data, nested={"sharding": Sharding.parse})
