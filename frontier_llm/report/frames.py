"""The report's input frames: measured runs from the store, and the points a sweep file expects
with the cost model's predictions for them, in one shape (the columns of
:func:`frontier_llm.store.queries.runs_frame`).

Every frame has one row per run (or per expected point that has no run: status ``missing``),
the layout's columns, ``world_size``, ``seq_len``, the measured ``step_time_s`` and
``tokens_per_s`` and the predicted ``predicted_step_time_s`` and ``predicted_peak_memory_bytes``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from frontier_llm.costmodel import COSTMODEL_VERSION, MEMORY_PARTS, evaluate, from_configs
from frontier_llm.errors import UserError
from frontier_llm.specs import axes
from frontier_llm.specs.forms import LAYOUT_KEY, layout_records
from frontier_llm.specs.layout import Layout
from frontier_llm.specs.model import ModelSpec
from frontier_llm.specs.system import SystemSpec
from frontier_llm.specs.vocab import RunStatus

COMPLETED = RunStatus.COMPLETED.value
MISSING = "missing"  # a point the sweep names that has no run in the database
PREDICTED_ONLY = "predicted"  # a point drawn from the cost model alone (no database given)



def layout_rows(model: ModelSpec, system: SystemSpec, layouts: Sequence[Layout]
                ) -> pd.DataFrame:
    """The cost model's figures for ``layouts`` (one row each, each with its own engine), with
    the memory breakdown (``mem_<part>_bytes``) and the layout's columns. Pure: no database, no
    files."""
    layouts = list(layouts)
    if not layouts:
        return pd.DataFrame(columns=[*LAYOUT_KEY, "world_size", "seq_len"])
    fig = evaluate(model, system, from_configs(layouts))
    df = pd.DataFrame({
        "model": model.name, "system": system.name,
        **layout_records(layouts),
        "world_size": [c.world_size for c in layouts],
        "seq_len": model.seq_len,
        "predicted_costmodel_version": COSTMODEL_VERSION,
        "predicted_step_time_s": fig["step_time_s"],
        "predicted_tokens_per_s": fig["tokens_per_s"],
        "predicted_mfu": fig["mfu"],
        "predicted_peak_memory_bytes": fig["peak_memory_bytes"],
        "predicted_fits": fig["fits"],
        "device_memory_bytes": float(system.memory_bytes),
    })
    for part in MEMORY_PARTS:
        df[f"mem_{part}_bytes"] = fig[f"mem_{part}_bytes"]
    return df


def sweep_frame(sweep) -> pd.DataFrame:
    """The points a sweep (:func:`frontier_llm.jobs.sweepspec.load_sweep`) expands to, each with
    the cost model's prediction; status ``predicted`` (nothing measured yet)."""
    parts = []
    by_model: dict[str, list] = {}
    for job in sweep.jobs:
        by_model.setdefault(job.model.name, []).append(job)
    for jobs in by_model.values():
        df = layout_rows(jobs[0].model, sweep.system, [j.layout for j in jobs])
        df.insert(0, "job_key", [j.key for j in jobs])
        parts.append(df)
    if not parts:
        raise UserError(f"sweep {sweep.name} expands to no job: nothing to report")
    out = pd.concat(parts, ignore_index=True)
    out.insert(0, "sweep_name", sweep.name)
    out.insert(0, "run_id", None)
    out["status"] = PREDICTED_ONLY
    for c in ("step_time_s", "tokens_per_s", "peak_memory_bytes"):
        out[c] = np.nan
    return out


# Job states (frontier_llm.jobs.classify) that end a job without a result: a point whose job
# ended so, and left no trace, is a run that did not complete, not a missing point.
FAILED_JOB_STATES = ("FAILED", "OOM", "TIMEOUT", "NODE_FAIL", "CANCELLED", "HUNG")


def _unrun_status(keys: pd.Series, job_states: dict[str, str] | None) -> pd.Series:
    states = keys.map(lambda k: (job_states or {}).get(k, MISSING)).astype(str)
    return states.where(states.isin(FAILED_JOB_STATES), MISSING).str.lower()


def with_measurements(expected: pd.DataFrame, runs: pd.DataFrame,
                      job_states: dict[str, str] | None = None) -> pd.DataFrame:
    """The sweep's expected points joined with the measured runs of the same job keys: each run
    keeps its row (repeats stay apart); an expected point without any run becomes ``missing``,
    or the job's state where the job ended without a trace (``timeout``, ``node_fail``, ... from
    ``job_states``, job key -> state); runs the sweep does not name are kept too. Predictions
    come from ``expected`` (today's cost model) wherever it has the point."""
    runs = add_seq_len(runs)
    if runs.empty:
        out = expected.copy()
        out["status"] = _unrun_status(out["job_key"], job_states)
        return out
    keyed = expected.set_index("job_key")
    pred_cols = [c for c in expected.columns if c.startswith(("predicted_", "mem_"))
                 or c in ("device_memory_bytes", "seq_len")]
    rows = runs.copy()
    hit = rows["job_key"].isin(keyed.index)
    for c in pred_cols:
        if c not in rows:
            rows[c] = np.nan
        rows[c] = rows[c].astype(object)
        rows.loc[hit, c] = keyed.loc[rows.loc[hit, "job_key"], c].to_numpy()
    missing = expected[~expected["job_key"].isin(rows["job_key"])].copy()
    missing["status"] = _unrun_status(missing["job_key"], job_states)
    out = pd.concat([rows, missing], ignore_index=True)
    for c in out.columns:
        if c.startswith(("predicted_", "mem_")) and c != "predicted_costmodel_version" \
                and c != "predicted_fits":
            out[c] = pd.to_numeric(out[c], errors="coerce")
    return out


def add_seq_len(runs: pd.DataFrame) -> pd.DataFrame:
    """``seq_len`` and ``world_size`` for a frame from the store. The sequence length is what
    turns sequences into tokens; it is recovered from completed runs (tokens/s x step time /
    global batch), one value per model."""
    df = runs.copy()
    if "world_size" not in df or df["world_size"].isna().any():
        df["world_size"] = axes.frame_world_size(df)
    if "seq_len" in df and df["seq_len"].notna().all():
        return df
    tokens = df["tokens_per_s"].astype(float) * df["step_time_s"].astype(float)
    per_run = (tokens / df["global_batch"].astype(float)).round()
    seq = per_run.groupby(df["model"]).median()
    known = df["seq_len"] if "seq_len" in df else pd.Series(np.nan, index=df.index)
    df["seq_len"] = known.fillna(df["model"].map(seq))
    return df


def plan_rows(plan, top: int = 5) -> pd.DataFrame:
    """:func:`layout_rows` of a plan's ``top`` fastest layouts that fit, fastest first, with
    their rank: the input of a memory breakdown of what the planner chose."""
    order = plan.order()[:top]
    df = layout_rows(plan.model, plan.system, [plan.layout(int(i)) for i in order])
    df.insert(0, "rank", range(1, len(df) + 1))
    return df


def at_world_size(frame: pd.DataFrame, gpus: int) -> pd.DataFrame:
    """The rows of ``frame`` whose layouts use ``gpus`` GPUs in all; refused (UserError) when
    none does, naming the world sizes that are there."""
    sizes = sorted({int(n) for n in pd.to_numeric(frame["world_size"], errors="coerce").dropna()})
    if gpus not in sizes:
        raise UserError(f"no layout of the sweep uses {gpus} GPUs (its layouts use "
                        f"{', '.join(map(str, sizes)) or 'none'})")
    return frame[frame["world_size"] == gpus].reset_index(drop=True)
