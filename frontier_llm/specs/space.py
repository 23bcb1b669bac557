"""The searchable layout space, one description for every place that lists one: the planner's
``SearchSpace``, a sweep's ``space:``, a study's ``space:`` and the ``flm plan`` restrict flags
are all made from it (docs/layout.md).

- The knobs: every :class:`Layout` field but those a run fixes (:data:`NOT_SEARCHED`).
- One check of a value list per knob type (:func:`check_values`).
- One set of defaults. A knob a space leaves *open* takes its open list: for a vocabulary all
  its words, for a boolean both values, unless the field's metadata names a ``search`` list
  (the engine: native only, so engines are compared only when asked; flash attention: on); for
  a number or the sharding the planner works the list out from the model and GPU count
  (:func:`frontier_llm.planner.space.enumerate_layouts`). A knob a *grid* space (a sweep's or a
  study's, not ``auto``) does not list stays at the field's default, but for :data:`ALWAYS_OPEN`,
  which have no sensible single default (:func:`grid_values`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from frontier_llm.errors import SpecError
from frontier_llm.specs.forms import field_defaults
from frontier_llm.specs.layout import (
    Sharding,
    Vocabulary,
    int_minimum,
    layout_fields,
    layout_types,
)

# Layout fields a space does not list: dp follows from tp, pp and the GPU count; the global
# batch and the precision are the run's (layouts are compared at one batch and one precision).
# The end stages' given layers (first_stage_layers, last_stage_layers) are a run's statement of
# its split, not a search dimension: the planner takes each engine's own split.
NOT_SEARCHED = ("dp", "global_batch", "dtype", "first_stage_layers", "last_stage_layers")
# Knobs a grid space leaves to the planner when it does not list them (metadata grid_open):
# the degrees (every one that divides the GPU count) and the interleaving depth (every one that
# divides a stage's layers), which only make sense against the model and the GPU count.
ALWAYS_OPEN = tuple(f.name for f in layout_fields() if f.metadata.get("grid_open"))


def space_knobs() -> dict[str, type]:
    """The knobs a space may list, name -> type, in field order."""
    return {n: t for n, t in layout_types().items() if n not in NOT_SEARCHED}


def open_values(name: str) -> tuple | None:
    """The values an open knob takes (words for a vocabulary), or None where the planner works
    them out from the model and GPU count (numbers, the sharding)."""
    kind = space_knobs()[name]
    meta = next(f.metadata for f in layout_fields() if f.name == name)
    if "search" in meta:
        return tuple(meta["search"])
    if isinstance(kind, type) and issubclass(kind, Vocabulary):
        return kind.words()
    if kind is bool:
        return (False, True)
    return None


def default_value(name: str) -> Any:
    """The field's default as a space lists it (a word, a number, a sharding's text)."""
    value = field_defaults()[name]
    if isinstance(value, Sharding):
        return value.describe()
    return value.value if isinstance(value, Vocabulary) else value


def grid_values(listed: Mapping[str, Sequence | None], auto: bool = False
                ) -> dict[str, tuple | None]:
    """Each knob's values for the planner: a listed knob its list; an unlisted one None (open:
    the planner's list) in an ``auto`` space or for :data:`ALWAYS_OPEN`, else its default
    alone."""
    out: dict[str, tuple | None] = {}
    for name in space_knobs():
        given = listed.get(name)
        if given is not None:
            out[name] = tuple(given)
        elif auto or name in ALWAYS_OPEN:
            out[name] = None
        else:
            out[name] = (default_value(name),)
    return out


def check_list(value: Any, name: str, kind: type | tuple[type, ...]) -> None:
    """Refuse a value list that is not a non-empty list of ``kind`` without repeats."""
    if value is None:
        return
    if (not isinstance(value, list | tuple) or not value
            or not all(isinstance(v, kind) and (kind is bool or not isinstance(v, bool))
                       for v in value)):
        what = {int: "whole numbers", str: "strings", bool: "true/false"}.get(
            kind if isinstance(kind, type) else None, "numbers")
        raise SpecError(f"{name} must be a non-empty list of {what}", name)
    if len(set(map(str, value))) != len(value):
        raise SpecError(f"{name} lists a value twice", name)


def check_values(name: str, values: Any) -> None:
    """Refuse (SpecError naming the knob) a value list that is not one for knob ``name``; None
    (not listed) passes. ``zero`` is the sharding's ZeRO shorthand (stages 0-3)."""
    if name == "zero":
        check_list(values, name, int)
        for z in values or ():
            if z not in (0, 1, 2, 3):
                raise SpecError(f"zero stage {z} is not 0, 1, 2 or 3", "zero")
        return
    kind = space_knobs()[name]
    if kind is int:
        check_list(values, name, int)
        least = int_minimum(name)  # 1, or 0 for etp (0: the same as tp)
        if any(v < least for v in values or ()):
            raise SpecError(f"{name} values must be at least {least}", name)
    elif kind is bool:
        check_list(values, name, bool)
    elif isinstance(kind, type) and issubclass(kind, Vocabulary):
        check_list(values, name, str)
        for v in values or ():
            kind.parse(v, name)
    else:  # Sharding: its text form (zero2, p=replicate,g=full,o=partial:8)
        check_list(values, name, str)
        for v in values or ():
            Sharding.parse(v)


def check_space(values: Mapping[str, Any]) -> None:
    """:func:`check_values` of every knob (and ``zero``) of a space, and the one rule between
    them: ``zero`` and ``sharding`` are two ways to say one thing."""
    for name in (*space_knobs(), "zero"):
        check_values(name, values.get(name))
    if values.get("zero") and values.get("sharding"):
        raise SpecError("give zero or sharding, not both", "sharding")


def space_fields() -> list[tuple[str, Any, Any]]:
    """``dataclasses.make_dataclass`` fields for a space: one optional value list per knob, and
    ``zero``."""
    from dataclasses import field

    return [(n, list | tuple | None, field(default=None)) for n in (*space_knobs(), "zero")]
