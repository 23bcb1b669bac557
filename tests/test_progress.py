"""Progress bars of long commands: drawn with rich at a terminal, absent from pipes and files.

The terminal is a real pseudo-terminal (``pty``) holding the real ``flm collect``'s stdout and
stderr; the pipe case is the same command with its output captured.
"""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

from store_fixtures import many_traces

from frontier_llm.bench.trace import write_trace

NOISE = ("\x1b[", "\r", "━")  # ANSI escapes, carriage returns, rich's bar


def _flm(*args: str) -> list[str]:
    return [sys.executable, "-m", "frontier_llm.cli", *args]


def _env() -> dict[str, str]:
    repo = str(Path(__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": repo, "OMP_NUM_THREADS": "1", "COLUMNS": "100",
            "TERM": "xterm-256color"}


def _on_a_terminal(argv: list[str], cwd: Path) -> tuple[int, str]:
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                            cwd=cwd, env=_env(), close_fds=True)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the command closed its end
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return proc.wait(timeout=120), b"".join(chunks).decode(errors="replace")


def test_collect_draws_a_bar_at_a_terminal_and_none_in_a_pipe(tmp_path):
    for t in many_traces(40):
        write_trace(tmp_path / "runs", t)
    args = ("collect", str(tmp_path / "runs"), "--batch-size", "10")

    code, seen = _on_a_terminal(_flm(*args, "--db", f"sqlite:///{tmp_path}/tty.db"), tmp_path)
    assert code == 0, seen
    assert "\x1b[" in seen and "collect" in seen and "40/40" in seen
    assert "40 new" in seen  # the summary line, after the bar has gone

    piped = subprocess.run(_flm(*args, "--db", f"sqlite:///{tmp_path}/pipe.db"), cwd=tmp_path,
                           env=_env(), capture_output=True, text=True, timeout=120)
    assert piped.returncode == 0, piped.stderr
    assert "40 new" in piped.stdout
    assert piped.stderr.count("collect: batch") == 4  # the log lines stay, the bar does not
    for noise in NOISE:
        assert noise not in piped.stdout and noise not in piped.stderr, noise
