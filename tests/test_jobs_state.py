"""Job rows in the database (flm_sweeps, flm_jobs) on SQLite and on a real PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest

from frontier_llm.errors import UserError
from frontier_llm.jobs.lifecycle import JobState
from frontier_llm.jobs.state import SweepJobs
from frontier_llm.jobs.sweepdir import render_sweep
from frontier_llm.jobs.sweepspec import load_sweep
from frontier_llm.store import open_store

SWEEP = Path(__file__).resolve().parents[1] / "sweeps" / "tiny-cpu.yaml"


def test_rows_lifecycle_and_idempotent_open(db_url, tmp_path):
    sweep = load_sweep(SWEEP)
    manifest = render_sweep(sweep, tmp_path / "run")
    store = open_store(db_url)
    try:
        state = SweepJobs.open(store, manifest, sweep.text)
        again = SweepJobs.open(store, manifest, sweep.text)  # a repeated command
        assert again.sweep_id == state.sweep_id
        rows = state.rows()
        assert len(rows) == 4 and {r["state"] for r in rows} == {JobState.RENDERED}
        keys = [r["job_key"] for r in rows]

        state.mark_submitting(keys[:2], "tok1", "slurm")
        state.mark_submitted({keys[0]: ("7_0", 0, f"{keys[0]}-j7")})
        state.revert_submitting([keys[1]], "sbatch refused: nope")
        state.record([{"k": keys[0], "state": "COMPLETED", "exit_code": "0:0"}])
        by_key = {r["job_key"]: r for r in state.rows()}
        assert by_key[keys[0]]["state"] == "COMPLETED"
        assert by_key[keys[0]]["attempts"] == 1
        assert by_key[keys[0]]["scheduler_job_id"] == "7_0"
        assert by_key[keys[1]]["state"] == JobState.RENDERED
        assert by_key[keys[1]]["reason"] == "sbatch refused: nope"
        assert by_key[keys[1]]["attempts"] == 0

        state.mark_submitting([keys[0]], "tok2", "slurm")
        assert state.rows([keys[0]])[0]["state"] == JobState.SUBMITTING
        state.mark_submitted({keys[0]: ("9_0", 0, f"{keys[0]}-j9")})
        assert state.rows([keys[0]])[0]["attempts"] == 2
        assert SweepJobs.find(store, "tiny-cpu").sweep_id == state.sweep_id
    finally:
        store.close()


def test_a_changed_sweep_or_folder_is_refused(db_url, tmp_path):
    sweep = load_sweep(SWEEP)
    store = open_store(db_url)
    try:
        SweepJobs.open(store, render_sweep(sweep, tmp_path / "a"), sweep.text)
        with pytest.raises(UserError, match="recorded in the database with folder"):
            SweepJobs.open(store, render_sweep(sweep, tmp_path / "b"), sweep.text)
        with pytest.raises(UserError, match="different sweep file"):
            SweepJobs.open(store, render_sweep(sweep, tmp_path / "a"), sweep.text + "# edit\n")
        with pytest.raises(UserError, match="no sweep named 'nope'"):
            SweepJobs.find(store, "nope")
    finally:
        store.close()
