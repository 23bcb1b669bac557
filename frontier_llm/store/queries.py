"""Read the store as pandas DataFrames: runs with their layouts and predictions, and the cost
model's error against measurements (the calibration loop)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from sqlalchemy import and_, func, literal, select

from frontier_llm.specs.axes import RANK_FIELDS
from frontier_llm.specs.forms import key_columns
from frontier_llm.specs.layout import Layout, layout_types
from frontier_llm.specs.vocab import RunStatus
from frontier_llm.store import Store
from frontier_llm.store.schema import (
    LAYOUT_COLUMNS,
    flm_layouts,
    flm_predictions,
    flm_rank_memory,
    flm_runs,
    flm_steps,
)

_LAYOUT_COLUMNS = ("model_name", "system_name", *LAYOUT_COLUMNS, "layout_hash")
_RUN_COLUMNS = ("run_id", "sweep_name", "job_key", "status", "error", "engine", "world_size",
                "steps_measured", "step_time_s", "tokens_per_s", "model_tflops_per_gpu",
                "hardware_tflops_per_gpu", "mfu", "hfu", "peak_memory_bytes", "started_at",
                "finished_at", "trace_path")
_PREDICTED_COLUMNS = ("costmodel_version", "step_time_s", "model_tflops_per_gpu", "mfu",
                      "peak_memory_bytes", "fits")


def runs_frame(store: Store, sweep: str | None = None,
               costmodel_version: str | None = None) -> pd.DataFrame:
    """One row per run: its measurements, its layout's columns and the prediction for it.

    The prediction joined is the one the run's trace carried (same cost-model version), or the
    one of ``costmodel_version`` for every run when given. Predicted columns are prefixed
    ``predicted_``; ``model``/``system`` name the model and system.
    """
    r, lay, p = flm_runs, flm_layouts, flm_predictions
    version = r.c.costmodel_version if costmodel_version is None else literal(costmodel_version)
    cols = [r.c[c] for c in _RUN_COLUMNS]
    cols += [lay.c.model_name.label("model"), lay.c.system_name.label("system")]
    # The layout's engine is the run's (the trace's engine field is its layout's): one column.
    cols += [lay.c[c] for c in _LAYOUT_COLUMNS if c not in ("model_name", "system_name",
                                                            "engine")]
    cols += [p.c[c].label(f"predicted_{c}") for c in _PREDICTED_COLUMNS]
    stmt = (
        select(*cols)
        .select_from(r.join(lay, r.c.layout_id == lay.c.id).outerjoin(
            p, and_(p.c.layout_id == r.c.layout_id, p.c.costmodel_version == version)))
        .order_by(r.c.sweep_name.asc().nulls_last(), r.c.run_id)  # same order on both
    )
    if sweep is not None:
        stmt = stmt.where(r.c.sweep_name == sweep)
    with store.read() as conn:
        result = conn.execute(stmt)
        # Plain tuples: a Row has a "dtype" attribute here (the layout column) that pandas
        # would mistake for the row's NumPy dtype.
        df = pd.DataFrame([tuple(row) for row in result], columns=list(result.keys()))
    for c in ("started_at", "finished_at"):
        # SQLite hands back naive UTC, PostgreSQL aware times: one form for both.
        df[c] = pd.to_datetime(df[c], utc=True)
    for c in ("step_time_s", "tokens_per_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu",
              "mfu", "hfu", "predicted_step_time_s", "predicted_model_tflops_per_gpu",
              "predicted_mfu"):
        df[c] = pd.to_numeric(df[c], errors="coerce").astype(float)
    for c in ("peak_memory_bytes", "predicted_peak_memory_bytes"):
        df[c] = pd.to_numeric(df[c], errors="coerce").astype("Int64")
    return df


def stored_layout(store: Store, layout_hash: str) -> Layout:
    """The Layout a ``flm_layouts`` row holds (KeyError when no row has ``layout_hash``)."""
    lay = flm_layouts
    with store.read() as conn:
        row = conn.execute(select(*[lay.c[n] for n in layout_types()])
                           .where(lay.c.layout_hash == layout_hash)).mappings().first()
    if row is None:
        raise KeyError(layout_hash)
    return Layout.from_dict(dict(row))


def sweep_names(store: Store) -> list[str]:
    with store.read() as conn:
        return [s for s in conn.execute(
            select(flm_runs.c.sweep_name).distinct().order_by(flm_runs.c.sweep_name)).scalars()
            if s is not None]


def _ape(predicted: pd.Series, measured: pd.Series) -> pd.Series:
    """Signed percentage error of the prediction; NaN where either side is missing or zero."""
    m = measured.astype(float)
    out = (predicted.astype(float) - m) / m.where(m != 0) * 100.0
    return out.replace([np.inf, -np.inf], np.nan)


def final_losses(store: Store, sweep: str | None = None) -> pd.DataFrame:
    """``run_id`` and ``final_loss``: the loss of each run's last step (NaN when it logged
    none), the figure that shows two engines trained alike from the same seed."""
    r, st = flm_runs, flm_steps
    last = (select(st.c.run, func.max(st.c.step).label("step")).group_by(st.c.run)
            .subquery())
    stmt = (select(r.c.run_id, st.c.loss.label("final_loss"))
            .select_from(r.join(last, last.c.run == r.c.id).join(
                st, and_(st.c.run == last.c.run, st.c.step == last.c.step))))
    if sweep is not None:
        stmt = stmt.where(r.c.sweep_name == sweep)
    with store.read() as conn:
        df = pd.DataFrame([tuple(row) for row in conn.execute(stmt)],
                          columns=["run_id", "final_loss"])
    df["final_loss"] = pd.to_numeric(df["final_loss"], errors="coerce").astype(float)
    return df


def step_ranges(store: Store, sweep: str | None = None) -> pd.DataFrame:
    """``run_id``, ``steps_min_s``, ``steps_max_s``: the fastest and slowest measured (not
    warm-up) step of each run, the spread a single run already shows (report/scaling.py marks
    an efficiency whose spread exceeds its distance from ideal). Runs without steps: absent."""
    r, st = flm_runs, flm_steps
    stmt = (select(r.c.run_id, func.min(st.c.time_s).label("steps_min_s"),
                   func.max(st.c.time_s).label("steps_max_s"))
            .select_from(r.join(st, st.c.run == r.c.id))
            .where(st.c.warmup.is_(False)).group_by(r.c.run_id))
    if sweep is not None:
        stmt = stmt.where(r.c.sweep_name == sweep)
    with store.read() as conn:
        return pd.DataFrame([tuple(row) for row in conn.execute(stmt)],
                            columns=["run_id", "steps_min_s", "steps_max_s"])


def validated_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The completed runs of ``runs_frame`` that have a prediction, every column kept, with
    the signed errors ``step_time_error_pct`` and ``memory_error_pct`` added:
    ``(predicted - measured) / measured * 100``, positive when the model predicted too slow /
    too much memory."""
    df = runs[(runs["status"] == RunStatus.COMPLETED) & runs["predicted_costmodel_version"].notna()]
    return df.assign(
        step_time_error_pct=_ape(df["predicted_step_time_s"], df["step_time_s"]),
        memory_error_pct=_ape(df["predicted_peak_memory_bytes"], df["peak_memory_bytes"]))


