"""flm bench stops before a step it cannot finish inside the job's time limit, and writes a
valid ``timeout`` trace of the steps it did (instead of being killed mid-step)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from datetime import datetime

import pytest
from slurm_fixtures import wait_for

from frontier_llm.bench import deadline
from frontier_llm.bench.trace import read_trace

FLM = [sys.executable, "-m", "frontier_llm.cli"]


def test_the_jobs_end_from_slurm_or_squeue():
    assert deadline.job_end_time({"SLURM_JOB_END_TIME": "1700000000"}) == 1700000000.0
    when = datetime(2026, 11, 26, 10, 0, 0)
    asked = []
    end = deadline.job_end_time(
        {"SLURM_JOB_ID": "42"}, ask=lambda job: asked.append(job) or when.isoformat()
    )
    assert end == when.timestamp() and asked == ["42"]
    assert deadline.job_end_time({"SLURM_JOB_ID": "42"}, ask=lambda job: "N/A") is None
    assert deadline.job_end_time({}) is None  # not a SLURM job: no check


def test_the_reserve_is_a_tenth_of_a_short_job():
    assert deadline.reserve_s({}, left_s=3600) == 60.0
    assert deadline.reserve_s({}, left_s=56) == pytest.approx(5.6)  # a one-minute job
    assert deadline.reserve_s({"FLM_DEADLINE_RESERVE": "48"}, left_s=56) == 48.0


@pytest.mark.parametrize(
    "now,end,step,reserve,stop",
    [
        (0, 100, 30, 60, False),
        (0, 100, 41, 60, True),
        (0, None, 1e9, 60, False),
    ],
)
def test_a_step_that_would_eat_the_reserve_is_not_started(now, end, step, reserve, stop):
    d = deadline.Deadline(end, reserve)
    assert (d.reason(step, now=now) is not None) == stop
    d.signalled = True  # sbatch --signal=B:USR1@N, passed on by srun
    assert "SIGUSR1" in d.reason(0.0, now=now)


def _submit(tmp_path, environ: dict[str, str], run_id: str) -> str:
    """A one-minute job whose bench would run for far longer, its srun exec'd as the rendered
    scripts do (so a batch-shell signal reaches srun, which passes it on)."""
    cmd = shlex.join(
        [
            "srun",
            *FLM,
            "bench",
            "--model",
            "tiny-gpt",
            "--dtype",
            "fp32",
            "--steps",
            "100000",
            "--warmup",
            "1",
            "--trace-dir",
            str(tmp_path),
            "--run-id",
            run_id,
        ]
    )
    return subprocess.run(
        [
            "sbatch",
            "--parsable",
            "-n",
            "1",
            "--time=1",
            "-o",
            str(tmp_path / f"{run_id}.out"),
            "--wrap",
            f"exec {cmd}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=environ,
        check=True,
    ).stdout.strip()


@pytest.mark.slow
@pytest.mark.slurm
def test_a_job_near_its_time_limit_ends_with_a_timeout_trace(tmp_path, slurm_cluster):
    """The real SLURM (22.05 here: no SLURM_JOB_END_TIME, so rank 0 reads squeue's EndTime).
    Job ``end``: with 50 s kept for the trace, bench stops about 10 s in, long before SLURM's
    kill. Job ``usr1``, beside it: the batch shell gets USR1 (what --signal=B:USR1@300 sends),
    and bench stops before its next step. Both traces keep the steps done."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    environ.update(SLURM_CONF=str(slurm_cluster.conf), OMP_NUM_THREADS="1")
    start = time.monotonic()
    jobs = {
        "end": _submit(tmp_path, {**environ, "FLM_DEADLINE_RESERVE": "50"}, "end"),
        "usr1": _submit(tmp_path, environ, "usr1"),
    }
    wait_for(lambda: (tmp_path / "usr1.heartbeat.json").exists(), 60, "usr1's first step")
    subprocess.run(
        ["scancel", "--batch", "--signal=USR1", jobs["usr1"]], env=environ, check=True, timeout=30
    )

    def ended(job: str) -> str | None:  # sbatch --wait polls with a back-off of up to 30 s
        out = subprocess.run(
            ["scontrol", "show", "job", job, "-o"],
            capture_output=True,
            text=True,
            timeout=30,
            env=environ,
        ).stdout
        return (
            out
            if any(f"JobState={s} " in out for s in ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED"))
            else None
        )

    for run_id, job in jobs.items():
        record = wait_for(lambda job=job: ended(job), 90, f"job {run_id} to end")
        assert time.monotonic() - start < 45  # stopped by itself, not by the limit (60 s)
        assert "JobState=FAILED " in record and "ExitCode=1:0" in record, record
        log = (tmp_path / f"{run_id}.out").read_text()
        assert "Traceback" not in log and "DUE TO TIME LIMIT" not in log, log[-2000:]
        trace = read_trace(tmp_path / f"{run_id}.trace.json")
        assert trace["status"] == "timeout", trace["error"]
        steps = trace["steps"]
        assert 0 < len(steps) < 100001 and [s["step"] for s in steps] == list(range(len(steps)))
        assert trace["summary"]["steps_measured"] == len(steps) - 1
        assert trace["error"].startswith(f"stopped before step {len(steps)} of 100001: ")
        why = "SIGUSR1" if run_id == "usr1" else "before the job's time limit"
        assert why in trace["error"], trace["error"]
