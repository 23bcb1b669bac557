"""Sharding: how parameters, gradients and optimizer states are spread over the data-parallel
ranks, after AMSP (arXiv 2311.00257). Each component chooses ``replicate`` (Full-Replica),
``full`` (Full-Sharding over all DP ranks) or ``partial`` (sharding over groups of ``k`` DP
ranks, replicated across groups). ZeRO-0..3, FSDP, HSDP and MiCS are points of that space;
:func:`zero_preset` names the ZeRO ones. Its one text form is :meth:`Sharding.describe`
(``zero2`` or ``p=replicate,g=full,o=partial:8``), read back by :meth:`Sharding.parse`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

from frontier_llm.errors import SpecError
from frontier_llm.specs.vocab import PlacementKind

COMPONENTS = ("params", "grads", "optim")
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
