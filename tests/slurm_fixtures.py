"""A real one-node SLURM for the tests, started once per session by scripts/slurm-cluster.sh.

Test modules import the fixture with ``from slurm_fixtures import slurm_cluster`` (pytest puts
tests/ on sys.path). Each session's cluster
lives in its own temporary folder with its own ports and SLURM_CONF, so runs never share jobs.
"""

from __future__ import annotations

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


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    # Not under pytest's tmp_path: /tmp/pytest-of-root is private to root, and munged runs as
    # the munge user, which must reach its key, socket and log in this folder.
    directory = Path(tempfile.mkdtemp(prefix="flm-slurm-"))
    os.chmod(directory, 0o755)
    out = subprocess.run(
        [str(SCRIPT), "start", str(directory)], capture_output=True, text=True, timeout=120
    )
    if out.returncode != 0:
        raise RuntimeError(f"could not start SLURM: {out.stderr.strip()}")
    cluster = SlurmCluster(directory=directory, conf=directory / "slurm.conf")
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        yield cluster
    finally:
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old
        subprocess.run([str(SCRIPT), "stop", str(directory)], timeout=60, check=False)
        shutil.rmtree(directory, ignore_errors=True)
