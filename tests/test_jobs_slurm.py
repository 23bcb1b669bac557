"""The SLURM client against a real one-node SLURM (scripts/slurm-cluster.sh), no mocks."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from frontier_llm.jobs.lifecycle import SchedulerState
from frontier_llm.jobs.slurm import JobStatus, SlurmClient, SlurmError, base_id, scheduler_state

pytestmark = [pytest.mark.slurm]


def _script(path: Path, body: str) -> Path:
    path.write_text(f"#!/bin/bash\n#SBATCH --output={path.parent}/%x-%A_%a.out\n{body}\n")
    return path


def test_base_id_and_terminal_words():
    assert base_id("12_3") == "12" and base_id("12") == "12"
    assert JobStatus("1", "CANCELLED by 0").terminal
    assert not JobStatus("1", "PENDING").terminal
    assert not JobStatus("1", "UNKNOWN").terminal


def test_slurm_words_map_to_scheduler_states():
    S = SchedulerState
    ended = ("BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
             "OUT_OF_MEMORY", "PREEMPTED", "REVOKED", "SPECIAL_EXIT", "TIMEOUT")
    live = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "REQUEUE_FED",
            "REQUEUE_HOLD", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "SUSPENDED",
            "RESV_DEL_HOLD")
    assert all(scheduler_state(w).ended for w in ended)
    assert not any(scheduler_state(w).ended for w in live)
    assert scheduler_state("CANCELLED by 0") == S.CANCELLED
    assert scheduler_state("COMPLETING") == S.RUNNING
    assert scheduler_state("DEADLINE") == S.TIMEOUT
    assert scheduler_state("BOOT_FAIL") == S.NODE_FAIL
    assert scheduler_state("NO_SUCH_WORD") == scheduler_state("") == S.UNKNOWN
    obs = JobStatus("5_1", "CANCELLED by 0", exit_code="0:15", nodelist="n1").observation()
    assert (obs.state, obs.exit_code, obs.nodelist, obs.said) == (
        S.CANCELLED, "0:15", "n1", "SLURM state CANCELLED")


def test_array_exit_codes_and_states(slurm_cluster, tmp_path):
    client = SlurmClient(slurm_cluster.env())
    script = _script(tmp_path / "exit.sh", 'exit "${SLURM_ARRAY_TASK_ID}"')
    job = client.submit(script, array="0-2")
    final = client.wait([job], timeout_s=60, min_interval_s=0.2, max_interval_s=1.0)
    assert set(final) == {f"{job}_0", f"{job}_1", f"{job}_2"}
    assert final[f"{job}_0"].state == "COMPLETED" and final[f"{job}_0"].exit_code == "0:0"
    assert final[f"{job}_2"].state == "FAILED" and final[f"{job}_2"].exit_code == "2:0"


def test_one_squeue_per_poll_whatever_the_number_of_jobs(slurm_cluster, tmp_path):
    client = SlurmClient(slurm_cluster.env())
    script = _script(tmp_path / "held.sh", "true")
    arrays = [client.submit(script, array="0-9", hold=True) for _ in range(3)]
    try:
        before = client.commands.copy()
        statuses = client.query(arrays)
        used = client.commands - before
        assert len(statuses) == 30
        assert all(s.state == "PENDING" for s in statuses.values())
        assert dict(used) == {"squeue": 1}
        before = client.commands.copy()
        client.query([f"{a}_{i}" for a in arrays for i in range(10)])
        assert dict(client.commands - before) == {"squeue": 1}
    finally:
        client.cancel(arrays)
    ended = client.wait(arrays, timeout_s=30, min_interval_s=0.2)
    assert {s.state for s in ended.values()} == {"CANCELLED"}


def test_held_job_released_runs(slurm_cluster, tmp_path):
    client = SlurmClient(slurm_cluster.env())
    job = client.submit(_script(tmp_path / "ok.sh", "echo ran"), hold=True)
    assert client.query([job])[job].reason == "JobHeldUser"
    client.release([job])
    assert client.wait([job], timeout_s=60, min_interval_s=0.2)[job].state == "COMPLETED"


def test_sbatch_refusal_is_slurms_own_message(slurm_cluster, tmp_path):
    client = SlurmClient(slurm_cluster.env())
    with pytest.raises(SlurmError, match="invalid partition specified: no-such-partition"):
        client.submit(_script(tmp_path / "x.sh", "true"),
                      extra_args=["--partition=no-such-partition"])


def test_forgotten_job_is_unknown(slurm_cluster):
    client = SlurmClient(slurm_cluster.env())
    status = client.query(["987654"])["987654"]
    assert status.state == "UNKNOWN" and not status.found and status.observation().gone


def test_missing_binary_is_a_user_error(tmp_path):
    client = SlurmClient({"PATH": str(tmp_path)})
    with pytest.raises(SlurmError, match="sbatch not found"):
        client.submit(tmp_path / "x.sh")


def test_cluster_script_refuses_bad_usage():
    out = subprocess.run([str(Path(__file__).parents[1] / "scripts" / "slurm-cluster.sh"),
                          "bogus"], capture_output=True, text=True)
    assert out.returncode == 1 and "usage" in out.stderr
