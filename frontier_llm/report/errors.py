"""How far the cost model is from measurements, per system and engine (pure)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from frontier_llm.errors import UserError

ERROR_COLUMNS = ("system", "engine", "runs", "step_time_mape_pct", "step_time_bias_pct",
                 "step_time_max_ape_pct", "throughput_rank_corr", "memory_runs",
                 "memory_mape_pct", "memory_max_ape_pct")


def throughput_rank_corr(g: pd.DataFrame) -> float:
    """Spearman correlation of predicted and measured throughput per GPU over the runs: does the
    model order them as they measured. Throughput per GPU is the per-GPU batch over the step
    time, so runs of different sizes compare by what each GPU delivers; NaN below 2 runs."""
    need = ("global_batch", "world_size", "measured_step_time_s", "predicted_step_time_s")
    if len(g) < 2 or any(c not in g for c in need):
        return np.nan
    per_gpu = g["global_batch"].astype(float) / g["world_size"].astype(float)
    measured = per_gpu / pd.to_numeric(g["measured_step_time_s"], errors="coerce")
    predicted = per_gpu / pd.to_numeric(g["predicted_step_time_s"], errors="coerce")
    return float(measured.rank().corr(predicted.rank()))


def errors_table(validation: pd.DataFrame, overall: bool = True) -> pd.DataFrame:
    """Per (system, engine) and over all: runs compared, mean absolute percentage error (MAPE),
    the mean signed error (bias: positive = predicted too slow) and the largest absolute error,
    for step time and for peak memory, and the rank correlation of predicted and measured
    throughput. ``validation`` is :func:`frontier_llm.store.queries.validation_frame`'s output.
    ``overall=False`` leaves out the row over all groups: for one set of runs predicted by
    several systems (flm quickstart's), where pooling the systems means nothing."""
    if validation.empty:
        raise UserError("no completed run with a prediction to compare")
    v = validation.copy()
    if "engine" not in v:
        v["engine"] = "?"
    groups = [((s, e), g) for (s, e), g in v.groupby(["system", "engine"], sort=True)]
    if len(groups) != 1 and overall:
        groups.append((("(all)", "(all)"), v))
    rows = []
    for (system, engine), g in groups:
        st = g["step_time_error_pct"].astype(float).dropna()
        mem = g["memory_error_pct"].astype(float).dropna()
        rows.append({
            "system": system, "engine": engine, "runs": len(g),
            "step_time_mape_pct": st.abs().mean() if len(st) else np.nan,
            "step_time_bias_pct": st.mean() if len(st) else np.nan,
            "step_time_max_ape_pct": st.abs().max() if len(st) else np.nan,
            "throughput_rank_corr": throughput_rank_corr(g),
            "memory_runs": len(mem),
            "memory_mape_pct": mem.abs().mean() if len(mem) else np.nan,
            "memory_max_ape_pct": mem.abs().max() if len(mem) else np.nan,
        })
    return pd.DataFrame(rows, columns=list(ERROR_COLUMNS))