def validation_frame(store: Store, sweep: str | None = None,
                     costmodel_version: str | None = None) -> pd.DataFrame:
    """Predicted against measured, one row per completed run that has a prediction
    (signed errors as :func:`validated_runs` computes them)."""
    df = validated_runs(runs_frame(store, sweep, costmodel_version))
    out = pd.DataFrame({
        "run_id": df["run_id"], **{c: df[c] for c in key_columns(df)},
        "world_size": df["world_size"], "costmodel_version": df["predicted_costmodel_version"],
        "measured_step_time_s": df["step_time_s"],
        "predicted_step_time_s": df["predicted_step_time_s"],
        "step_time_error_pct": df["step_time_error_pct"],
        "measured_peak_memory_bytes": df["peak_memory_bytes"],
        "predicted_peak_memory_bytes": df["predicted_peak_memory_bytes"],
        "memory_error_pct": df["memory_error_pct"],
        "measured_mfu": df["mfu"], "predicted_mfu": df["predicted_mfu"],
    })
    return out.reset_index(drop=True)


def error_stats(validation: pd.DataFrame) -> pd.DataFrame:
    """Per system (and over all, system ``(all)``): runs compared, mean absolute percentage
    error (MAPE) and the largest absolute percentage error, for step time and peak memory."""
    rows = []
    groups = [(name, g) for name, g in validation.groupby("system", sort=True)]
    if len(groups) != 1:
        groups.append(("(all)", validation))
    for name, g in groups:
        st = g["step_time_error_pct"].astype(float).abs().dropna()
        mem = g["memory_error_pct"].astype(float).abs().dropna()
        rows.append({
            "system": name, "runs": len(g),
            "step_time_mape_pct": st.mean() if len(st) else np.nan,
            "step_time_max_ape_pct": st.max() if len(st) else np.nan,
            "memory_runs": len(mem),
            "memory_mape_pct": mem.mean() if len(mem) else np.nan,
            "memory_max_ape_pct": mem.max() if len(mem) else np.nan,
        })
    cols = ["system", "runs", "step_time_mape_pct", "step_time_max_ape_pct", "memory_runs",
            "memory_mape_pct", "memory_max_ape_pct"]
    return pd.DataFrame(rows, columns=cols)


_RANK_MEMORY_COLUMNS = ("rank", *RANK_FIELDS, "params_bytes", "grads_bytes",
                        "optimizer_bytes", "activations_peak_bytes",
                        "device_allocated_peak_bytes")


def rank_memory_frame(store: Store, sweep: str | None = None) -> pd.DataFrame:
    """One row per (run, rank): the memory each rank measured, by part (bytes)."""
    m = flm_rank_memory
    stmt = (select(flm_runs.c.run_id, *(m.c[c] for c in _RANK_MEMORY_COLUMNS))
            .select_from(m.join(flm_runs, m.c.run == flm_runs.c.id))
            .order_by(flm_runs.c.run_id, m.c.rank))
    if sweep is not None:
        stmt = stmt.where(flm_runs.c.sweep_name == sweep)
    with store.read() as conn:
        result = conn.execute(stmt)
        df = pd.DataFrame([tuple(r) for r in result], columns=list(result.keys()))
    for c in _RANK_MEMORY_COLUMNS[4:]:
        df[c] = pd.to_numeric(df[c], errors="coerce").astype("Int64")
    return df
