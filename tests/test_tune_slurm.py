"""flm tune end to end on the real one-node SLURM: a 6-trial study of tiny-gpt whose trials run
flm bench as SLURM jobs; the driver is SIGKILLed mid-study and started again, and the study ends
with every trial accounted for exactly once and one stored run per completed trial."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState
from sqlalchemy import select

from frontier_llm.store import open_store
from frontier_llm.store.schema import flm_jobs, flm_runs, flm_sweeps
from frontier_llm.tune import optuna_study as osx

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(1500)]
REPO = Path(__file__).resolve().parents[1]

STUDY = """\
name: tt
model: tiny-gpt
system: cpu-local
template: local
executor: slurm
gpus: [2]
gpus_per_node: 4
dtype: fp32
steps: 2
warmup: 1
global_batch: 4
resources:
  time: "00:05:00"
study:
  space:
    tp: [1, 2]
    micro_batch: [1, 2]
    zero: [0, 1]
    run:
      bucket_mb: [1, 64]
  budget: {trials: 6}
  sampler: tpe
  seed: 0
  in_flight: 2
  warm_start: 2
"""


def _optuna_tables_made(db: Path) -> bool:
    """Optuna's tables are made and stamped (its alembic_version; flm's is flm_alembic_version)
    by the driver. A load_study before that makes them too, racing the driver, which then
    fails with "table study_system_attributes already exists" (seen once)."""
    if not db.exists():
        return False
    try:
        with contextlib.closing(sqlite3.connect(db, timeout=5)) as conn:
            return bool(conn.execute("select count(*) from alembic_version").fetchone()[0])
    except sqlite3.Error:
        return False


def flm_cmd(*args: object) -> list[str]:
    return [sys.executable, "-m", "frontier_llm.cli", *map(str, args)]


def test_study_survives_sigkill_of_its_driver(slurm_cluster, tmp_path):
    path = tmp_path / "tt.yaml"
    path.write_text(STUDY)
    url = f"sqlite:///{tmp_path / 'flm.db'}"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    args = ("tune", "run", path, "--db", url, "--poll", "1", "--out", tmp_path / "runs")
    driver = subprocess.Popen(flm_cmd(*args), env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    # Mid-study: some trials told, some still running.
    deadline = time.monotonic() + 600
    while True:
        assert driver.poll() is None, driver.stdout.read()
        assert time.monotonic() < deadline, "no trial finished in 10 minutes"
        time.sleep(1)
        if not _optuna_tables_made(tmp_path / "flm.db"):
            continue
        try:
            trials = optuna.load_study(study_name="tt", storage=url).trials
        except KeyError:
            continue
        done = [t for t in trials if osx.A_SWEEP in t.user_attrs
                and t.state != TrialState.RUNNING]
        running = [t for t in trials if t.state == TrialState.RUNNING]
        if len(done) >= 2 and running:
            break
    driver.send_signal(signal.SIGKILL)
    driver.wait()

    out = subprocess.run(flm_cmd(*args), env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "finished: budget of 6 trials spent" in out.stdout

    trials = optuna.load_study(study_name="tt", storage=url).trials
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    jobs = [t for t in trials if osx.A_SWEEP in t.user_attrs]
    assert len(jobs) == 6
    names = sorted(t.user_attrs[osx.A_SWEEP] for t in jobs)
    assert len(set(names)) == 6

    store = open_store(url)
    with store.read() as conn:
        rows = conn.execute(select(flm_sweeps.c.name, flm_jobs.c.attempts, flm_jobs.c.state,
                                   flm_jobs.c.run_id, flm_jobs.c.id)
                            .join(flm_jobs, flm_jobs.c.sweep_id == flm_sweeps.c.id)
                            .where(flm_sweeps.c.name.like("tt.t%"))).mappings().all()
        runs = conn.execute(select(flm_runs.c.id, flm_runs.c.run_id, flm_runs.c.sweep_name)
                            .where(flm_runs.c.sweep_name.like("tt.t%"))).mappings().all()
    store.close()
    # Each trial's job was submitted once: one row, one attempt, one SLURM log.
    assert sorted(r["name"] for r in rows) == names
    assert all(r["attempts"] == 1 for r in rows)
    for t in jobs:
        folder = tmp_path / "runs" / f"t{t.number:04d}"
        assert len(list(folder.glob("logs/*/*.out"))) == 1
    completed = [t for t in jobs if t.user_attrs.get(osx.A_CLASSIFICATION) == "COMPLETED"]
    assert completed, [t.user_attrs for t in jobs]
    # One stored run per completed trial, linked both ways.
    assert sorted(r["sweep_name"] for r in runs) == sorted(t.user_attrs[osx.A_SWEEP]
                                                          for t in completed)
    by_run = {r["run_id"]: r["id"] for r in runs}
    job_ids = {r["name"]: r["id"] for r in rows}
    for t in completed:
        assert t.state == TrialState.COMPLETE and t.values[0] > 0
        assert by_run[t.user_attrs["flm_run_id"]] == t.user_attrs["flm_run_row"]
        assert job_ids[t.user_attrs[osx.A_SWEEP]] == t.user_attrs["flm_job_row"]

    status = subprocess.run(flm_cmd("tune", "status", "tt", "--db", url, "--format", "json"),
                            env=env, capture_output=True, text=True, timeout=120)
    s = json.loads(status.stdout)
    assert s["jobs"] == 6 and s["best"]["run_id"] in by_run
    best = subprocess.run(flm_cmd("tune", "best", path, "--db", url), env=env,
                          capture_output=True, text=True, timeout=120)
    doc = yaml.safe_load(best.stdout)
    assert doc["throughput_per_gpu"] == max(t.values[0] for t in completed)
    assert doc["layout"]["tp"] * doc["layout"]["pp"] * doc["layout"]["dp"] == 2
