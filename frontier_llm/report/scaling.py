"""Weak- and strong-scaling efficiency from a frame of runs (pure: DataFrame in, DataFrame out).

A *series* is one model-parallel recipe (model, system, TP, PP, micro-batch, schedule, recompute,
sharding, ...) run at several GPU counts; only the data-parallel degree and, for weak scaling,
the global batch change along it. For every point:

* per-GPU throughput  X(N) = global_batch x seq_len / (T_N x N)   (tokens/s per GPU)
* efficiency          E(N) = X(N) / X(N_base)

With the global batch growing with N (weak scaling, fixed work per GPU) that is the per-GPU
throughput at N over the smallest run's; with a fixed global batch (strong scaling) it reduces
to T_base x N_base / (T_N x N). One formula serves both; the mode only decides what the figure
draws beside the efficiency (per-GPU throughput for weak, step time for strong) and the ideal.

Repeated runs of a point give the median step time and the spread (fastest and slowest run);
failed runs and points with no run stay in the table with their status instead of vanishing.

A point's *spread* is the larger of the half-range of its repeats' step times and the median
half-range of the measured steps inside each run (the trace's step times, which a single run
already has), relative to its median step time. The efficiency's spread adds the point's and
the base point's: E x (s_N + s_base). A point whose efficiency spread reaches its distance from
ideal, |E - 100|, is marked (``efficiency_within_noise``): 177 % from one noisy run is not a
super-linear result.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from frontier_llm.errors import UserError
from frontier_llm.report.frames import COMPLETED, MISSING, PREDICTED_ONLY, add_seq_len
from frontier_llm.specs.forms import SCALED, SERIES_KEY, key_columns, row_label

SOURCES = ("measured", "predicted", "both")
MODES = ("auto", "weak", "strong")


def series_label(row) -> str:
    """A series' name: the model and its layout label without what varies along it."""
    return f"{row['model']} {row_label(row, omit=SCALED)}"


def detect_mode(points: pd.DataFrame) -> str:
    """'strong' when the global batch is the same at every GPU count of the series, 'weak' when
    it grows in proportion to the GPU count; anything else is refused (say which with --mode)."""
    by_n = points.groupby("world_size")["global_batch"].first().sort_index()
    if by_n.nunique() == 1:
        return "strong"
    per_gpu = by_n / by_n.index.to_numpy()
    if np.allclose(per_gpu, per_gpu.iloc[0]):
        return "weak"
    raise UserError("cannot tell weak from strong scaling: the global batch neither stays "
                    "fixed nor grows with the GPU count; pass --mode weak or --mode strong")


def _status_text(statuses: pd.Series) -> str:
    counts = statuses.value_counts()
    return ", ".join(f"{n} {s}" for s, n in counts.items())


def _half_range(t: pd.Series, lo: pd.Series | None, hi: pd.Series | None) -> float:
    """A point's relative spread (module docstring): the larger of its repeats' half-range and
    the median half-range of the steps inside its runs, over the median step time; NaN when
    neither is known (one run without step times)."""
    parts = []
    if len(t) >= 2:
        parts.append((t.max() - t.min()) / (2 * t.median()))
    if lo is not None and hi is not None:
        inside = ((hi.astype(float) - lo.astype(float)) / (2 * t)).dropna()
        if len(inside):
            parts.append(float(inside.median()))
    return float(max(parts)) if parts else np.nan


def _efficiency(x: pd.Series, base_x: float) -> pd.Series:
    return x / base_x * 100.0 if base_x and np.isfinite(base_x) else x * np.nan


def scaling_table(runs: pd.DataFrame, source: str = "measured", mode: str = "auto") -> pd.DataFrame:
    """One row per (series, GPU count): status counts, median and spread of the measured step
    time, per-GPU throughput and efficiency (measured, predicted or both), sorted by series and
    GPU count. Refuses (UserError) what holds no scaling: no usable point, or a single one."""
    if source not in SOURCES:
        raise UserError(f"source must be one of {', '.join(SOURCES)} (got {source!r})")
    if mode not in MODES:
        raise UserError(f"mode must be one of {', '.join(MODES)} (got {mode!r})")
    if runs.empty:
        raise UserError("no runs to report")
    df = add_seq_len(runs)
    want_measured = source in ("measured", "both")
    want_predicted = source in ("predicted", "both")
    if want_measured and not (df["status"] == COMPLETED).any():
        states = _status_text(df["status"])
        raise UserError(f"no completed run to report ({states}); nothing measured to scale")
    if want_predicted and df["predicted_step_time_s"].notna().sum() == 0:
        raise UserError("no prediction for these runs (their traces carried none): report the "
                        "measurements alone (without --predicted)")
    df["tokens_per_step"] = df["global_batch"].astype(float) * df["seq_len"].astype(float)
    df["_x_predicted"] = df["tokens_per_step"] / (
        df["predicted_step_time_s"].astype(float).where(
        df["predicted_step_time_s"].astype(float) > 0) * df["world_size"])

    tables = []
    keys = key_columns(df, SERIES_KEY)
    for _, series in df.groupby(keys, sort=True, dropna=False):
        tables.append(_series_table(series, keys, want_measured, want_predicted, mode))
    table = pd.concat(tables, ignore_index=True)
    usable = "measured_efficiency_pct" if want_measured else "predicted_efficiency_pct"
    counts = table.dropna(subset=[usable]).groupby("series")["gpus"].nunique()
    if counts.empty or counts.max() < 2:
        raise UserError("a single point per series: no scaling to compute (the sweep needs "
                        f"{'completed runs' if want_measured else 'points'} at two or more "
                        "GPU counts)")
    return table


