"""A site's per-user queue limit counts the jobs the user already has queued (squeue --me),
checked at submit on the real local SLURM."""

from __future__ import annotations

import os
import subprocess

import pytest
from slurm_fixtures import flm, tiny_sweep

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_submit_counts_the_users_queued_jobs(slurm_cluster, tmp_path):
    env = {**slurm_cluster.env(), "OMP_NUM_THREADS": "1"}
    env.pop("SBATCH_ACCOUNT", None)
    path = tmp_path / "q.yaml"
    path.write_text(
        tiny_sweep(
            "queue-room",
            ["{dp: 1, micro_batch: 2}", "{dp: 2, micro_batch: 2}"],
            extra="site: {max_queued_jobs: 2}\n",
        )
    )
    held = subprocess.run(
        ["sbatch", "--parsable", "--hold", "-t", "1", "-o", os.devnull, "--wrap", "true"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=60,
    ).stdout.strip()
    try:
        out = flm(
            "sweep",
            "submit",
            path,
            "--out",
            tmp_path / "run",
            "--db",
            f"sqlite:///{tmp_path}/flm.db",
            env=env,
            check=False,
        )
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert out.stderr.count("\n") == 1
        assert (
            "site rule cpu-local.max_queued_jobs: you have 1 jobs queued and this submit adds 2"
        ) in out.stderr
        queued = subprocess.run(
            ["squeue", "--noheader", "--me", "--array", "--format=%i"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        ).stdout
        assert queued.split() == [held]  # nothing of the sweep reached the queue
    finally:
        subprocess.run(["scancel", held], env=env, timeout=60, check=False)
