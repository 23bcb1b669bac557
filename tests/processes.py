"""The processes a test session started, found again at its end.

Every process the tests start, directly or through a launcher (flm bench's ranks, a local
job's process group, SLURM's daemons and the job steps they run, PostgreSQL), inherits this
session's environment and with it ``FLM_TEST_SESSION=<token>``; /proc/PID/environ keeps the
environment a process started with, so the token finds them wherever they were re-parented.
Zombies are left out: they run nothing (and where process 1 does not reap orphans, as in some
containers, an orphan's zombie stays until the machine restarts). So is this process's own
multiprocessing helper (the resource tracker a spawn-context queue starts in the test process):
it belongs to the interpreter, not to a test, and ends when this process closes its pipe.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

MARK = "FLM_TEST_SESSION"


@dataclass(frozen=True)
class Survivor:
    pid: int
    command: str

    def __str__(self) -> str:
        return f"pid {self.pid}: {self.command}"


def mark_session() -> str:
    """Give this process (and so everything it starts from now on) a token of its own."""
    token = uuid.uuid4().hex
    os.environ[MARK] = token
    return token


def stat_fields(pid: int | str) -> list[str] | None:
    """/proc/PID/stat's fields after the command's last ')' (the command may hold spaces and
    parentheses): state, ppid, pgrp, session, ...; None once the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _state(pid: int | str) -> str | None:
    fields = stat_fields(pid)
    return fields[0] if fields else None


def in_session(sid: int) -> list[int]:
    """Processes still in session ``sid``."""
    out = []
    for entry in Path("/proc").iterdir():
        fields = stat_fields(entry.name) if entry.name.isdigit() else None
        if fields is not None and int(fields[3]) == sid:
            out.append(int(entry.name))
    return out


_OWN_HELPERS = (b"from multiprocessing.resource_tracker import main",
                b"from multiprocessing.forkserver import main")


def _own_helper(pid: str, cmdline: bytes) -> bool:
    fields = stat_fields(pid)
    return (fields is not None and int(fields[1]) == os.getpid()
            and any(h in cmdline for h in _OWN_HELPERS))


def survivors(token: str) -> list[Survivor]:
    """Live processes other than this one (and its own multiprocessing helpers) that started
    with ``token`` in their environment."""
    needle = f"{MARK}={token}".encode()
    me = str(os.getpid())
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or entry.name == me:
            continue
        try:
            environ = (entry / "environ").read_bytes()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue  # ended while we looked, or not ours to read
        if (needle in environ.split(b"\0") and _state(entry.name) not in (None, "Z")
                and not _own_helper(entry.name, cmdline)):
            command = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()
            found.append(Survivor(int(entry.name), command[:200]))
    return sorted(found, key=lambda s: s.pid)


def end(found: list[Survivor], grace_s: float = 5.0) -> None:
    """SIGTERM each, then SIGKILL what is still alive after ``grace_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for s in found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(s.pid, sig)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(_state(str(s.pid)) not in (None, "Z")
                                                  for s in found):
            time.sleep(0.1)
