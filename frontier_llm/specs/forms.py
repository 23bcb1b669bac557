"""The layout's forms in tables and text, derived from the :class:`Layout` fields: the column
list and identity key of every DataFrame that holds layouts (plan, store, report, tune), the
one row codec, the one text label, and the one ``flm bench`` command line.

A consumer never spells the fields out: it groups and merges on :func:`key_columns`, writes a
layout's columns with :func:`layout_records`, reads one back with :func:`layout_from_row`, and
names it with :func:`label`. A knob added to ``Layout`` reaches all of them with no edit here.
"""

from __future__ import annotations

import dataclasses
import math
import shlex
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from frontier_llm.specs import axes
from frontier_llm.specs.layout import (
    Layout,
    Sharding,
    Vocabulary,
    layout_argv,
    layout_fields,
    layout_types,
    row_schedule,
    schedule_label,
)

# Every field, in field order: the columns that hold a layout in a frame.
LAYOUT_COLUMNS: tuple[str, ...] = tuple(layout_types())
# What names a layout in a frame: the model and system it is for and every field (engine
# included: one layout on two engines is two layouts, measured and predicted apart).
LAYOUT_KEY: tuple[str, ...] = ("model", "system", *LAYOUT_COLUMNS)
# What varies along a scaling series (the data-parallel degree, and for weak scaling the
# global batch): a series is the key without them.
SCALED = ("dp", "global_batch")
SERIES_KEY: tuple[str, ...] = tuple(k for k in LAYOUT_KEY if k not in SCALED)


def key_columns(frame: Any, key: Sequence[str] = LAYOUT_KEY) -> list[str]:
    """The columns of ``key`` that ``frame`` (a DataFrame or mapping) has, in key order: what to
    group or merge it on. A frame from before a knob existed lacks its column; the others do
    not differ in it."""
    return [k for k in key if k in frame]


def _word(value: Any) -> Any:
    if isinstance(value, Sharding):
        return value.describe()
    if isinstance(value, Vocabulary):
        return value.value
    return value


def layout_record(layout: Layout) -> dict[str, Any]:
    """One layout's columns: numbers and booleans as they are, vocabularies as their words, the
    sharding as its one text (``zero1``, ``p=replicate,g=full,o=partial:8``)."""
    return {name: _word(getattr(layout, name)) for name in LAYOUT_COLUMNS}


def layout_records(layouts: Iterable[Layout]) -> dict[str, list]:
    """The columns of several layouts (column name -> values), for a DataFrame."""
    rows = [layout_record(x) for x in layouts]
    return {name: [r[name] for r in rows] for name in LAYOUT_COLUMNS}


def layout_entry(layout: Layout) -> dict[str, Any]:
    """A sweep file's ``layouts:`` entry for ``layout``: the degrees and batches, and every
    other field that is not at its default (the sharding as its text); loading the entry gives
    ``layout`` back."""
    defaults = {k: _word(v) for k, v in field_defaults().items()}
    record = layout_record(layout)
    always = {*axes.LABELLED, *_BATCHES}
    return {k: v for k, v in record.items() if k in always or v != defaults[k]}


# The layout columns every table of layouts shows; the others where they differ between rows.
ALWAYS_SHOWN = (*(str(a) for a in axes.LABELLED), "micro_batch")


def shown_columns(frame: Any, key: Sequence[str] = LAYOUT_COLUMNS,
                  always: Iterable[str] = ALWAYS_SHOWN) -> list[str]:
    """The layout columns a table of ``frame`` shows: ``always`` and every other column of
    ``key`` whose value differs between the rows or, in some row, from the field's default (a
    table of cp 8 layouts says cp 8; a knob at its default everywhere is left out)."""
    always = set(always)
    # The global batch's default (1) is no choice a table's reader made: it shows only where
    # it varies (a plan's header states it).
    defaults = {k: str(_word(v)) for k, v in field_defaults().items() if k != "global_batch"}
    shown = []
    for c in key_columns(frame, key):
        values = frame[c].astype(str)
        if c in always or values.nunique() > 1 or (
                c in defaults and len(values) and (values != defaults[c]).any()):
            shown.append(c)
    return shown


def display_layouts(frame: Any, always: Iterable[str] = ALWAYS_SHOWN) -> Any:
    """:func:`shown_columns` of ``frame`` as a new frame, the schedule written with its
    interleaving (``interleaved:4``) in place of two columns."""
    cols = shown_columns(frame, always=always)
    out = frame[cols].copy()
    for part, whole in _WRITTEN_WITH.items():
        if part in out or whole in out:
            # Without a pipeline no schedule runs: "-", not the field's value (gpipe read as
            # a choice the layout made).
            out[whole] = [row_schedule(r) if _pipelined(r) else "-" for _, r in frame.iterrows()]
            out = out.drop(columns=[part], errors="ignore")
    return out


