"""Per-layout tables (pure): throughput and memory of each layout, measured beside predicted;
throughput along one knob (TP, PP or micro-batch) with the others held; memory breakdowns."""

from __future__ import annotations

import numpy as np
import pandas as pd

from frontier_llm.costmodel import MEMORY_PARTS
from frontier_llm.errors import UserError
from frontier_llm.report.frames import COMPLETED, MISSING, PREDICTED_ONLY, add_seq_len
from frontier_llm.specs.forms import key_columns, row_label

GB = 1e9


def distinct_labels(frame: pd.DataFrame) -> list[str]:
    """Each row's layout label (:func:`frontier_llm.specs.forms.row_label`: two layouts never
    share one)."""
    return [row_label(row) for _, row in frame.iterrows()]


def _status_text(statuses: pd.Series) -> str:
    return ", ".join(f"{n} {s}" for s, n in statuses.value_counts().items())


def layouts_table(runs: pd.DataFrame, require_measured: bool = True) -> pd.DataFrame:
    """One row per layout: runs and their status, median (and spread) of the measured per-GPU
    throughput, measured peak memory (the largest over repeats), and the predictions, with the
    signed errors of the prediction in percent. Fastest measured layout first, then the ones
    without a measurement."""
    if runs.empty:
        raise UserError("no runs to report")
    df = add_seq_len(runs)
    if require_measured and not (df["status"] == COMPLETED).any():
        raise UserError(f"no completed run to report ({_status_text(df['status'])})")
    df["tokens_per_step"] = df["global_batch"].astype(float) * df["seq_len"].astype(float)
    ok = df["status"] == COMPLETED
    df["_px"] = df["tokens_per_step"] / (df["predicted_step_time_s"].astype(float).where(
        df["predicted_step_time_s"].astype(float) > 0)
                                         * df["world_size"])
    keys = key_columns(df)
    rows = []
    for _, g in df.groupby(keys, sort=False, dropna=False):
        first = g.iloc[0]
        t = g.loc[g["status"] == COMPLETED, "step_time_s"].astype(float).dropna()
        per_step, n = float(first["tokens_per_step"]), int(first["world_size"])
        mem = pd.to_numeric(g.loc[g["status"] == COMPLETED, "peak_memory_bytes"],
                            errors="coerce").dropna()
        not_run = g["status"].isin([MISSING, PREDICTED_ONLY])
        row = {k: first[k] for k in keys}
        row.update({
            "layout": row_label(first), "gpus": int(first["world_size"]),
            "runs": int((~not_run).sum()), "completed": int(ok[g.index].sum()),
            "status": _status_text(g["status"]),
            # From the median step time, as in the scaling table.
            "tokens_per_s_per_gpu": per_step / (t.median() * n) if len(t) else np.nan,
            "tokens_per_s_per_gpu_min": per_step / (t.max() * n) if len(t) else np.nan,
            "tokens_per_s_per_gpu_max": per_step / (t.min() * n) if len(t) else np.nan,
            "predicted_tokens_per_s_per_gpu": g["_px"].median(),
            "peak_memory_gb": mem.max() / GB if len(mem) else np.nan,
            "predicted_peak_memory_gb": pd.to_numeric(
                g["predicted_peak_memory_bytes"], errors="coerce").median() / GB,
        })
        if "predicted_fits" in g:
            row["predicted_fits"] = first["predicted_fits"]
        rows.append(row)
    out = pd.DataFrame(rows)
    out["throughput_error_pct"] = (out["predicted_tokens_per_s_per_gpu"]
                                   / out["tokens_per_s_per_gpu"] - 1) * 100
    out["memory_error_pct"] = (out["predicted_peak_memory_gb"] / out["peak_memory_gb"] - 1) * 100
    order = out["tokens_per_s_per_gpu"].fillna(-1).to_numpy()
    pred = out["predicted_tokens_per_s_per_gpu"].fillna(-1).to_numpy()
    out = out.iloc[np.lexsort((-pred, -order))].reset_index(drop=True)
    return out


LAYOUT_SUMMARY = ("layout", "gpus", "global_batch", "status", "tokens_per_s_per_gpu",
                  "predicted_tokens_per_s_per_gpu", "throughput_error_pct", "peak_memory_gb",
                  "predicted_peak_memory_gb", "memory_error_pct")


def layouts_summary(table: pd.DataFrame) -> pd.DataFrame:
    return table[[c for c in LAYOUT_SUMMARY if c in table]]


KNOBS = ("tp", "pp", "micro_batch")


