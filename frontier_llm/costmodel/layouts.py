"""A table of layouts as numpy columns: the one input shape every cost-model function takes.

The planner builds one table holding every candidate layout; :func:`from_configs` builds the same
table from ``ParallelConfig`` objects, so the scalar entry point (``predict``) runs exactly the
code the planner runs, on a table of one row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np

from frontier_llm.errors import SpecError
from frontier_llm.specs.parallel import COMPONENTS, ParallelConfig, Placement, Sharding
from frontier_llm.specs.system import SystemSpec

SCHEDULES = ("gpipe", "1f1b", "interleaved")
RECOMPUTES = ("none", "selective", "full")
DTYPES = ("fp32", "bf16", "fp16")
# Placement kinds as codes: the degree is what the formulas need, the kind is what users read.
PLACEMENTS = ("replicate", "full", "partial")


@dataclass
class LayoutTable:
    """Columns of equal length; integer codes index SCHEDULES, RECOMPUTES, DTYPES, PLACEMENTS."""

    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    micro_batch: np.ndarray
    global_batch: np.ndarray
    schedule: np.ndarray
    virtual_stages: np.ndarray
    sequence_parallel: np.ndarray  # bool
    recompute: np.ndarray
    flash_attention: np.ndarray  # bool
    dtype: np.ndarray
    params_kind: np.ndarray
    params_group: np.ndarray
    grads_kind: np.ndarray
    grads_group: np.ndarray
    optim_kind: np.ndarray
    optim_group: np.ndarray

    def __len__(self) -> int:
        return len(self.tp)

    @property
    def num_microbatches(self) -> np.ndarray:
        return self.global_batch // (self.micro_batch * self.dp)

    @property
    def world_size(self) -> np.ndarray:
        return self.tp * self.pp * self.dp

    def degree(self, component: str) -> np.ndarray:
        """Sharding degree of one model-state component (AMSP placement -> ranks per copy)."""
        kind = getattr(self, f"{component}_kind")
        group = getattr(self, f"{component}_group")
        return np.where(kind == 0, 1, np.where(kind == 1, self.dp, group))

    def take(self, index: np.ndarray) -> LayoutTable:
        return LayoutTable(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    def config(self, i: int) -> ParallelConfig:
        """Row ``i`` as a validated ParallelConfig."""

        def place(comp: str) -> Placement:
            kind = PLACEMENTS[int(getattr(self, f"{comp}_kind")[i])]
            return Placement(kind, int(getattr(self, f"{comp}_group")[i]) if kind == "partial"
                             else 1)

        return ParallelConfig(
            tp=int(self.tp[i]), pp=int(self.pp[i]), dp=int(self.dp[i]),
            micro_batch=int(self.micro_batch[i]), global_batch=int(self.global_batch[i]),
            schedule=SCHEDULES[int(self.schedule[i])],
            virtual_stages=int(self.virtual_stages[i]),
            sequence_parallel=bool(self.sequence_parallel[i]),
            recompute=RECOMPUTES[int(self.recompute[i])],
            flash_attention=bool(self.flash_attention[i]),
            dtype=DTYPES[int(self.dtype[i])],
            sharding=Sharding(**{c: place(c) for c in COMPONENTS}),
        )


def dtype_peaks(system: SystemSpec) -> np.ndarray:
    """Peak FLOP/s per DTYPES code (NaN where the system has no peak for that dtype)."""
    out = []
    for name in DTYPES:
        try:
            out.append(system.peak(name))
        except SpecError:
            out.append(np.nan)
    return np.array(out)


def from_configs(configs: Sequence[ParallelConfig]) -> LayoutTable:
    def col(get, dtype=np.int64) -> np.ndarray:
        return np.array([get(c) for c in configs], dtype=dtype)

    cols = {
        "tp": col(lambda c: c.tp), "pp": col(lambda c: c.pp), "dp": col(lambda c: c.dp),
        "micro_batch": col(lambda c: c.micro_batch),
        "global_batch": col(lambda c: c.global_batch),
        "schedule": col(lambda c: SCHEDULES.index(c.schedule)),
        "virtual_stages": col(lambda c: c.virtual_stages),
        "sequence_parallel": col(lambda c: c.sequence_parallel, bool),
        "recompute": col(lambda c: RECOMPUTES.index(c.recompute)),
        "flash_attention": col(lambda c: c.flash_attention, bool),
        "dtype": col(lambda c: DTYPES.index(c.dtype)),
    }
    for comp in COMPONENTS:
        cols[f"{comp}_kind"] = col(lambda c, comp=comp: PLACEMENTS.index(
            getattr(c.sharding, comp).kind))
        cols[f"{comp}_group"] = col(lambda c, comp=comp: getattr(c.sharding, comp).group)
    return LayoutTable(**cols)
