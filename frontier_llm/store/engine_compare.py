"""Training engines side by side: the runs of one layout on each engine in one row.

A layout here is everything that fixes the work but the engine: model, system, world size and
every layout field except ``engine`` (the global batch is one of them). Several runs of one
layout on one engine (repeats, several sweeps) are summarised by their median. Each engine
gets its own columns, ``<engine>_<measure>``; the ratios are ``<measure>_<engine>_over_native``.
A layout measured on one engine only has blanks (NaN) in the other's columns, never an error.
Pure functions of the frames :mod:`frontier_llm.store.queries` returns.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from frontier_llm.specs.forms import ALWAYS_SHOWN, shown_columns
from frontier_llm.specs.layout import Engine
from frontier_llm.specs.vocab import RunStatus
from frontier_llm.store.schema import LAYOUT_COLUMNS

BASELINE = Engine.NATIVE.value
# Always shown, so that csv and json keep their columns when a store holds one engine only;
# any other engine (megatron, from traces written elsewhere) joins when it has runs.
SHOWN_ENGINES = (Engine.NATIVE.value, Engine.DEEPSPEED.value)
LAYOUT_KEY = ("model", "system", "world_size", *(c for c in LAYOUT_COLUMNS if c != "engine"))
# (measure, run column, how runs of one layout and engine are summarised)
RESULT_MEASURES = (("step_time_s", "step_time_s", "median"),
                   ("tokens_per_s_per_gpu", "tokens_per_s_per_gpu", "median"),
                   ("peak_memory_bytes", "peak_memory_bytes", "median"),
                   ("final_loss", "final_loss", "median"))
RATIOS = (("step_time", "step_time_s"), ("tokens_per_s_per_gpu", "tokens_per_s_per_gpu"),
          ("peak_memory", "peak_memory_bytes"))
# Signed errors average over the runs of a layout; the prediction is one per layout.
VALIDATION_MEASURES = (("measured_step_time_s", "step_time_s", "median"),
                       ("predicted_step_time_s", "predicted_step_time_s", "median"),
                       ("step_time_error_pct", "step_time_error_pct", "mean"),
                       ("memory_error_pct", "memory_error_pct", "mean"))


def engines_of(runs: pd.DataFrame) -> list[str]:
    """The engines to show: native and deepspeed, then any other with runs, in the order of
    the Engine vocabulary."""
    present = set(runs["engine"].dropna().astype(str)) if "engine" in runs else set()
    return [e.value for e in Engine if e.value in SHOWN_ENGINES or e.value in present]


_NO_STAGE = -1


def _pivot(runs: pd.DataFrame, measures: tuple, engines: list[str]) -> pd.DataFrame:
    key = list(LAYOUT_KEY)
    runs = runs.copy()
    # A non-ZeRO sharding has no stage (NULL): a key value like any other here, not a gap.
    runs["zero_stage"] = runs["zero_stage"].astype("Int64").fillna(_NO_STAGE)
    # One row per layout that has a run; each engine joins its summary (or blanks).
    out = runs[key].drop_duplicates().reset_index(drop=True)
    for engine in engines:
        mine = runs[runs["engine"] == engine]
        agg = mine.groupby(key, dropna=False).agg(
            **{f"{engine}_runs": ("run_id", "count")},
            **{f"{engine}_{name}": (column, how) for name, column, how in measures})
        out = out.merge(agg.reset_index(), on=key, how="left")
        out[f"{engine}_runs"] = out[f"{engine}_runs"].fillna(0).astype(int)
    out["zero_stage"] = out["zero_stage"].astype("Int64").replace(_NO_STAGE, pd.NA)
    return out.sort_values(key, ignore_index=True)


def _ratio(num: pd.Series, den: pd.Series) -> pd.Series:
    n, d = num.astype(float), den.astype(float)
    return (n / d.where(d != 0)).replace([np.inf, -np.inf], np.nan)


def compare_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per layout from ``runs_frame`` (completed runs only, ``final_loss`` optional):
    per engine the runs, median step time, tokens/s per GPU, peak memory and final loss; then
    each other engine's step time, tokens/s per GPU and peak memory over native's."""
    runs = runs[runs["status"] == RunStatus.COMPLETED].copy()
    runs["tokens_per_s_per_gpu"] = (runs["tokens_per_s"].astype(float)
                                    / runs["world_size"].astype(float))
    runs["peak_memory_bytes"] = runs["peak_memory_bytes"].astype(float)
    if "final_loss" not in runs:
        runs["final_loss"] = np.nan
    engines = engines_of(runs)
    out = _pivot(runs, RESULT_MEASURES, engines)
    for engine in engines:
        memory = f"{engine}_peak_memory_bytes"
        out[memory] = out[memory].round().astype("Int64")
    for engine in engines:
        if engine == BASELINE:
            continue
        for name, column in RATIOS:
            out[f"{name}_{engine}_over_{BASELINE}"] = _ratio(out[f"{engine}_{column}"],
                                                             out[f"{BASELINE}_{column}"])
    return out


