"""A sweep submitted by ``/path/to/venv/bin/flm`` with that environment not activated: the
README promises flm works called by its path. Its jobs ran ``flm bench`` by name on the real
one-node SLURM (scripts/slurm-cluster.sh) and every one failed with ``execve(): flm: No such
file or directory``; the job script now puts the rendering installation's bin folder on PATH
when the job's environment has no flm."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from slurm_fixtures import tiny_sweep

from frontier_llm.child import installation_bin

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_a_sweep_submitted_by_flms_path_runs_its_jobs(slurm_cluster, tmp_path):
    bin_dir = installation_bin()
    assert bin_dir, "the test environment's interpreter has no flm script beside it"
    # The shell of a user who did not activate the environment: its bin folder off PATH.
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                           if Path(p).absolute() != Path(bin_dir)
                           and not os.access(Path(p) / "flm", os.X_OK))
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.update(PATH=path, OMP_NUM_THREADS="1")
    sweep = tmp_path / "unact.yaml"
    sweep.write_text(tiny_sweep("unact", ["{dp: 2, micro_batch: 2}"], steps=2))
    db = f"sqlite:///{tmp_path}/flm.db"
    flm = str(Path(bin_dir) / "flm")

    def run(*args: object) -> subprocess.CompletedProcess:
        return subprocess.run([flm, *map(str, args)], capture_output=True, text=True,
                              timeout=600, env=env, cwd=tmp_path)

    sub = run("sweep", "submit", sweep, "--out", tmp_path / "run", "--db", db)
    assert sub.returncode == 0, sub.stdout + sub.stderr
    status = run("sweep", "status", "unact", "--db", db, "--format", "json", "--wait",
                 "--timeout", 300, "--max-interval", 2)
    assert status.returncode == 0, status.stdout + status.stderr
    rows = json.loads(status.stdout)
    logs = "".join(p.read_text() for p in (tmp_path / "run").rglob("*.out"))
    assert [r["state"] for r in rows] == ["COMPLETED"], (rows, logs)
    assert "No such file" not in logs