def _series_table(series: pd.DataFrame, keys: list[str], want_measured: bool,
                  want_predicted: bool, mode: str) -> pd.DataFrame:
    first = series.iloc[0]
    series_mode = detect_mode(series) if mode == "auto" else mode
    rows = []
    for n, point in series.groupby("world_size", sort=True):
        done = point[point["status"] == COMPLETED]
        t = done["step_time_s"].astype(float)
        per_step = float(point["tokens_per_step"].iloc[0])
        not_run = point["status"].isin([MISSING, PREDICTED_ONLY])
        row = {k: first[k] for k in keys}
        row.update({
            "series": series_label(first), "mode": series_mode, "gpus": int(n),
            "dp": int(point["dp"].iloc[0]), "global_batch": int(point["global_batch"].iloc[0]),
            "runs": int((~not_run).sum()), "completed": len(done),
            "not_completed": int((~not_run).sum()) - len(done),
            "status": _status_text(point["status"]),
            "step_time_s": t.median() if len(t) else np.nan,
            "step_time_min_s": t.min() if len(t) else np.nan,
            "step_time_max_s": t.max() if len(t) else np.nan,
            "step_time_spread_pct": 100 * _half_range(
                t, done.get("steps_min_s"), done.get("steps_max_s")) if len(t) else np.nan,
            # From the median step time (not the median of throughputs, which with two
            # repeats is their mean): the table's step time and efficiency then agree.
            "tokens_per_s_per_gpu": per_step / (t.median() * n) if len(t) else np.nan,
            "tokens_per_s_per_gpu_min": per_step / (t.max() * n) if len(t) else np.nan,
            "tokens_per_s_per_gpu_max": per_step / (t.min() * n) if len(t) else np.nan,
            "predicted_step_time_s": point["predicted_step_time_s"].astype(float).median(),
            "predicted_tokens_per_s_per_gpu": point["_x_predicted"].median(),
        })
        rows.append(row)
    out = pd.DataFrame(rows)
    if want_measured:
        measured = out.dropna(subset=["tokens_per_s_per_gpu"])
        base = measured.iloc[0] if len(measured) else None
        out["base_gpus"] = base["gpus"] if base is not None else np.nan
        bx = base["tokens_per_s_per_gpu"] if base is not None else np.nan
        out["measured_efficiency_pct"] = _efficiency(out["tokens_per_s_per_gpu"], bx)
        out["measured_efficiency_min_pct"] = _efficiency(out["tokens_per_s_per_gpu_min"], bx)
        out["measured_efficiency_max_pct"] = _efficiency(out["tokens_per_s_per_gpu_max"], bx)
        _mark_noise(out, base)
    if want_predicted:
        pred = out.dropna(subset=["predicted_tokens_per_s_per_gpu"])
        # Same base as the measured side where there is one, so the two curves compare.
        if want_measured and len(pred) and np.isfinite(out["base_gpus"].iloc[0]):
            px = pred.loc[pred["gpus"] == out["base_gpus"].iloc[0],
                          "predicted_tokens_per_s_per_gpu"]
            bx = px.iloc[0] if len(px) else np.nan
        else:
            bx = pred["predicted_tokens_per_s_per_gpu"].iloc[0] if len(pred) else np.nan
            if not want_measured:
                out["base_gpus"] = pred["gpus"].iloc[0] if len(pred) else np.nan
        out["predicted_efficiency_pct"] = _efficiency(out["predicted_tokens_per_s_per_gpu"], bx)
    else:
        out = out.drop(columns=["predicted_step_time_s", "predicted_tokens_per_s_per_gpu"])
    if not want_measured:
        out = out.drop(columns=[c for c in out.columns if c.startswith(
            ("step_time_", "tokens_per_s_per_gpu")) or c == "step_time_s"])
    if out["gpus"].nunique() < 2:
        # One GPU count: nothing to compare it with, so no efficiency (not a vacuous 100 %).
        for c in [c for c in out.columns if "efficiency" in c]:
            out[c] = np.nan
    out["points"] = out["gpus"].nunique()
    return out


def _mark_noise(out: pd.DataFrame, base: pd.Series | None) -> None:
    """``measured_efficiency_spread_pct``, ``efficiency_within_noise`` and the reader's
    ``efficiency_mark`` (module docstring), in place."""
    base_s = base["step_time_spread_pct"] if base is not None else np.nan
    eff = out["measured_efficiency_pct"]
    spread = eff * (out["step_time_spread_pct"] + base_s) / 100
    out["measured_efficiency_spread_pct"] = spread
    effect = (eff - 100).abs()
    is_base = out["gpus"] == (base["gpus"] if base is not None else np.nan)
    noisy = (~is_base) & spread.notna() & (spread >= effect)
    out["efficiency_within_noise"] = noisy
    out["efficiency_mark"] = [
        f"spread ±{s:.0f} ≥ effect {e - 100:+.0f}: not a result" if n else ""
        for s, e, n in zip(spread, eff, noisy, strict=True)]


# The columns a reader wants in the Markdown table, in order (those present are kept).
SUMMARY_COLUMNS = ("series", "mode", "gpus", "global_batch", "status", "step_time_s",
                   "step_time_min_s", "step_time_max_s", "step_time_spread_pct",
                   "tokens_per_s_per_gpu", "measured_efficiency_pct",
                   "measured_efficiency_spread_pct", "efficiency_mark", "predicted_step_time_s",
                   "predicted_tokens_per_s_per_gpu", "predicted_efficiency_pct")


def summary(table: pd.DataFrame) -> pd.DataFrame:
    return table[[c for c in SUMMARY_COLUMNS if c in table]]
