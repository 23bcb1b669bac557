"""A real one-node SLURM for the tests, started once per session by scripts/slurm-cluster.sh,
and the helpers the SLURM tests share: a cluster of a module's own (``start_cluster``), the tiny
CPU sweep they submit (``tiny_sweep``), ``flm`` in a subprocess, ``sweep_status`` and
``wait_for``.

tests/conftest.py offers the ``slurm_cluster`` fixture to every test module. Each session's cluster
lives in its own temporary folder with its own ports and SLURM_CONF, so runs never share jobs.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "slurm-cluster.sh"


@dataclass(frozen=True)
class SlurmCluster:
    directory: Path
    conf: Path

    def env(self) -> dict[str, str]:
        """The environment a SLURM client needs to reach this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def ctl(self, command: str, *extra: str) -> None:
        """scripts/slurm-cluster.sh COMMAND on this cluster (restart-ctld, stop-slurmd, ...)."""
        subprocess.run([str(SCRIPT), command, str(self.directory), *extra], check=True,
                       capture_output=True, timeout=90)


def start_cluster(prefix: str = "flm-slurm-", env: dict[str, str] | None = None) -> SlurmCluster:
    """Start a cluster in a new temporary folder; ``env`` passes the script's FLM_SLURM_*
    settings. On failure the folder is stopped and removed, and the script's words raised."""
    # Not under pytest's tmp_path: /tmp/pytest-of-root is private to root, and munged
    # runs as the munge user, which must reach its key, socket and log in this folder.
    directory = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(directory, 0o755)
    out = subprocess.run([str(SCRIPT), "start", str(directory)], capture_output=True, text=True,
                         timeout=120, env=env)
    if out.returncode != 0:
        stop_cluster(directory)
        raise RuntimeError(f"could not start SLURM: {out.stderr.strip()}")
    return SlurmCluster(directory=directory, conf=directory / "slurm.conf")


def stop_cluster(directory: Path) -> None:
    subprocess.run([str(SCRIPT), "stop", str(directory)], timeout=60, check=False)
    shutil.rmtree(directory, ignore_errors=True)


class _Cluster:
    """One cluster per test session, started on first use and stopped at exit: a session
    fixture imported into several modules is one fixture per module, which would otherwise
    start one cluster each."""

    def __init__(self) -> None:
        self.cluster: SlurmCluster | None = None

    def start(self) -> SlurmCluster:
        if self.cluster is None:
            self.cluster = start_cluster()
            atexit.register(self.stop)
        return self.cluster

    def stop(self) -> None:
        if self.cluster is not None:
            stop_cluster(self.cluster.directory)
            self.cluster = None


CLUSTER = _Cluster()


@contextlib.contextmanager
def slurm_conf(cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """SLURM_CONF points at ``cluster`` inside, as it was after: SLURM clients and ``flm`` in
    a subprocess reach this cluster without being told."""
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        yield cluster
    finally:
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    with slurm_conf(CLUSTER.start()) as cluster:
        yield cluster


SWEEP = """\
name: {name}
model: tiny-gpt
system: cpu-local
template: local
gpus_per_node: 4
dtype: fp32
steps: {steps}
warmup: 1
global_batch: 4
resources:
  time: "00:05:00"
layouts:
{layouts}
{extra}"""


def tiny_sweep(name: str, layouts: list[str], steps: int = 3, extra: str = "") -> str:
    """A sweep of tiny-gpt on CPU ranks (cpu-local, the local SLURM template); ``layouts`` are
    flow-style YAML maps, ``extra`` more top-level lines (``pack: 2``)."""
    return SWEEP.format(name=name, steps=steps, extra=extra,
                        layouts="\n".join(f"  - {x}" for x in layouts))


def flm(*args: object, env: dict[str, str] | None = None,
        check: bool = True) -> subprocess.CompletedProcess:
    """``flm ARGS`` in a subprocess (the environment as now, or ``env``); with ``check``, a
    non-zero exit fails the test with both streams."""
    out = subprocess.run([sys.executable, "-m", "frontier_llm.cli", *map(str, args)],
                         capture_output=True, text=True, timeout=600,
                         env=os.environ.copy() if env is None else env)
    if check and out.returncode != 0:
        raise AssertionError(f"flm {' '.join(map(str, args))} exited {out.returncode}:\n"
                             f"{out.stdout}\n{out.stderr}")
    return out


def sweep_status(name: str, db: str, *extra: object,
                 env: dict[str, str] | None = None) -> dict[str, dict]:
    """``flm sweep status NAME --format json`` as rows by job key."""
    out = flm("sweep", "status", name, "--db", db, "--format", "json", *extra, env=env)
    return {r["job_key"]: r for r in json.loads(out.stdout)}


def wait_for(predicate: Callable[[], T], timeout_s: float, what: str,
             interval_s: float = 0.5) -> T:
    """The first truthy value of ``predicate``, asked every ``interval_s``; fails the test
    naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out waiting for {what}")
