"""Error bars from the cost model's measured error on runs it did not see.

Method (docs/planner.md, "Planning an allocation"):

- The residuals are ``log(predicted / measured step time)`` of the published runs in
  ``../shared/data/calibration_runs.csv``, out of sample, written by
  ``analysis/loo_residuals.py`` to ``planner/data/calibration_residuals.csv``: ``loo`` (the row's
  system refitted without it) and ``transfer`` (the row predicted with another system's fitted
  knobs).
- A system's **class** says which apply: ``fitted`` (its knobs were fitted to its own rows: the
  systems with two or more rows), ``transferred`` (its knobs were carried over from another
  system or anchored on one figure: Frontier, LUMI-G, every system without rows), or
  ``calibrated`` (a system file with ``prediction_error``, written by ``flm calibrate
  --from-runs``: its own cross-validated residuals, whatever the engine).
- Within the class, the residuals of the layout's **engine family**. The half-width at
  confidence ``c`` is the split-conformal quantile of the absolute residuals: the
  ``ceil((n + 1)·c)``-th smallest of ``n`` (Vovk et al. 2005; Lei et al. 2018), which covers a
  new run with probability at least ``c`` when runs are exchangeable. With too few rows for that
  (an engine family with fewer than ``c / (1 - c)`` rows), the class's rows of every engine are
  pooled and the half-width is the larger of their quantile and the family's largest error.
- The interval is symmetric in log space: ``step_time · exp(±q)``; throughput the reciprocal.
- Peak memory: the same, from the rows that state a measured peak memory (one row today, so
  the width is that row's error: not an 80 % claim, said in ``memory_interval_basis``).
  The verdict: ``fits`` (the high end fits the device), ``exceeds`` (the low end does not),
  ``tight`` (the interval straddles the capacity).

Assumptions: residuals of future runs are like those of the published ones (same engines,
similar scales); the transfer residuals, measured between NVIDIA systems, stand in for carrying
knobs to an AMD system, which they likely understate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from frontier_llm.errors import UserError
from frontier_llm.specs.system import SystemSpec

RESIDUALS = Path(__file__).with_name("data") / "calibration_residuals.csv"
DEFAULT_CONFIDENCE = 0.8
INTERVAL_FIGURES = ("step_time_s", "tokens_per_s", "peak_memory_bytes")


@lru_cache(maxsize=4)
def load_residuals(path: str | Path = RESIDUALS) -> pd.DataFrame:
    """The out-of-sample residuals of the calibration rows (analysis/loo_residuals.py)."""
    try:
        return pd.read_csv(path)
    except FileNotFoundError:
        raise UserError(
            f"{path}: no such file (python analysis/loo_residuals.py writes it)"
        ) from None


def conformal_quantile(abs_residuals: np.ndarray, confidence: float) -> float:
    """The ``ceil((n + 1)·c)``-th smallest of ``n`` absolute residuals; inf when n is too small
    for that (fewer than c / (1 - c) residuals)."""
    r = np.sort(np.abs(np.asarray(abs_residuals, dtype=float)))
    n = len(r)
    k = math.ceil((n + 1) * confidence - 1e-9)
    return float(r[k - 1]) if 1 <= k <= n else math.inf


def half_width(group: np.ndarray, pool: np.ndarray, confidence: float) -> float:
    """The group's conformal quantile, or, when the group is too small for it, the larger of
    the pool's quantile and the group's largest absolute residual."""
    q = conformal_quantile(group, confidence)
    if math.isfinite(q):
        return q
    worst = float(np.max(np.abs(group))) if len(group) else 0.0
    return max(conformal_quantile(pool, confidence), worst)


def fitted_systems(residuals: pd.DataFrame) -> list[str]:
    """The systems with two or more calibration rows: their knobs were fitted to their own."""
    counts = residuals["system"].value_counts()
    return sorted(counts[counts >= 2].index)


def system_class(system: SystemSpec, residuals: pd.DataFrame | None = None) -> str:
    """``calibrated``, ``fitted`` or ``transferred`` (module docstring)."""
    if system.prediction_error is not None:
        return "calibrated"
    res = load_residuals() if residuals is None else residuals
    return "fitted" if system.name in fitted_systems(res) else "transferred"


@dataclass(frozen=True)
class Width:
    """A log-space half-width and what it was measured on."""

    q: float
    basis: str


def step_width(
    system: SystemSpec,
    engine: str,
    confidence: float = DEFAULT_CONFIDENCE,
    residuals: pd.DataFrame | None = None,
) -> Width:
    """The step-time half-width (log space) for ``engine`` on ``system``."""
    check_confidence(confidence)
    cls = system_class(system, residuals)
    if cls == "calibrated":
        r = np.asarray(system.prediction_error.log_residuals)
        q = conformal_quantile(r, confidence)
        if not math.isfinite(q):
            q = float(np.max(np.abs(r)))
        return Width(
            q,
            f"calibrated: {len(r)} held-out runs "
            f"({system.prediction_error.method or 'flm calibrate --from-runs'})",
        )
    res = load_residuals() if residuals is None else residuals
    if cls == "fitted":
        pool = res[res["system"].isin(fitted_systems(res))]
        col = "loo_log_residual"
    else:
        pool, col = res, "transfer_log_residual"
    group = pool[pool["engine"] == engine][col].to_numpy(float)
    q = half_width(group, pool[col].to_numpy(float), confidence)
    small = math.isinf(conformal_quantile(group, confidence))
    how = "leave-one-out" if cls == "fitted" else "knobs carried from another system"
    basis = f"{cls}: {len(group)} {engine} row(s), {how}" + (
        f"; too few for {confidence:.0%}, pooled with the class's {len(pool)} rows" if small else ""
    )
    return Width(q, basis)


def memory_width(
    confidence: float = DEFAULT_CONFIDENCE, residuals: pd.DataFrame | None = None
) -> Width:
    """The peak-memory half-width (log space) from the rows that state a measured peak."""
    check_confidence(confidence)
    res = load_residuals() if residuals is None else residuals
    r = res["memory_log_residual"].dropna().to_numpy(float)
    if not len(r):
        return Width(0.0, "no calibration row states a measured peak memory")
    q = conformal_quantile(r, confidence)
    if math.isfinite(q):
        return Width(q, f"{len(r)} rows with a measured peak memory")
    return Width(
        float(np.max(np.abs(r))),
        f"{len(r)} row(s) with a measured peak memory, too "
        f"few for {confidence:.0%}: the width is their largest error",
    )


def check_confidence(confidence: float) -> None:
    if not 0 < confidence < 1:
        raise UserError(f"the confidence must be between 0 and 1, exclusive (got {confidence})")


def memory_verdict(low, high, capacity: float) -> np.ndarray:
    """``fits`` / ``tight`` / ``exceeds`` from a memory interval and the device's capacity."""
    low, high = np.asarray(low, float), np.asarray(high, float)
    return np.where(high <= capacity, "fits", np.where(low > capacity, "exceeds", "tight"))


