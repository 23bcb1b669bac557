"""Ctrl-C during a local submit: the job whose process has just started is never left running
unrecorded (its session is out of reach of the terminal's Ctrl-C, and a resume would run the
job a second time). A sweep's local executor stops it with its whole process group and records
it CANCELLED; a study's detached executor records it RUNNING and leaves it to run, as it leaves
every trial's job.

Real parts: the local executor starts the real ``flm bench`` process, the SIGINT is a real
signal to this process, the rows are in a real SQLite database. The one hook wraps
``subprocess.Popen`` to send the SIGINT the moment the job's process exists, which makes the
window between start and record (a few microseconds in real use) certain instead of a matter
of timing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from dataclasses import replace

import pytest
from slurm_fixtures import tiny_sweep

from frontier_llm.jobs import runner
from frontier_llm.jobs.executors import _HeldInterrupt
from frontier_llm.jobs.lifecycle import JobState
from frontier_llm.jobs.sweepspec import load_sweep
from frontier_llm.store import open_store
from frontier_llm.tune.local import DetachedLocalExecutor

# Each test relies on SIGINT raising KeyboardInterrupt, which a suite started in the background
# by a script (SIGINT ignored) would not give it.
pytestmark = pytest.mark.usefixtures("sigint_raises")

SWEEP = tiny_sweep("interrupted", [
    "{dp: 1, micro_batch: 2, name: first, bench_args: {fault: hang, fault_step: 0}}",
    "{dp: 1, micro_batch: 2, name: second}"], steps=2, extra="executor: local\n")


def _session(tmp_path, store) -> runner.Session:
    spec = tmp_path / "s.yaml"
    spec.write_text(SWEEP)
    return runner.prepare(load_sweep(spec), tmp_path / "run", store)


def _submit_with_ctrl_c_after_start(session, monkeypatch, started: list) -> None:
    """runner.submit, with a SIGINT to this process the moment the first job's process exists;
    it must end in KeyboardInterrupt. ``started`` gets the processes it started."""
    real_popen = subprocess.Popen

    def popen_then_ctrl_c(*args, **kwargs):
        proc = real_popen(*args, **kwargs)
        started.append(proc)
        os.kill(os.getpid(), signal.SIGINT)
        return proc

    monkeypatch.setattr(subprocess, "Popen", popen_then_ctrl_c)
    try:
        with pytest.raises(KeyboardInterrupt):
            runner.submit(session, max_in_flight=1)
    finally:
        monkeypatch.undo()
    assert len(started) == 1  # the interrupt stopped the submit before the second job


def _kill(started: list[subprocess.Popen]) -> None:
    for proc in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_ctrl_c_right_after_a_local_job_starts_leaves_nothing_running(tmp_path, monkeypatch):
    store = open_store(f"sqlite:///{tmp_path}/flm.db")
    session = _session(tmp_path, store)
    started: list[subprocess.Popen] = []
    try:
        _submit_with_ctrl_c_after_start(session, monkeypatch, started)
        pid = started[0].pid
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)  # no process of the job's group survives
        rows = {r["job_key"]: r for r in session.state.rows()}
        # Recorded with its process id and ended: a resume neither adopts nor reruns it.
        assert rows["first"]["scheduler_job_id"].startswith(f"local:{pid}:"), rows["first"]
        assert rows["first"]["state"] == JobState.CANCELLED, rows["first"]
        assert "interrupted flm sweep submit" in rows["first"]["reason"]
        # The job that never started stays SUBMITTING for the next submit to revert and run.
        assert rows["second"]["state"] == JobState.SUBMITTING
        assert rows["second"]["scheduler_job_id"] is None
    finally:
        _kill(started)  # what a failing run leaves behind
        store.close()


def test_ctrl_c_right_after_a_detached_job_starts_records_it(tmp_path, monkeypatch):
    store = open_store(f"sqlite:///{tmp_path}/flm.db")
    session = replace(_session(tmp_path, store), executor=DetachedLocalExecutor())
    started: list[subprocess.Popen] = []
    try:
        _submit_with_ctrl_c_after_start(session, monkeypatch, started)
        pid = started[0].pid
        os.killpg(pid, 0)  # left running, as a trial's job is
        rows = {r["job_key"]: r for r in session.state.rows()}
        assert rows["first"]["scheduler_job_id"].startswith(f"local:{pid}:"), rows["first"]
        assert rows["first"]["state"] == JobState.RUNNING, rows["first"]
        assert rows["second"]["state"] == JobState.SUBMITTING
    finally:
        _kill(started)
        store.close()


def test_a_held_ctrl_c_comes_at_the_end_of_the_block():
    reached = []
    with pytest.raises(KeyboardInterrupt), _HeldInterrupt():
        os.kill(os.getpid(), signal.SIGINT)
        reached.append(sum(range(1000)))  # Python code after the signal: not interrupted
    assert reached == [499500]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_ignored_ctrl_c_stays_ignored():
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with _HeldInterrupt() as held:
            os.kill(os.getpid(), signal.SIGINT)
            held.deliver()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, old)
