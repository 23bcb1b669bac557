"""How far the cost model is from measurements, per system and engine (pure)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from frontier_llm.errors import UserError

ERROR_COLUMNS = ("system", "engine", "runs", "step_time_mape_pct", "step_time_bias_pct",
                 "step_time_max_ape_pct", "memory_runs", "memory_mape_pct", "memory_max_ape_pct")


def errors_table(validation: pd.DataFrame) -> pd.DataFrame:
    """Per (system, engine) and over all: runs compared, mean absolute percentage error (MAPE),
    the mean signed error (bias: positive = predicted too slow) and the largest absolute error,
    for step time and for peak memory. ``validation`` is
    :func:`frontier_llm.store.queries.validation_frame`'s output."""
    if validation.empty:
        raise UserError("no completed run with a prediction to compare")
    v = validation.copy()
    if "engine" not in v:
        v["engine"] = "?"
    groups = [((s, e), g) for (s, e), g in v.groupby(["system", "engine"], sort=True)]
    if len(groups) != 1:
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
            "memory_runs": len(mem),
            "memory_mape_pct": mem.abs().mean() if len(mem) else np.nan,
            "memory_max_ape_pct": mem.abs().max() if len(mem) else np.nan,
        })
    return pd.DataFrame(rows, columns=list(ERROR_COLUMNS))