def _pipelined(row: Any) -> bool:
    pp = row.get("pp", 2) if hasattr(row, "get") else 2
    return _missing(pp) or int(pp) > 1


def field_defaults() -> dict[str, Any]:
    """Each field's default value, by name."""
    out = {}
    for f in layout_fields():
        value = f.default_factory() if f.default is dataclasses.MISSING else f.default
        out[f.name] = value
    return out


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or (
        type(value).__name__ in ("NAType", "NaTType"))


def _plain(value: Any) -> Any:
    value = value.item() if hasattr(value, "item") else value
    return str(value) if isinstance(value, str) else value


def layout_from_row(row: Mapping[str, Any] | Any) -> Layout:
    """The Layout of one row of any frame that carries the layout's columns (a plan, the store's
    runs, a report frame; a pandas row, a namedtuple's ``_asdict()`` or a mapping). A column the
    row lacks or leaves empty (a knob added after the row was written) takes the field's
    default; the sharding is read from its text."""
    get = row.get if hasattr(row, "get") else (lambda k, d=None: getattr(row, k, d))
    values = {}
    for name in LAYOUT_COLUMNS:
        value = get(name, None)
        if not _missing(value):
            values[name] = _plain(value)
    return Layout.from_dict(values)


def label(layout: Layout, omit: Iterable[str] = ()) -> str:
    """The one text label of a layout: the degrees and batches always (``tp8 pp4 dp2 mb1
    gb64``), every other knob only where it is not at its default, so two different layouts
    never share a label. ``omit``: fields left out (a scaling series drops ``dp`` and
    ``global_batch``, which vary along it)."""
    return _label(layout_record(layout), omit)


def row_label(row: Mapping[str, Any] | Any, omit: Iterable[str] = ()) -> str:
    """:func:`label` of a frame row's layout columns (a column the row lacks is at its
    default), read as they are: a row is labelled even where it is not a whole layout."""
    get = row.get if hasattr(row, "get") else (lambda k, d=None: getattr(row, k, d))
    values = {}
    for name, default in field_defaults().items():
        value = get(name, None)
        values[name] = _word(default) if _missing(value) else _plain(value)
    return _label(values, omit)


# Knobs written as part of another's text (interleaved:4): part -> whole.
_WRITTEN_WITH = {f.name: f.metadata["written_with"] for f in layout_fields()
                 if "written_with" in f.metadata}
# The knobs every label shows, with their short names; the others appear when not at default.
_BATCHES = {"micro_batch": "mb", "global_batch": "gb"}
# Short words in labels for knobs whose value alone would be ambiguous.
_PREFIX = {"recompute": "rc-"}
_FLAG_WORDS = {"sequence_parallel": "sp", "flash_attention": "flash"}


def _label(values: Mapping[str, Any], omit: Iterable[str]) -> str:
    omit = set(omit)
    defaults = {k: _word(v) for k, v in field_defaults().items()}
    # The degrees first (tp8 cp2 pp4 dp2: specs.axes), then the batches, then other knobs.
    parts = axes.label_parts(values, omit)
    parts += [f"{short}{values[name]}" for name, short in _BATCHES.items() if name not in omit]
    for name, kind in layout_types().items():
        if (name in omit or name in axes.AXES or name == axes.EXPERT_TP or name in _BATCHES
                or name in _WRITTEN_WITH):
            continue  # written as part of another knob's text
        value = values[name]
        if name in _WRITTEN_WITH.values():
            text = row_schedule(values)
            if text != schedule_label(defaults[name], 1):
                parts.append(text)
        elif kind is bool:
            if bool(value) != defaults[name]:
                word = _FLAG_WORDS.get(name, name.replace("_", "-"))
                parts.append(word if value else f"no-{word}")
        elif str(value) != str(defaults[name]):
            parts.append(f"{name}={value}" if kind is int else f"{_PREFIX.get(name, '')}{value}")
    return " ".join(parts)


def bench_command(layout: Layout, extra: Mapping[str, Any] | None = None) -> str:
    """The ``flm bench`` layout flags of ``layout`` as one shell-quoted line (the one argv
    writer, :func:`frontier_llm.specs.layout.layout_argv`), then ``extra`` run settings as
    ``--name value``."""
    argv = layout_argv(layout)
    for name, value in (extra or {}).items():
        argv += [f"--{name.replace('_', '-')}", str(value)]
    return shlex.join(argv)
