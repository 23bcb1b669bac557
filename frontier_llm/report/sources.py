"""Where a report's frame comes from: the runs of a sweep in the store, the points a sweep file
expands to (with today's cost model), or both joined. The only module of the report stage that
opens files and databases."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pandas as pd

from frontier_llm.errors import SpecError, UserError
from frontier_llm.report.frames import layout_rows, sweep_frame, with_measurements
from frontier_llm.specs.forms import layout_from_row
from frontier_llm.store import open_existing
from frontier_llm.store.queries import (
    rank_memory_frame,
    runs_frame,
    step_ranges,
    sweep_names,
    validation_frame,
)


def is_sweep_file(sweep: str) -> bool:
    return sweep.endswith((".yaml", ".yml"))


def measured_runs(db: str | None, sweep: str | None) -> pd.DataFrame:
    """The store's runs of ``sweep`` (all runs when None); refuses a sweep the database lacks,
    naming the ones it has."""
    store = open_existing(db)
    try:
        runs = runs_frame(store, sweep=sweep)
        if len(runs):  # each run's step-time range: the spread a single run shows
            runs = runs.merge(step_ranges(store, sweep), on="run_id", how="left")
        if runs.empty:
            names = sweep_names(store)
            have = f"its sweeps: {', '.join(names)}" if names else "it holds no sweep"
            what = f"no runs of sweep {sweep!r}" if sweep else "no runs"
            raise UserError(f"{what} in {store.url_redacted} ({have})")
    finally:
        store.close()
    return runs


def rank_memory(db: str | None, sweep: str) -> pd.DataFrame:
    """Per-rank measured memory of a sweep's runs (empty when the database has none)."""
    store = open_existing(db)
    try:
        return rank_memory_frame(store, sweep=sweep)
    finally:
        store.close()


def validation_runs(db: str | None, sweep: str | None,
                    costmodel_version: str | None = None) -> pd.DataFrame:
    store = open_existing(db)
    try:
        return validation_frame(store, sweep=sweep, costmodel_version=costmodel_version)
    finally:
        store.close()


def sweep_report_frame(sweep: str, db: str | None, model_only: bool = False
                       ) -> tuple[pd.DataFrame, str]:
    """(frame, sweep name) for ``sweep``: a name in the store, or a sweep file whose points are
    predicted by the cost model and joined with the store's runs of the same name (points with
    no run stay, as ``missing``). ``model_only`` (a sweep file only) reads no database."""
    if not is_sweep_file(sweep):
        if model_only:
            raise UserError("--model-only needs a sweep file (sweeps/NAME.yaml), not a name")
        runs = measured_runs(db, sweep)
        spec, states = recorded_sweep(db, sweep)
        if spec is None:  # runs labelled with a sweep name by hand: no expected points
            return with_catalog_breakdown(runs), sweep
        return with_measurements(sweep_frame(spec), runs, states), sweep
    from frontier_llm.jobs.sweepspec import load_sweep

    if not Path(sweep).is_file():
        raise UserError(f"{sweep}: no such sweep file")
    spec = load_sweep(sweep)
    expected = sweep_frame(spec)
    if model_only:
        return expected, spec.name
    return with_measurements(expected, measured_runs(db, spec.name)), spec.name


def recorded_sweep(db: str | None, name: str) -> tuple[object | None, dict[str, str]]:
    """(the sweep as ``flm sweep`` recorded it, its jobs' states by key) for a sweep submitted
    with ``flm sweep submit``; (None, {}) for runs that only carry the sweep's name as a label.
    The sweep file is read from the sweep's folder (DIR/sweep.yaml), else from the copy of its
    text that the database keeps."""
    from sqlalchemy import select

    from frontier_llm.jobs.sweepspec import load_sweep
    from frontier_llm.store.schema import flm_jobs, flm_sweeps

    store = open_existing(db)
    try:
        with store.read() as conn:
            row = conn.execute(select(flm_sweeps.c.id, flm_sweeps.c.spec_yaml,
                                      flm_sweeps.c.directory)
                               .where(flm_sweeps.c.name == name)).mappings().first()
            if row is None:
                return None, {}
            states = dict(conn.execute(select(flm_jobs.c.job_key, flm_jobs.c.state).where(
                flm_jobs.c.sweep_id == row["id"])).all())
    finally:
        store.close()
    saved = Path(row["directory"] or "") / "sweep.yaml"
    try:
        if row["directory"] and saved.is_file():
            return load_sweep(saved), states
        if row["spec_yaml"]:
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "sweep.yaml"
                path.write_text(row["spec_yaml"])
                return load_sweep(path), states
    except UserError:
        pass  # a sweep file that no longer loads (a moved model file): runs alone
    return None, states


def with_catalog_breakdown(runs: pd.DataFrame) -> pd.DataFrame:
    """Add today's cost-model memory breakdown (``mem_<part>_bytes``) to runs whose model and
    system are catalog names; the predictions the traces carried are kept as they are."""
    from frontier_llm.catalog import load_model, load_system

    parts = []
    for (model, system), g in runs.groupby(["model", "system"], sort=False):
        try:
            m, s = load_model(model), load_system(system)
            layouts = [layout_from_row(r) for _, r in g.iterrows()]
            rows = layout_rows(m, s, layouts)
        except (UserError, SpecError):
            parts.append(g)  # not in the catalog (a YAML model): no breakdown for these
            continue
        extra = rows[[c for c in rows if c.startswith("mem_")]
                     + ["device_memory_bytes", "seq_len"]]
        extra.index = g.index
        parts.append(pd.concat([g, extra], axis=1))
    return pd.concat(parts).loc[runs.index]

