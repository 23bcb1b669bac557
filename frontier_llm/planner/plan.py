"""Plan: evaluate every candidate layout with the cost model and rank the ones that fit."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from frontier_llm.costmodel import evaluate
from frontier_llm.costmodel.layouts import DTYPES, PLACEMENTS, RECOMPUTES, SCHEDULES, LayoutTable
from frontier_llm.errors import UserError
from frontier_llm.planner.space import OOM, REASONS, SearchSpace, enumerate_layouts
from frontier_llm.specs.model import ModelSpec
from frontier_llm.specs.parallel import COMPONENTS, ParallelConfig
from frontier_llm.specs.system import SystemSpec

# Tokens per iteration the default global batch aims for: GPT-3 175B trained with 3.2M-token
# batches (Brown et al. 2020); 4M rounds that up.
DEFAULT_BATCH_TOKENS = 4 * 1024 * 1024


def default_global_batch(model: ModelSpec, gpus: int) -> int:
    """The smallest multiple of the GPU count holding at least DEFAULT_BATCH_TOKENS tokens, so
    that every data-parallel degree divides it."""
    sequences = math.ceil(DEFAULT_BATCH_TOKENS / model.seq_len)
    return gpus * math.ceil(sequences / gpus)


@dataclass
class Plan:
    """Every evaluated layout (``layouts``, ``figures``) and the rule each rejected one broke."""

    model: ModelSpec
    system: SystemSpec
    gpus: int
    global_batch: int
    layouts: LayoutTable
    figures: dict[str, np.ndarray]
    reason: np.ndarray
    _order: np.ndarray | None = field(default=None, repr=False)

    @property
    def valid(self) -> np.ndarray:
        return self.reason == 0

    def order(self) -> np.ndarray:
        """Indices of valid layouts, fastest first (ties: less memory first)."""
        if self._order is None:
            idx = np.flatnonzero(self.valid)
            keys = (self.figures["peak_memory_bytes"][idx], -self.figures["tokens_per_s"][idx])
            self._order = idx[np.lexsort(keys)]
        return self._order

    def rejections(self) -> dict[str, int]:
        counts = np.bincount(self.reason, minlength=len(REASONS))
        return {REASONS[i]: int(c) for i, c in enumerate(counts) if i and c}

    def frame(self, index: np.ndarray | None = None) -> pd.DataFrame:
        """Layouts and predictions as a DataFrame (all rows, or ``index``)."""
        t = self.layouts if index is None else self.layouts.take(index)
        f = self.figures if index is None else {k: v[index] for k, v in self.figures.items()}
        r = self.reason if index is None else self.reason[index]
        df = pd.DataFrame({
            "tp": t.tp, "pp": t.pp, "dp": t.dp, "micro_batch": t.micro_batch,
            "global_batch": t.global_batch,
            "schedule": pd.Categorical.from_codes(t.schedule, SCHEDULES),
            "virtual_stages": t.virtual_stages,
            "sequence_parallel": t.sequence_parallel,
            "recompute": pd.Categorical.from_codes(t.recompute, RECOMPUTES),
            "flash_attention": t.flash_attention,
            "dtype": pd.Categorical.from_codes(t.dtype, DTYPES),
            "sharding": _sharding_labels(t),
        })
        for k in ("step_time_s", "tokens_per_s", "model_tflops_per_gpu", "mfu", "hfu",
                  "peak_memory_bytes", "fits"):
            df[k] = f[k]
        df["reject_reason"] = pd.Categorical.from_codes(r, REASONS)
        return df

    @property
    def table(self) -> pd.DataFrame:
        return self.frame()

    def ranked(self, top: int | None = None, fits_only: bool = True) -> pd.DataFrame:
        """Valid layouts, fastest first; with ``fits_only=False`` the ones that do not fit in
        memory are ranked too (after those that do)."""
        idx = self.order()
        if not fits_only:
            oom = np.flatnonzero(self.reason == OOM)
            oom = oom[np.argsort(-self.figures["tokens_per_s"][oom], kind="stable")]
            idx = np.concatenate([idx, oom])
        if top is not None:
            idx = idx[:top]
        df = self.frame(idx)
        df.insert(0, "rank", np.arange(1, len(df) + 1))
        return df.reset_index(drop=True)

    def layout(self, i: int) -> ParallelConfig:
        return self.layouts.config(i)

    def best(self) -> ParallelConfig | None:
        order = self.order()
        return self.layout(int(order[0])) if len(order) else None


def _sharding_labels(t: LayoutTable) -> pd.Categorical:
    """'zero0'..'zero3' for the presets, else AMSP's per-component placements."""
    codes = np.stack([np.stack([getattr(t, f"{c}_kind"), getattr(t, f"{c}_group")], 1)
                      for c in COMPONENTS], 1).reshape(len(t), 2 * len(COMPONENTS))
    if not len(t):
        return pd.Categorical([])
    uniq, inverse = np.unique(codes, axis=0, return_inverse=True)
    labels = []
    for row in uniq:
        kinds = [PLACEMENTS[k] for k in row[0::2]]
        groups = row[1::2]
        preset = {("replicate",) * 3: "zero0", ("replicate", "replicate", "full"): "zero1",
                  ("replicate", "full", "full"): "zero2", ("full",) * 3: "zero3"}
        name = preset.get(tuple(kinds))
        if name is None:
            parts = [f"{c[0]}={k}:{g}" if k == "partial" else f"{c[0]}={k}"
                     for c, k, g in zip(("params", "grads", "optim"), kinds, groups, strict=True)]
            name = ",".join(parts)
        labels.append(name)
    return pd.Categorical.from_codes(inverse.ravel(), pd.Index(labels).unique()
                                     if len(set(labels)) == len(labels) else labels)