def compare_validation(validated: pd.DataFrame) -> pd.DataFrame:
    """One row per layout from :func:`~frontier_llm.store.queries.validated_runs`: per engine
    the runs compared, median measured and predicted step time, and the mean signed step-time
    and memory errors (percent) of its runs."""
    return _pivot(validated, VALIDATION_MEASURES, engines_of(validated))


# Table headers: (label, factor, decimals) per measure; the table's top header row names the
# engine, the second the measure.
RESULT_LABELS = {"runs": ("runs", 1, 0), "step_time_s": ("step_s", 1, 4),
                 "tokens_per_s_per_gpu": ("tok/s/gpu", 1, 1),
                 "peak_memory_bytes": ("peak_MiB", 2**-20, 1), "final_loss": ("loss", 1, 5)}
VALIDATION_LABELS = {"runs": ("runs", 1, 0), "measured_step_time_s": ("measured_s", 1, 4),
                     "predicted_step_time_s": ("predicted_s", 1, 4),
                     "step_time_error_pct": ("step_err_%", 1, 2),
                     "memory_error_pct": ("mem_err_%", 1, 2)}
RATIO_LABELS = {"step_time": "step_time", "tokens_per_s_per_gpu": "tok/s/gpu",
                "peak_memory": "peak_mem"}


def table_view(wide: pd.DataFrame, labels: dict[str, tuple[str, float, int]]) -> pd.DataFrame:
    """What a terminal shows of :func:`compare_runs` or :func:`compare_validation` (``labels``:
    RESULT_LABELS or VALIDATION_LABELS): the main key columns (and any other key column whose
    value differs between rows), then under each engine its measures, then under
    ``<engine>/native`` the ratios; memory in MiB, figures rounded, blanks for no value."""
    shown = ["model", "system", *shown_columns(wide, always=(*ALWAYS_SHOWN, "global_batch"))]
    columns: dict[tuple[str, str], pd.Series] = {("", c): wide[c] for c in shown}
    engines = [e.value for e in Engine if f"{e.value}_runs" in wide]
    for engine in engines:
        for measure, (label, factor, decimals) in labels.items():
            values = wide[f"{engine}_{measure}"].astype(float) * factor
            columns[(engine, label)] = (values.round(decimals).astype("Int64") if decimals == 0
                                        else values.round(decimals))
    for engine in engines:
        for name, label in RATIO_LABELS.items():
            column = f"{name}_{engine}_over_{BASELINE}"
            if column in wide:
                columns[(f"{engine}/{BASELINE}", label)] = wide[column].astype(float).round(3)
    table = pd.DataFrame(columns, index=wide.index).astype(object)
    return table.where(table.notna(), "")  # an engine without a run: blank cells
