"""A sweep folder shared on a login node (issue 31): concurrent submits never run a job twice,
planted symlinks are replaced rather than followed, another sweep's folder is not taken over,
a local job is only ever signalled as the process it started as, and SIGHUP (a dropped ssh
session) ends a local submit as Ctrl-C does.

Real parts: the local executor starts real processes (a stand-in command, ``python -c``, that
counts its runs, in place of flm bench: what is tested is how often a job runs, not what it
does), real SQLite, real signals to this process."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from sweep_texts import local_sweep

from frontier_llm.cli import main
from frontier_llm.jobs import executors, runner
from frontier_llm.jobs.executors import LocalExecutor, _same_process, local_id
from frontier_llm.jobs.lifecycle import JobState, SchedulerState
from frontier_llm.jobs.sweepspec import load_sweep
from frontier_llm.store import open_store


def _counting_sweep(tmp_path: Path, name: str, sleep_s: float, jobs: int = 2) -> Path:
    """A local sweep whose jobs append their key to ``tmp_path/runs.txt`` and sleep."""
    counter = tmp_path / "runs.txt"
    code = (
        "import os, time; f = open(os.environ['SWEEP_COUNTER'], 'a'); "
        "f.write(os.environ['FLM_JOB_KEY'] + '\\n'); f.close(); "
        f"time.sleep({sleep_s})"
    )
    extra = (
        f"command: [{json.dumps(sys.executable)}, -c, {json.dumps(code)}]\n"
        f"environment:\n  env: {{SWEEP_COUNTER: {json.dumps(str(counter))}}}\n"
    )
    layouts = [f"{{dp: 1, micro_batch: 2, name: j{i}}}" for i in range(jobs)]
    path = tmp_path / f"{name}.yaml"
    path.write_text(local_sweep(name, layouts, extra))
    return path


def test_two_concurrent_submits_run_each_job_once(tmp_path, capsys):
    path = _counting_sweep(tmp_path, "twice", sleep_s=2)
    argv = [
        "sweep",
        "submit",
        str(path),
        "--out",
        str(tmp_path / "run"),
        "--db",
        f"sqlite:///{tmp_path}/flm.db",
    ]
    codes: list[int] = []
    first = threading.Thread(target=lambda: codes.append(main(argv)))
    first.start()
    counter = tmp_path / "runs.txt"
    # The second starts while the first's job runs (its run is counted when it starts).
    for _ in range(300):
        if counter.exists() or not first.is_alive():
            break
        threading.Event().wait(0.02)
    second = main(argv)
    first.join(60)
    assert codes == [0] and second == 2
    err = capsys.readouterr().err
    assert "is being submitted by pid" in err
    assert sorted(counter.read_text().split()) == ["j0", "j1"]  # each job ran once
    # Afterwards a submit finds everything submitted and runs nothing again.
    assert main(argv) == 0
    assert sorted(counter.read_text().split()) == ["j0", "j1"]


def test_sighup_ends_a_local_submit_like_ctrl_c(tmp_path, monkeypatch):
    original = signal.getsignal(signal.SIGHUP)
    if original is signal.SIG_IGN:
        pytest.skip("SIGHUP is ignored here (nohup): flm leaves it ignored")
    store = open_store(f"sqlite:///{tmp_path}/flm.db")
    session = runner.prepare(
        load_sweep(_counting_sweep(tmp_path, "hup", sleep_s=60)), tmp_path / "run", store
    )
    started: list[subprocess.Popen] = []
    real_popen = subprocess.Popen

    def popen_then_hangup(*args, **kwargs):
        proc = real_popen(*args, **kwargs)
        started.append(proc)
        os.kill(os.getpid(), signal.SIGHUP)
        return proc

    monkeypatch.setattr(subprocess, "Popen", popen_then_hangup)
    try:
        with pytest.raises(KeyboardInterrupt):
            runner.submit(session)
        monkeypatch.undo()
        [proc] = started
        with pytest.raises(ProcessLookupError):
            os.killpg(proc.pid, 0)  # the job's whole group was stopped
        rows = {r["job_key"]: r for r in session.state.rows()}
        assert rows["j0"]["state"] == JobState.CANCELLED
        assert signal.getsignal(signal.SIGHUP) is original  # restored
    finally:
        for proc in started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        store.close()


def test_a_local_job_is_signalled_only_as_the_process_it_started_as(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    try:
        sid = local_id(proc.pid, "tok")
        assert _same_process(sid) is True
        # The same pid, another process: a start time that is not this process's.
        pid, token, host, start = sid.split(":")[1:]
        reused = f"local:{pid}:{token}:{host}:{int(start) + 1}"
        other_host = f"local:{pid}:{token}:elsewhere.invalid:{start}"
        assert _same_process(reused) is False and _same_process(other_host) is None
        ex = LocalExecutor()
        ex.cancel([{"scheduler_job_id": reused}, {"scheduler_job_id": other_host}])
        assert proc.poll() is None  # neither signalled it
        seen = ex.observe(
            None,
            [
                {"job_key": "a", "scheduler_job_id": reused},
                {"job_key": "b", "scheduler_job_id": other_host},
                {"job_key": "c", "scheduler_job_id": sid},
            ],
        )
        assert seen["a"].state == SchedulerState.EXITED
        assert seen["b"].state == SchedulerState.UNKNOWN
        assert seen["c"].state == SchedulerState.RUNNING
        ex.cancel([{"scheduler_job_id": sid}])
        assert proc.wait(10) == -signal.SIGTERM
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_another_sweeps_folder_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    first = _counting_sweep(tmp_path, "first", sleep_s=0)
    assert main(["sweep", "render", str(first), "--out", str(out)]) == 0
    manifest = (out / "manifest.json").read_text()
    second = _counting_sweep(tmp_path, "second", sleep_s=0)
    assert main(["sweep", "render", str(second), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "holds sweep 'first'" in err and err.count("\n") == 1
    assert (out / "manifest.json").read_text() == manifest
    (tmp_path / "afile").write_text("x")
    assert main(["sweep", "render", str(first), "--out", str(tmp_path / "afile")]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err


def test_planted_symlinks_are_not_followed(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    # The old fixed temporary names, planted as links to someone's file: now unused (the
    # temporary file has a name mkstemp picks, created with O_EXCL).
    for name in (".manifest.json.tmp", ".sweep.yaml.tmp"):
        (out / name).symlink_to(victim)
    path = _counting_sweep(tmp_path, "planted", sleep_s=0)
    assert main(["sweep", "render", str(path), "--out", str(out)]) == 0
    assert victim.read_text() == "precious\n"
    assert (out / "manifest.json").is_file() and not (out / "manifest.json").is_symlink()
    # A link planted at a target's own name is refused (it leads out of the folder).
    (out / "sweep.yaml").unlink()
    (out / "sweep.yaml").symlink_to(victim)
    capsys.readouterr()
    assert main(["sweep", "render", str(path), "--out", str(out)]) == 2
    assert "leaves the sweep folder" in capsys.readouterr().err
    assert victim.read_text() == "precious\n"


def test_no_held_signal_handler_outside_the_main_thread():
    held = executors._HeldInterrupt()
    done: list[bool] = []

    def work() -> None:
        with held:
            done.append(not held.previous)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert done == [True]
