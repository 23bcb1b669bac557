"""flm calibrate end to end on this machine: real gloo ranks (under mpiexec, with the MPI
baseline), real flm bench runs in a real SQLite store, and a real local SLURM job."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import func, select

from frontier_llm.catalog import load_system
from frontier_llm.planner.intervals import system_class
from frontier_llm.store import open_store
from frontier_llm.store.calibration_tables import flm_calibration_samples, flm_calibrations

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

# Small and cheap: tiny-gpt GEMMs, messages up to 4M (7 sizes: on a loaded machine smaller
# messages are all latency and noise, and the fit rightly refuses to invent a bandwidth).
MEASURE = ["--model", "tiny-gpt", "--widths", "32,64,128", "--max-bytes", "4M"]


def flm(*args: str, cwd: Path | None = None, env: dict | None = None,
        timeout: float = 600) -> subprocess.CompletedProcess:
    full = dict(env or os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "frontier_llm.cli", *args], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=timeout)


def test_cpu_calibration_round_trips_into_plan(tmp_path):
    db = f"sqlite:///{tmp_path}/flm.db"
    out = tmp_path / "cpu-cal.yaml"
    proc = flm("calibrate", "run", "--nproc", "2", *MEASURE, "--out", str(out), "--db", db,
               "--results-dir", str(tmp_path / "results"), "--format", "json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    libraries = {link["library"] for link in report["links"]}
    assert libraries == {"gloo", "mpi"}  # torch.distributed and the MPI baseline
    system = load_system(str(out))
    node = system.links["node"]
    gloo = next(x for x in report["links"] if x["library"] == "gloo")
    assert node.bandwidth == pytest.approx(gloo["bandwidth_GBps"] * 1e9, rel=1e-3)
    assert 0 < node.latency < 0.1 and "alpha-beta fit" in node.source
    assert 0 < system.eff("matmul") <= 1 and system.matmul_half_hidden >= 0
    plan = flm("plan", "--model", "tiny-gpt", "--system", str(out), "--gpus", "2",
               "--global-batch", "4", "--format", "json")
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)  # layouts ranked for this machine
    store = open_store(db)
    try:
        with store.read() as conn:
            cal = conn.execute(select(flm_calibrations)).one()
            samples = conn.execute(select(func.count()).select_from(
                flm_calibration_samples)).scalar_one()
    finally:
        store.close()
    assert cal.node_count == 1 and cal.world_size == 2 and cal.hosts
    assert json.loads(cal.versions_json)["torch"] and cal.backend == "gloo"
    assert samples > 8


def test_cross_validated_report_on_real_bench_runs(tmp_path):
    """Four cheap tiny-gpt runs measured with flm bench, collected, then refitted with 2-fold
    cross-validation: the report has before/after errors on held-out runs."""
    traces = tmp_path / "traces"
    # Two runs at a time, as tests/report_fixtures.py builds its database: most of a tiny run
    # is its start-up, which a second core overlaps; the test asserts no timing.
    runs = [["--micro-batch", "2", "--global-batch", "2"],
            ["--micro-batch", "1", "--global-batch", "2"],
            ["--dp", "2", "--micro-batch", "1", "--global-batch", "2"],
            ["--tp", "2", "--micro-batch", "2", "--global-batch", "2"]]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    for pair in (runs[:2], runs[2:]):
        procs = [subprocess.Popen(
            [sys.executable, "-m", "frontier_llm.cli", "bench", "--model", "tiny-gpt", "--dtype",
             "fp32", "--steps", "3", "--warmup", "1", "--trace-dir", str(traces), "--label",
             "sweep=cv", *flags], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True) for flags in pair]
        errs = [proc.communicate(timeout=600)[1] for proc in procs]
        for proc, err in zip(procs, errs, strict=True):
            assert proc.returncode == 0, err[-2000:]
    db = f"sqlite:///{tmp_path}/flm.db"
    assert flm("collect", str(traces), "--db", db, "--quiet").returncode == 0
    out = tmp_path / "refit.yaml"
    proc = flm("calibrate", "--from-runs", "--sweep", "cv", "--folds", "2", "--db", db,
               "--out", str(out), "--format", "json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    held = next(r for r in report["summary"] if r["what"].startswith("held-out"))
    assert held["runs"] == 4 and held["mape_before_pct"] > 0 and held["mape_after_pct"] > 0
    assert {r["fold"] for r in report["runs"]} == {0, 1}
    assert {k["knob"] for k in report["knobs"]} == {"matmul", "layer_overhead_s", "latency"}
    refit = load_system(str(out))
    assert refit.layer_overhead_s == pytest.approx(
        next(k["after"] for k in report["knobs"] if k["knob"] == "layer_overhead_s"), rel=1e-3)
    assert "from_runs" in refit.sources
    # The file records the held-out error, and the planner's intervals use it (issue 27).
    cv = [r for r in report["runs"] if r["set"] == "cv"]
    assert refit.prediction_error.log_residuals == pytest.approx(
        [math.log(1 + r["after_err_pct"] / 100) for r in cv], abs=1e-5)
    assert "2-fold" in refit.prediction_error.method
    assert system_class(refit) == "calibrated"
    # The table form prints the same summary for a person.
    table = flm("calibrate", "--from-runs", "--sweep", "cv", "--folds", "2", "--db", db)
    assert table.returncode == 0 and "held-out (2-fold CV)" in table.stdout


def test_run_with_one_rank_is_refused_before_starting(tmp_path):
    out = tmp_path / "x.yaml"
    proc = flm("calibrate", "run", "--nproc", "1", "--out", str(out), "--db",
               f"sqlite:///{tmp_path}/flm.db")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "at least 2" in proc.stderr and not out.exists()


@pytest.mark.slurm
def test_submit_runs_the_microbenchmark_as_a_slurm_job(slurm_cluster, tmp_path):
    out = tmp_path / "cpu-cal.yaml"
    proc = flm("calibrate", "submit", "--system", "cpu-local", "--nodes", "1",
               "--ranks-per-node", "2", *MEASURE, "--dir", str(tmp_path / "cal"), "--wait",
               "--wait-timeout", "300", "--out", str(out), "--db",
               f"sqlite:///{tmp_path}/flm.db", env=slurm_cluster.env())
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    assert "submitted calibration job" in proc.stdout
    script = next((tmp_path / "cal").glob("calibrate-cpu-local-*.sh")).read_text()
    assert "srun --overcommit --ntasks=2" in script and "calibrate worker" in script
    system = load_system(str(out))
    assert "alpha-beta fit" in system.links["node"].source
    results = next((tmp_path / "cal" / "results").glob("*.calibration.json"))
    prov = json.loads(results.read_text())["provenance"]
    assert prov["launcher"] == "srun" and prov["slurm_job_id"] and prov["world_size"] == 2
