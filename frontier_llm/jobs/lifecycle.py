"""The vocabulary of a job's life: what is recorded, and what an executor sees.

:class:`JobState` is what ``flm_jobs.state`` holds (as Optuna's ``TrialState`` is for trials):

    RENDERED -> SUBMITTING -> PENDING -> RUNNING (-> HUNG) -> a terminal verdict
    terminal: COMPLETED, OOM, TIMEOUT, NODE_FAIL, PREEMPTED, CANCELLED, FAILED, LOST

A job SLURM requeues (after NODE_FAIL or PREEMPTED) runs again under the same job id: the
ended attempt keeps its verdict in ``flm_attempts`` and the job's row follows the new one.

LOST is the way out of UNKNOWN: the scheduler has no record of the job (its controller lost
its state, or forgot the job before anyone asked) and the job's own files (trace, packed step
exit file) say nothing final. It is retryable, and is looked at again from its files at every
refresh, so a trace that turns up later still gives it its real verdict.

:class:`SchedulerState` is what an executor reports of a job, in no scheduler's own words:
``jobs/slurm.py`` maps SLURM's (PENDING, COMPLETING, OUT_OF_MEMORY, "CANCELLED by 0", ...) to
it, the local executor reports a process's end as EXITED. Both executors hand the classifier
the same :class:`Observation`; ``jobs/classify.py`` turns it, with the log and the trace, into a
JobState.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from frontier_llm.specs.vocab import JobState

__all__ = ["JobState", "Observation", "SchedulerState"]


class SchedulerState(StrEnum):
    """What an executor sees of a job."""

    PENDING = "PENDING"  # queued, held, configuring, requeued, suspended
    RUNNING = "RUNNING"  # running, completing, signalling, staging out
    COMPLETED = "COMPLETED"  # ended with exit code 0, says the scheduler
    FAILED = "FAILED"  # ended with a non-zero exit code, says the scheduler
    OUT_OF_MEMORY = "OUT_OF_MEMORY"  # killed by the scheduler's memory limit
    TIMEOUT = "TIMEOUT"  # killed at its time limit
    NODE_FAIL = "NODE_FAIL"  # a node failed (or never booted)
    PREEMPTED = "PREEMPTED"  # a higher-priority job took its nodes
    CANCELLED = "CANCELLED"  # cancelled or revoked
    EXITED = "EXITED"  # a process that ended: its exit code (if known) and trace tell the rest
    UNKNOWN = "UNKNOWN"  # a state the executor does not know, or no record (Observation.gone)

    @property
    def ended(self) -> bool:
        return self not in (SchedulerState.PENDING, SchedulerState.RUNNING,
                            SchedulerState.UNKNOWN)


@dataclass(frozen=True)
class Observation:
    """One look at one job, the same record from every executor."""

    state: SchedulerState
    exit_code: str | None = None  # "code:signal", as SLURM prints it; the local one too
    nodelist: str | None = None  # the scheduler's node list (e.g. frontier[00001-00004])
    start: str | None = None  # ISO 8601
    end: str | None = None
    said: str | None = None  # the scheduler's own words, for a verdict's reason
    gone: bool = False  # the scheduler has no record of the job at all (state UNKNOWN)
    restarts: int | None = None  # times the scheduler requeued it (None: not reported)