def add_intervals(
    frame: pd.DataFrame,
    system: SystemSpec,
    confidence: float = DEFAULT_CONFIDENCE,
    residuals: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """``frame`` (plan rows with ``engine``, ``step_time_s``, ``tokens_per_s``,
    ``peak_memory_bytes``) with ``interval_confidence``, ``<figure>_low``/``_high`` for each of
    :data:`INTERVAL_FIGURES`, ``memory_verdict`` and the bases of the widths. A new frame."""
    out = frame.copy()
    # Rows without an engine (a curve's GPU count where nothing fits) get no interval.
    engines = (
        out["engine"].astype(object).where(out["engine"].notna(), "").astype(str).to_numpy()
        if "engine" in out
        else np.full(len(out), "native")
    )
    q = np.full(len(out), np.nan)
    basis = np.full(len(out), "", dtype=object)
    for engine in np.unique(engines[engines != ""]):
        w = step_width(system, str(engine), confidence, residuals)
        q[engines == engine] = w.q
        basis[engines == engine] = w.basis
    mem = memory_width(confidence, residuals)
    out["interval_confidence"] = confidence
    step = out["step_time_s"].to_numpy(float)
    out["step_time_s_low"], out["step_time_s_high"] = step * np.exp(-q), step * np.exp(q)
    tps = out["tokens_per_s"].to_numpy(float)
    out["tokens_per_s_low"], out["tokens_per_s_high"] = tps * np.exp(-q), tps * np.exp(q)
    peak = out["peak_memory_bytes"].to_numpy(float)
    out["peak_memory_bytes_low"] = peak * np.exp(-mem.q)
    out["peak_memory_bytes_high"] = peak * np.exp(mem.q)
    out["memory_verdict"] = np.where(
        np.isnan(peak),
        "",
        memory_verdict(
            out["peak_memory_bytes_low"], out["peak_memory_bytes_high"], system.memory_bytes
        ),
    )
    out["interval_basis"] = basis
    out["memory_interval_basis"] = mem.basis
    return out


def loo_coverage(
    confidence: float = DEFAULT_CONFIDENCE, residuals: pd.DataFrame | None = None
) -> pd.DataFrame:
    """Each calibration row's own interval, built without it: the row is held out of the
    residuals, its system's class and engine give the half-width from the others (the rules of
    :func:`step_width`), and the row is covered when its own out-of-sample residual lies inside.
    One row per calibration row: ``system``, ``engine``, ``residual``, ``half_width``,
    ``covered``."""
    res = load_residuals() if residuals is None else residuals
    rows = []
    for i in range(len(res)):
        held = res.iloc[i]
        others = res.drop(res.index[i])
        fitted = held["system"] in fitted_systems(res)
        col = "loo_log_residual" if fitted else "transfer_log_residual"
        pool = others[others["system"].isin(fitted_systems(res))] if fitted else others
        group = pool[pool["engine"] == held["engine"]][col].to_numpy(float)
        q = half_width(group, pool[col].to_numpy(float), confidence)
        r = float(held[col])
        rows.append(
            {
                "row": int(held["row"]),
                "model": held["model"],
                "system": held["system"],
                "engine": held["engine"],
                "residual": r,
                "half_width": q,
                "covered": abs(r) <= q,
            }
        )
    return pd.DataFrame(rows)
