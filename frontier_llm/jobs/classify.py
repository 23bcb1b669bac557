"""What became of a job: one verdict from the executor's observation (state, exit code), the
log, the trace and the heartbeat.

Terminal verdicts: COMPLETED (with a valid trace), OOM, TIMEOUT, NODE_FAIL, CANCELLED, FAILED
(with the first error line). HUNG is a verdict on a live job whose heartbeat has not moved for
``hung_after_s`` (the job is still in the queue; ``flm sweep cancel --hung`` ends it). The
states are :class:`frontier_llm.jobs.lifecycle.JobState`; no scheduler's words appear here.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frontier_llm.bench.peer_errors import is_collateral
from frontier_llm.bench.trace import TraceError, heartbeat_path, read_trace, trace_path
from frontier_llm.errors import ExitCode
from frontier_llm.jobs.contract import BANNER_PREFIX
from frontier_llm.jobs.lifecycle import JobState, Observation, SchedulerState
from frontier_llm.specs.vocab import RunStatus

# Trace statuses whose run ran to its end (RunStatus.measured).
_MEASURED = tuple(s for s in RunStatus if s.measured)

_ERROR_LINE = re.compile(
    r"(^[\w.]*(Error|Exception|Interrupt)\b[^:]*:|\berror\b|\bfatal\b|\bkilled\b|\bcrash"
    r"|\babort|segmentation fault|core dumped|out of memory)", re.IGNORECASE)


@dataclass(frozen=True)
class Verdict:
    state: JobState
    reason: str | None = None

    @property
    def terminal(self) -> bool:
        return self.state.terminal


def error_lines(text: str) -> Iterator[str]:
    """The lines of ``text`` that say something went wrong, in log order."""
    for line in text.splitlines():
        ln = line.strip()
        if not ln:
            continue
        # The job script's own banner names the job key, which may be any word.
        if ln.startswith(("Traceback", BANNER_PREFIX)):
            continue
        if _ERROR_LINE.search(ln):
            yield ln[:500]


def first_error_line(text: str) -> str | None:
    """The first line of ``text`` that says something went wrong."""
    return next(error_lines(text), None)


def failure_reason(log_text: str, trace_error: str | None) -> str | None:
    """Why a job failed: the first error of its log, then its trace's, that is not a
    collective failing because a peer died (bench/peer_errors.py). The ranks of one job share a
    log, and a healthy rank's "Read error" can land above the dying rank's own line. When every
    error is such an echo, the trace's (the bench chose it from every rank's report), else the
    log's first."""
    lines = list(error_lines(log_text))
    cause = next((e for e in [*lines, trace_error] if e and not is_collateral(e)), None)
    return cause or trace_error or next(iter(lines), None)


def exit_status(exit_code: str | int | None) -> tuple[int | None, int | None]:
    """(code, signal) from SLURM's "code:signal" or a plain process return code."""
    if exit_code is None:
        return None, None
    if isinstance(exit_code, int):
        return (exit_code, None) if exit_code >= 0 else (None, -exit_code)
    code, _, sig = str(exit_code).partition(":")
    try:
        return int(code), int(sig) if sig else None
    except ValueError:
        return None, None


def load_trace(trace_dir: str | Path, run_id: str | None) -> tuple[dict | None, str | None]:
    """(trace, problem): the run's trace if valid, else why not."""
    if not run_id:
        return None, "no run id"
    path = trace_path(trace_dir, run_id)
    if not path.is_file():
        return None, "no trace written"
    try:
        return read_trace(path), None
    except TraceError as exc:
        return None, f"invalid trace: {exc}"
    except RecursionError:
        # A trace nested thousands deep must not end flm sweep status in a traceback.
        return None, "invalid trace: nested too deeply"


def heartbeat_age(trace_dir: str | Path, run_id: str | None, now: float | None = None
                  ) -> float | None:
    """Seconds since the run's heartbeat last changed (None without a heartbeat)."""
    if not run_id:
        return None
    path = heartbeat_path(trace_dir, run_id)
    try:
        mtime = path.stat().st_mtime
    except OSError:
        return None
    return (now or time.time()) - mtime