def plan(model: ModelSpec, system: SystemSpec, gpus: int, global_batch: int | None = None,
         space: SearchSpace | None = None) -> Plan:
    """Evaluate every layout of ``space`` for ``model`` on ``gpus`` GPUs of ``system``."""
    if gpus < 1:
        raise UserError(f"--gpus must be at least 1 (got {gpus})")
    gb = global_batch or default_global_batch(model, gpus)
    layouts, reason = enumerate_layouts(model, system, gpus, gb, space or SearchSpace())
    # The cost model runs on the layouts no rule rejected; the others get NaN figures.
    ok = np.flatnonzero(reason == 0)
    sub = evaluate(model, system, layouts.take(ok))
    figures = {}
    for key, values in sub.items():
        full = np.full(len(reason), False if values.dtype == bool else np.nan,
                       dtype=values.dtype if values.dtype == bool else float)
        full[ok] = values
        figures[key] = full
    reason[ok[~sub["fits"]]] = OOM
    return Plan(model, system, gpus, gb, layouts, figures, reason)


def layout_from_row(row) -> ParallelConfig:
    """A ParallelConfig from one row of :meth:`Plan.frame` / :meth:`Plan.ranked`."""
    return ParallelConfig.from_dict({
        "tp": int(row["tp"]), "pp": int(row["pp"]), "dp": int(row["dp"]),
        "micro_batch": int(row["micro_batch"]), "global_batch": int(row["global_batch"]),
        "schedule": str(row["schedule"]), "virtual_stages": int(row["virtual_stages"]),
        "sequence_parallel": bool(row["sequence_parallel"]),
        "recompute": str(row["recompute"]), "flash_attention": bool(row["flash_attention"]),
        "dtype": str(row["dtype"]), "sharding": _parse_label(str(row["sharding"])),
    })


def _parse_label(label: str):
    if label.startswith("zero"):
        return int(label[4:])
    names = {"p": "params", "g": "grads", "o": "optim"}
    return {names[k]: v for k, v in (part.split("=", 1) for part in label.split(","))}