def knob_table(layouts: pd.DataFrame, knob: str, around: pd.Series | None = None
               ) -> pd.DataFrame:
    """Throughput along ``knob`` with every other knob held at ``around``'s values (default: the
    fastest layout, measured if any was measured, else predicted). The data-parallel degree
    follows TP and PP (the GPU count is fixed). Rows: ``value`` and the layout's figures."""
    if knob not in KNOBS:
        raise UserError(f"knob must be one of {', '.join(KNOBS)}")
    if layouts.empty:
        raise UserError("no layouts")
    if around is None:
        measured = layouts.dropna(subset=["tokens_per_s_per_gpu"])
        pool = measured if len(measured) else layouts.dropna(
            subset=["predicted_tokens_per_s_per_gpu"])
        if "predicted_fits" in pool and not len(measured):
            fitting = pool[pool["predicted_fits"].astype(bool)]
            pool = fitting if len(fitting) else pool
        col = "tokens_per_s_per_gpu" if len(measured) else "predicted_tokens_per_s_per_gpu"
        around = pool.loc[pool[col].idxmax()]
    held = [k for k in KNOBS if k != knob]
    mask = np.ones(len(layouts), bool)
    for k in held:
        mask &= layouts[k].to_numpy() == around[k]
    out = layouts[mask].sort_values(knob).copy()
    out.insert(0, "value", out[knob])
    out.insert(0, "knob", knob)
    out["held"] = ", ".join(f"{k}={around[k]}" for k in held)
    return out.reset_index(drop=True)


def memory_breakdown(frame: pd.DataFrame) -> pd.DataFrame:
    """Predicted per-rank memory by part (GB) for each row of a frame that carries the cost
    model's ``mem_<part>_bytes`` columns (:func:`frontier_llm.report.frames.layout_rows`), with
    the measured peak where a run measured one."""
    missing = [p for p in MEMORY_PARTS if f"mem_{p}_bytes" not in frame]
    if missing:
        raise UserError("no memory breakdown in this frame (it needs the cost model's "
                        f"mem_*_bytes columns; missing {', '.join(missing)})")
    out = pd.DataFrame({"layout": distinct_labels(frame)}, index=frame.index)
    for part in MEMORY_PARTS:
        out[f"{part}_gb"] = frame[f"mem_{part}_bytes"].astype(float) / GB
    out["predicted_peak_gb"] = frame["predicted_peak_memory_bytes"].astype(float) / GB
    for part in MEASURED_PARTS:
        if f"measured_{part}_gb" in frame:
            out[f"measured_{part}_gb"] = frame[f"measured_{part}_gb"].astype(float)
    if "peak_memory_gb" in frame:
        out["measured_peak_gb"] = frame["peak_memory_gb"].astype(float)
    elif "peak_memory_bytes" in frame:
        out["measured_peak_gb"] = pd.to_numeric(frame["peak_memory_bytes"],
                                                errors="coerce") / GB
    if "device_memory_bytes" in frame:
        out["device_memory_gb"] = frame["device_memory_bytes"].astype(float) / GB
    return out.reset_index(drop=True)


# The parts a rank measures (flm_rank_memory) and the cost model's part each one is drawn beside.
MEASURED_PARTS = {"params": "params_bytes", "grads": "grads_bytes",
                  "optimizer": "optimizer_bytes", "activations": "activations_peak_bytes"}


def measured_memory_parts(runs: pd.DataFrame, rank_memory: pd.DataFrame) -> pd.DataFrame:
    """Per layout (the layout columns of ``runs``), the measured memory by part of the rank that
    holds the most (``measured_<part>_gb``), from the completed runs' per-rank records
    (:func:`frontier_llm.store.queries.rank_memory_frame`); the largest over repeats."""
    done = runs[runs["status"] == COMPLETED]
    if rank_memory.empty or done.empty:
        return pd.DataFrame()
    rm = rank_memory.copy()
    cols = list(MEASURED_PARTS.values())
    rm["_total"] = rm[cols].astype("float64").fillna(0).sum(axis=1)
    top = rm.sort_values("_total").groupby("run_id").tail(1)  # the fullest rank of each run
    keys = key_columns(done)
    merged = done[["run_id", *keys]].merge(top, on="run_id")
    if merged.empty:
        return pd.DataFrame()
    merged = merged.sort_values("_total").groupby(keys, as_index=False).tail(1)
    out = merged[keys].copy()
    for part, col in MEASURED_PARTS.items():
        out[f"measured_{part}_gb"] = merged[col].astype("float64") / GB
    return out.reset_index(drop=True)