def classify(
    observed: Observation,
    *,
    trace: dict[str, Any] | None = None,
    trace_problem: str | None = None,
    log_text: str = "",
    heartbeat_age_s: float | None = None,
    running_for_s: float | None = None,
    hung_after_s: float | None = None,
) -> Verdict:
    """One verdict from an executor's observation of the job and what the run left behind."""
    state, said = observed.state, observed.said
    code, sig = exit_status(observed.exit_code)
    status = trace.get("status") if trace else None
    error = (trace.get("error") or None) if trace else None
    S = SchedulerState

    if state == S.PENDING:
        return Verdict(JobState.PENDING)
    if state == S.RUNNING:
        if hung_after_s is not None:
            quiet = heartbeat_age_s if heartbeat_age_s is not None else running_for_s
            if quiet is not None and quiet > hung_after_s:
                what = "heartbeat" if heartbeat_age_s is not None else "first heartbeat"
                return Verdict(JobState.HUNG,
                               f"no {what} for {quiet:.0f} s (limit {hung_after_s:.0f} s)")
        return Verdict(JobState.RUNNING)

    if observed.gone:
        return _forgotten(status, error, log_text, heartbeat_age_s)
    # The run's own account of an out-of-memory beats the scheduler's generic FAILED.
    if status == RunStatus.OOM or state == S.OUT_OF_MEMORY or code == ExitCode.OOM:
        return Verdict(JobState.OOM, error or first_error_line(log_text) or "out of memory")
    if state == S.TIMEOUT:
        return Verdict(JobState.TIMEOUT, "time limit reached")
    if state == S.NODE_FAIL:
        return Verdict(JobState.NODE_FAIL, said or "a node failed")
    if state == S.PREEMPTED:
        return Verdict(JobState.PREEMPTED, said or "preempted")
    # Before the trace's "timeout": flm bench writes that on any SIGTERM, and scancel sends one
    # too, so only the scheduler knows whether the job was cancelled or ran out of time.
    if state == S.CANCELLED:
        if "DUE TO TIME LIMIT" in log_text:
            return Verdict(JobState.TIMEOUT, "time limit reached")
        return Verdict(JobState.CANCELLED, said or "cancelled")
    if status == RunStatus.TIMEOUT:
        return Verdict(JobState.TIMEOUT, "time limit reached")
    if state == S.COMPLETED or (state == S.EXITED and (
            code == ExitCode.OK or (code is None and status in _MEASURED))):
        if status == RunStatus.COMPLETED:
            return Verdict(JobState.COMPLETED)
        # Ran to the end; the trace says why its figures are doubtful.
        if status == RunStatus.SUSPECT:
            return Verdict(JobState.COMPLETED, error or "suspect measurement")
        if status in (RunStatus.FAILED, None) and trace is not None:
            return Verdict(JobState.FAILED, error or "trace status failed")
        return Verdict(JobState.FAILED, f"exit 0 but {trace_problem or 'no valid trace'}")
    if state in (S.FAILED, S.EXITED):
        reason = failure_reason(log_text, error)
        if not reason:
            reason = f"exit code {code}" if code else (f"signal {sig}" if sig else "failed")
        return Verdict(JobState.FAILED, reason)
    return Verdict(JobState.UNKNOWN, said or f"scheduler state {state}")


_FORGOTTEN = "the scheduler has no record of it"


def _forgotten(status: str | None, error: str | None, log_text: str,
               heartbeat_age_s: float | None) -> Verdict:
    """A job the scheduler no longer knows (its controller restarted without its state, or
    forgot the ended job before anyone asked): what its own trace says, else LOST."""
    if status == RunStatus.COMPLETED:
        return Verdict(JobState.COMPLETED, f"from its trace ({_FORGOTTEN})")
    if status == RunStatus.SUSPECT:
        return Verdict(JobState.COMPLETED, error or "suspect measurement")
    if status == RunStatus.OOM:
        return Verdict(JobState.OOM, error or first_error_line(log_text) or "out of memory")
    if status == RunStatus.FAILED:
        return Verdict(JobState.FAILED, failure_reason(log_text, error) or "trace status failed")
    if status == RunStatus.TIMEOUT:
        # flm bench writes "timeout" on any SIGTERM: a time limit, a cancel, or a controller
        # that killed a job it did not know; only the lost record could have told them apart.
        return Verdict(JobState.LOST, f"{_FORGOTTEN}; its trace says it was stopped by a signal")
    beat = (f"; last heartbeat {heartbeat_age_s:.0f} s ago" if heartbeat_age_s is not None
            else "; it left no trace")
    return Verdict(JobState.LOST, _FORGOTTEN + beat)
