"""The job's end, seen from flm bench: stop before a step that cannot finish in time.

SLURM kills a job at its time limit wherever it is: mid-step, with no trace (SIGTERM is handled
only between bytecodes, and a rank inside a collective may never get there). So before each step
bench asks whether the step can still end, with the trace written, before the job does:

* the job's end: ``SLURM_JOB_END_TIME`` (set by SLURM 23.02+ in the job's environment), else the
  ``EndTime`` of ``squeue`` (asked once, by rank 0 only: a thousand ranks must not all query the
  controller), else unknown (no check);
* the next step's time: the longest measured so far, else the cost model's prediction;
* a reserve for gathering the ranks' records and writing the trace (``FLM_DEADLINE_RESERVE``
  seconds; by default 60, or a tenth of the time left when bench starts if that is less, so a
  one-minute test job still runs its steps);
* a SIGUSR1 (sbatch ``--signal=B:USR1@N``, which srun passes to every rank) means "the end is
  near" by itself.

The ranks agree (one all-reduce of the flags before each step), so all stop before the same step.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from datetime import datetime

RESERVE_ENV = "FLM_DEADLINE_RESERVE"
DEFAULT_RESERVE_S = 60.0


def _squeue_end(job_id: str) -> str:
    out = subprocess.run(
        ["squeue", "-h", "-j", job_id, "-o", "%e"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return out.stdout.strip() if out.returncode == 0 else ""


def job_end_time(env: Mapping[str, str], ask: Callable[[str], str] = _squeue_end) -> float | None:
    """The job's end as a UNIX time, or None when it is not known (no SLURM job, no limit)."""
    given = env.get("SLURM_JOB_END_TIME", "")
    if given.isdigit():
        return float(given)
    job = env.get("SLURM_JOB_ID", "")
    if not job.isdigit():
        return None
    try:
        text = ask(job)
    except (OSError, subprocess.SubprocessError):
        return None
    try:  # squeue prints the controller's local time, as this node's clock reads it
        return datetime.fromisoformat(text).timestamp()
    except ValueError:  # "N/A", "Unknown", UNLIMITED or nothing
        return None


def reserve_s(env: Mapping[str, str], left_s: float | None = None) -> float:
    """Seconds kept for writing the trace after the last step: ``FLM_DEADLINE_RESERVE``, else
    60 s, or a tenth of ``left_s`` (the time left at start) when that is less."""
    try:
        return float(env[RESERVE_ENV])
    except (KeyError, ValueError):
        pass
    if left_s is None:
        return DEFAULT_RESERVE_S
    return min(DEFAULT_RESERVE_S, 0.1 * max(0.0, left_s))


def step_cannot_finish(now: float, end: float | None, next_step_s: float, reserve: float) -> bool:
    """Whether a step of ``next_step_s`` started ``now`` would leave less than ``reserve``
    before ``end``."""
    return end is not None and now + next_step_s + reserve > end


class Deadline:
    """One rank's view: the end (rank 0's), the reserve, and whether SIGUSR1 arrived."""

    def __init__(self, end: float | None, reserve: float) -> None:
        self.end, self.reserve, self.signalled = end, reserve, False

    def install(self) -> None:
        """SIGUSR1 marks the end as near (its default action would kill the rank)."""
        signal.signal(signal.SIGUSR1, self._on_usr1)

    def _on_usr1(self, signum, frame) -> None:
        self.signalled = True

    def reason(self, next_step_s: float, now: float | None = None) -> str | None:
        """Why the next step must not start, or None."""
        if self.signalled:
            return "SIGUSR1: the job's time limit is near (sbatch --signal)"
        now = time.time() if now is None else now
        if step_cannot_finish(now, self.end, next_step_s, self.reserve):
            left = max(0.0, (self.end or now) - now)
            return (
                f"{left:.0f} s left before the job's time limit, under the next step "
                f"({next_step_s:.0f} s) plus {self.reserve:.0f} s to write the trace"
            )
        return None


def for_rank(rank: int, env: Mapping[str, str] | None = None) -> Deadline:
    """Rank 0 reads the job's end; the others follow its decision (and their own SIGUSR1)."""
    env = os.environ if env is None else env
    end = job_end_time(env) if rank == 0 else None
    return Deadline(end, reserve_s(env, None if end is None else end - time.time()))
