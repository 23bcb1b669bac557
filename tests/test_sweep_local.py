"""The local executor: the same sweep, the same flm bench command lines and trace layout, run
as processes on this machine (no SLURM). Real bench runs of tiny-gpt over gloo."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from slurm_fixtures import wait_for
from sweep_texts import local_sweep

from frontier_llm.bench.trace import read_trace, trace_path
from frontier_llm.cli import main
from frontier_llm.errors import UserError
from frontier_llm.jobs.state import SweepJobs
from frontier_llm.store import open_store

pytestmark = [pytest.mark.slow]

SWEEP = local_sweep("local-tiny", [
    "{dp: 2, micro_batch: 2, name: dp2}",
    "{dp: 1, micro_batch: 2, name: crash, bench_args: {fault: crash, fault_step: 0}}",
    '{dp: 1, micro_batch: 2, name: slow, time: "0:03", bench_args: {fault: hang, fault_step: 1}}',
], extra='resources:\n  time: "00:05:00"\n')


def test_local_sweep_runs_classifies_and_resumes(tmp_path, capsys):
    spec = tmp_path / "local.yaml"
    spec.write_text(SWEEP)
    db = f"sqlite:///{tmp_path}/flm.db"
    out = tmp_path / "run"
    assert main(["sweep", "submit", str(spec), "--out", str(out), "--db", db,
                 "--max-in-flight", "3"]) == 0
    out_text, err_text = capsys.readouterr()
    assert "submitted 3 jobs" in out_text
    assert main(["sweep", "status", "local-tiny", "--db", db, "--format", "json", "--wait",
                 "--timeout", "60"]) == 0
    status_out, status_err = capsys.readouterr()
    rows = {r["job_key"]: r for r in json.loads(status_out)}
    # Not a terminal (captured): no progress bar, no escape codes, no carriage returns.
    for noise in ("\x1b[", "\r", "━"):
        assert noise not in out_text + err_text + status_out + status_err, noise
    assert rows["dp2"]["state"] == "COMPLETED"
    assert rows["crash"]["state"] == "FAILED"
    assert "injected crash" in rows["crash"]["reason"]
    assert rows["slow"]["state"] == "TIMEOUT"
    trace = read_trace(trace_path(out / "traces", rows["dp2"]["run_id"]))
    assert trace["labels"] == {"sweep": "local-tiny", "job_key": "dp2"}
    # A repeated submit starts nothing.
    assert main(["sweep", "submit", str(spec), "--out", str(out), "--db", db]) == 0
    assert "submitted 0 jobs" in capsys.readouterr().out


SECRET_PASSWORD = "hunter2-not-for-logs"
SECRET = f"postgresql://flm:{SECRET_PASSWORD}@db.example/flm"


def test_local_jobs_get_the_sweeps_environment_and_print_no_value(tmp_path, capsys,
                                                                   monkeypatch):
    """environment.env reaches a local job as it reaches a SLURM job's script: the trace
    records the visible-devices variable the sweep set (CPU torch ignores it). A secret passes
    by name (environment.pass_env) from flm's own environment: the trace names it, and its
    value is in no output, no file of the sweep folder and not in the database."""
    for name in ("ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FLM_DB", SECRET)
    spec = tmp_path / "local.yaml"
    spec.write_text(local_sweep("local-env", ["{dp: 1, micro_batch: 2, name: one}"],
                                "environment:\n  env: {ROCR_VISIBLE_DEVICES: 3}\n"
                                "  pass_env: [FLM_DB]\n"))
    db = f"sqlite:///{tmp_path}/flm.db"
    out = tmp_path / "run"
    assert main(["sweep", "submit", str(spec), "--out", str(out), "--db", db]) == 0
    printed = "".join(capsys.readouterr())
    assert main(["sweep", "status", "local-env", "--db", db, "--format", "json", "--wait",
                 "--timeout", "60"]) == 0
    status_out, status_err = capsys.readouterr()
    printed += status_out + status_err
    row = json.loads(status_out)[0]
    assert row["state"] == "COMPLETED", row
    trace_file = trace_path(out / "traces", row["run_id"])
    environment = read_trace(trace_file)["environment"]
    assert environment["visible_devices"] == {"ROCR_VISIBLE_DEVICES": "3"}
    assert environment["passed_env"] == ["FLM_DB"]
    assert list((out / "logs").rglob("*.out")) and SECRET_PASSWORD not in printed
    for f in tmp_path.rglob("*"):  # the sweep folder (logs, traces, manifest) and flm.db
        assert not f.is_file() or SECRET_PASSWORD.encode() not in f.read_bytes(), f


def test_local_cancel_stops_a_running_job(tmp_path):
    """flm sweep cancel, from another process, ends a running local job and all its ranks."""
    spec = tmp_path / "local.yaml"
    spec.write_text(SWEEP.replace('name: slow, time: "0:03"', "name: slow"))
    db = f"sqlite:///{tmp_path}/flm.db"
    out = tmp_path / "run"
    # The submitter's output goes to a file, which a failure below can quote.
    log_path = tmp_path / "submit.log"
    log = log_path.open("w")
    submit = subprocess.Popen(
        [sys.executable, "-m", "frontier_llm.cli", "sweep", "submit", str(spec), "--out",
         str(out), "--db", db, "--max-in-flight", "3"],
        stdout=log, stderr=subprocess.STDOUT, text=True)
    try:
        store = open_store(db)
        wait_for(lambda: _has_sweep(store), 120, "the sweep's rows", interval_s=0.3)
        state = SweepJobs.find(store, "local-tiny")
        try:
            row = wait_for(lambda: _beating(state, out), 120, "the slow job's heartbeat",
                           interval_s=0.3)
        except AssertionError as e:
            jobs = {r["job_key"]: (r["state"], r["reason"]) for r in state.rows()}
            logs = "".join(f"\n{f.name}: {f.read_text()[-2000:]}"
                           for f in sorted((out / "logs").rglob("*slow*")))
            raise AssertionError(f"{e}; jobs {jobs}; submitter (exit {submit.poll()}):\n"
                                 + log_path.read_text()[-3000:] + logs) from None
        assert main(["sweep", "cancel", "local-tiny", "--db", db, "--job", "slow"]) == 0
        submit.wait(timeout=120)
        final = state.rows(["slow"])[0]
        assert final["state"] == "CANCELLED", final
        pid = int(row["scheduler_job_id"].split(":")[1])
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)  # no rank of the job is left
        assert {r["job_key"]: r["state"] for r in state.rows()}["dp2"] == "COMPLETED"
        store.close()
    finally:
        if submit.poll() is None:
            # Ctrl-C first: the local executor then stops the jobs it started (each in its own
            # session, which a SIGKILL of the submitter would leave running).
            submit.send_signal(signal.SIGINT)
            try:
                submit.wait(timeout=30)
            except subprocess.TimeoutExpired:
                submit.kill()
                submit.wait()
        log.close()


def _has_sweep(store) -> bool:
    try:
        SweepJobs.find(store, "local-tiny")
    except UserError:
        return False
    return True


def _beating(state: SweepJobs, out):
    row = state.rows(["slow"])[0]
    if row["state"] == "RUNNING" and (out / "traces" / f"{row['run_id']}.heartbeat.json").exists():
        return row
    return None


def test_flm_called_by_its_path_from_an_environment_not_activated_runs_its_jobs(tmp_path):
    """An HPC user calls ``/path/to/venv/bin/flm`` without activating the venv: its bin is not
    on PATH, and a job started as plain ``flm`` would find no such program (or another
    installation's). The job must run the installation that started it: the sweep completes."""
    flm_exe = os.path.join(os.path.dirname(sys.executable), "flm")
    assert os.access(flm_exe, os.X_OK), "the test command installs flm beside its python"
    spec = tmp_path / "local.yaml"
    spec.write_text(local_sweep("by-path", ["{dp: 1, micro_batch: 2, name: one}"]))
    bins = {os.path.dirname(sys.executable), os.path.dirname(os.path.realpath(flm_exe))}
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                           if p and p not in bins and not os.path.exists(os.path.join(p, "flm")))
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = path
    db = f"sqlite:///{tmp_path}/flm.db"
    out = subprocess.run([flm_exe, "sweep", "submit", str(spec), "--out", str(tmp_path / "run"),
                          "--db", db], capture_output=True, text=True, env=env, timeout=300,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    status = subprocess.run([flm_exe, "sweep", "status", "by-path", "--db", db, "--format",
                             "json"], capture_output=True, text=True, env=env, timeout=120)
    rows = {r["job_key"]: r for r in json.loads(status.stdout)}
    assert rows["one"]["state"] == "COMPLETED", rows["one"]
