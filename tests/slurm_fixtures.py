"""A real one-node SLURM for the tests, started once per session by scripts/slurm-cluster.sh.

tests/conftest.py offers the ``slurm_cluster`` fixture to every test module. Each session's cluster
lives in its own temporary folder with its own ports and SLURM_CONF, so runs never share jobs.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "slurm-cluster.sh"


@dataclass(frozen=True)
class SlurmCluster:
    directory: Path
    conf: Path

    def env(self) -> dict[str, str]:
        """The environment a SLURM client needs to reach this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}


class _Cluster:
    """One cluster per test session, started on first use and stopped at exit: a session
    fixture imported into several modules is one fixture per module, which would otherwise
    start one cluster each."""

    def __init__(self) -> None:
        self.cluster: SlurmCluster | None = None

    def start(self) -> SlurmCluster:
        if self.cluster is None:
            # Not under pytest's tmp_path: /tmp/pytest-of-root is private to root, and munged
            # runs as the munge user, which must reach its key, socket and log in this folder.
            directory = Path(tempfile.mkdtemp(prefix="flm-slurm-"))
            os.chmod(directory, 0o755)
            out = subprocess.run([str(SCRIPT), "start", str(directory)], capture_output=True,
                                 text=True, timeout=120)
            if out.returncode != 0:
                self._stop(directory)
                raise RuntimeError(f"could not start SLURM: {out.stderr.strip()}")
            self.cluster = SlurmCluster(directory=directory, conf=directory / "slurm.conf")
            atexit.register(self.stop)
        return self.cluster

    def stop(self) -> None:
        if self.cluster is not None:
            self._stop(self.cluster.directory)
            self.cluster = None

    @staticmethod
    def _stop(directory: Path) -> None:
        subprocess.run([str(SCRIPT), "stop", str(directory)], timeout=60, check=False)
        shutil.rmtree(directory, ignore_errors=True)


CLUSTER = _Cluster()


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    cluster = CLUSTER.start()
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        yield cluster
    finally:
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old
