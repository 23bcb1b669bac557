"""The end-of-session check of tests/conftest.py, in one process and under pytest-xdist: a
test that leaves a process running fails the run, named, and the process is stopped. Run in a
pytest of its own (the suite's conftest loaded as a plugin) on a test that leaves ``sleep``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from processes import stat_fields

TESTS = Path(__file__).resolve().parent
pytestmark = pytest.mark.slow

LEAVES = """\
import multiprocessing
import os
import subprocess

# Starts this process's own resource tracker, which is not a test's leftover: it ends with us.
QUEUE = multiprocessing.get_context("spawn").Queue()


def test_leaves_a_process():
    QUEUE.put(1)
    proc = subprocess.Popen(["sleep", "{seconds}"], start_new_session=True)
    with open(os.environ["PID_FILE"], "w") as fh:
        fh.write(str(proc.pid))
"""


@pytest.mark.parametrize("workers", [[], ["-n", "1"]], ids=["one-process", "xdist"])
def test_a_process_left_running_fails_the_run_and_is_stopped(tmp_path, workers):
    seconds = 900 + len(workers)  # a command line no other test starts
    (tmp_path / "test_leaves.py").write_text(LEAVES.format(seconds=seconds))
    env = {**os.environ, "PID_FILE": str(tmp_path / "pid"), "PYTHONPATH": os.pathsep.join(
        [str(TESTS), str(TESTS.parent), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", *workers,
         "--basetemp", str(tmp_path / "base"), "-q", str(tmp_path / "test_leaves.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "1 passed" in out and "still running at the end (now stopped)" in out, out
    assert f"sleep {seconds}" in out, out
    assert "resource_tracker" not in out, out
    pid = int((tmp_path / "pid").read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    fields = stat_fields(pid)
    return fields is not None and fields[0] != "Z"
