"""A table of layouts as numpy columns: the one input shape every cost-model function takes.

The columns are derived from the :class:`~frontier_llm.specs.layout.Layout` fields: an int or
bool field is one column, a vocabulary field one column of codes (``Schedule.GPIPE.code``...), the
sharding six (``params_kind``, ``params_group``, ... for each component). The planner builds one
table holding every candidate layout; :func:`from_configs` builds the same table from ``Layout``
objects, so the scalar entry point (``predict``) runs exactly the code the planner runs, on a
table of one row.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

import numpy as np

from frontier_llm.errors import SpecError
from frontier_llm.specs import axes
from frontier_llm.specs.layout import (
    COMPONENTS,
    DType,
    Layout,
    Placement,
    PlacementKind,
    Sharding,
    Vocabulary,
    layout_fields,
    layout_types,
)
from frontier_llm.specs.system import SystemSpec


def _columns() -> dict[str, type]:
    """Column name -> numpy dtype, in field order."""
    out: dict[str, type] = {}
    for name, kind in layout_types().items():
        if kind is Sharding:
            for comp in COMPONENTS:
                out[f"{comp}_kind"] = np.int64
                out[f"{comp}_group"] = np.int64
        else:
            out[name] = bool if kind is bool else np.int64
    return out


COLUMNS = _columns()


class LayoutTable:
    """Columns of equal length, one attribute each (``t.tp``, ``t.schedule`` codes,
    ``t.params_kind``...): :data:`COLUMNS`, derived from the Layout fields."""

    def __init__(self, **columns: np.ndarray) -> None:
        if columns.keys() != COLUMNS.keys():
            missing = sorted(COLUMNS.keys() - columns.keys())
            unknown = sorted(columns.keys() - COLUMNS.keys())
            raise TypeError(f"LayoutTable columns: missing {missing}, unknown {unknown}")
        self.__dict__.update(columns)

    def columns(self) -> dict[str, np.ndarray]:
        return {name: self.__dict__[name] for name in COLUMNS}

    def __len__(self) -> int:
        return len(self.tp)

    @property
    def num_microbatches(self) -> np.ndarray:
        return self.global_batch // (self.micro_batch * self.dp)

    @property
    def world_size(self) -> np.ndarray:
        return axes.world_size(self)

    @property
    def shard_ranks(self) -> np.ndarray:
        """Ranks holding the same parameters: dp x cp (``Layout.shard_ranks``). The cp ranks of
        a replica see other tokens of the same sequences, so their gradients are reduced and
        their model states sharded with the data-parallel ranks (torchtitan's ``dp_shard_cp``
        mesh, Megatron's data-parallel-with-context group)."""
        return axes.shard_ranks(self)

    def local_seq(self, seq_len: int) -> np.ndarray:
        """Tokens of each sequence on one rank: ``seq_len / cp``, exact (``Layout.check_model``
        asks ``seq_len`` divisible by 2·cp for the load-balanced causal split)."""
        return seq_len // self.cp

    def degree(self, component: str) -> np.ndarray:
        """Sharding degree of one model-state component (AMSP placement -> ranks per copy);
        ``full`` shards over the dp x cp ranks (``Sharding.degree(layout.shard_ranks)``)."""
        kind = getattr(self, f"{component}_kind")
        group = getattr(self, f"{component}_group")
        return np.where(kind == PlacementKind.REPLICATE.code, 1,
                        np.where(kind == PlacementKind.FULL.code, self.shard_ranks, group))

    def take(self, index: np.ndarray) -> LayoutTable:
        return LayoutTable(**{k: v[index] for k, v in self.columns().items()})

    def sharding(self, i: int) -> Sharding:
        def place(comp: str) -> Placement:
            kind = PlacementKind.from_code(getattr(self, f"{comp}_kind")[i])
            group = int(getattr(self, f"{comp}_group")[i])
            return Placement(kind, group if kind == PlacementKind.PARTIAL else 1)

        return Sharding(**{c: place(c) for c in COMPONENTS})

    def config(self, i: int) -> Layout:
        """Row ``i`` as a validated Layout."""
        values = {}
        for name, kind in layout_types().items():
            if kind is Sharding:
                values[name] = self.sharding(i)
            elif issubclass(kind, Vocabulary):
                values[name] = kind.from_code(getattr(self, name)[i])
            else:
                values[name] = kind(getattr(self, name)[i])
        return Layout(**values)


def dtype_peaks(system: SystemSpec) -> np.ndarray:
    """Peak FLOP/s per DType code (NaN where the system has no peak for that dtype)."""
    out = []
    for name in DType.words():
        try:
            out.append(system.peak(name))
        except SpecError:
            out.append(np.nan)
    return np.array(out)


def encode(name: str, value) -> dict[str, object]:
    """One field's value as its column value(s)."""
    if isinstance(value, Sharding):
        out: dict[str, object] = {}
        for comp in COMPONENTS:
            place = getattr(value, comp)
            out[f"{comp}_kind"] = place.kind.code
            out[f"{comp}_group"] = place.group
        return out
    return {name: value.code if isinstance(value, Vocabulary) else value}


@cache
def default_row() -> dict[str, object]:
    """Every column's value for the Layout's defaults."""
    default = Layout()
    return {col: value for f in layout_fields()
            for col, value in encode(f.name, getattr(default, f.name)).items()}


def fill_defaults(cols: dict[str, np.ndarray], n: int) -> dict[str, np.ndarray]:
    """``cols`` completed with the default of every column it lacks (the planner sets the knobs
    it enumerates; a new field is thereby planned at its default until the space names it)."""
    for col, value in default_row().items():
        if col not in cols:
            # One value seen n times (read-only, no n-long copy): the planner's tables are
            # millions of rows and most fields keep their default.
            cols[col] = np.broadcast_to(np.array(value, dtype=COLUMNS[col]), (n,))
    return cols


def from_configs(configs: Sequence[Layout]) -> LayoutTable:
    rows = [{k: v for f in layout_fields() for k, v in encode(f.name, getattr(c, f.name)).items()}
            for c in configs]
    return LayoutTable(**{col: np.array([r[col] for r in rows], dtype=dtype)
                          for col, dtype in COLUMNS.items()})
