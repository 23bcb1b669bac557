"""What became of a job: one verdict from the scheduler's state, the exit code, the log, the
trace and the heartbeat.

Terminal verdicts: COMPLETED (with a valid trace), OOM, TIMEOUT, NODE_FAIL, CANCELLED, FAILED
(with the first error line). HUNG is a verdict on a live job whose heartbeat has not moved for
``hung_after_s`` (the job is still in the queue; ``flm sweep cancel --hung`` ends it).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frontier_llm.bench.trace import TraceError, heartbeat_path, read_trace, trace_path

COMPLETED, OOM, TIMEOUT, NODE_FAIL, CANCELLED, FAILED, HUNG = (
    "COMPLETED", "OOM", "TIMEOUT", "NODE_FAIL", "CANCELLED", "FAILED", "HUNG")
PENDING, RUNNING, UNKNOWN, RENDERED = "PENDING", "RUNNING", "UNKNOWN", "RENDERED"
TERMINAL = frozenset({COMPLETED, OOM, TIMEOUT, NODE_FAIL, CANCELLED, FAILED})
# Verdicts `flm sweep retry --failed-only` resubmits (a completed job is never re-run).
RETRYABLE = frozenset({OOM, TIMEOUT, NODE_FAIL, CANCELLED, FAILED, HUNG})

EXIT_OOM = 3  # flm bench's exit status for an out-of-memory run
_ACTIVE = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SUSPENDED",
           "RESV_DEL_HOLD", "STOPPED"}
_RUNNING = {"RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT", "RESIZING"}
_ERROR_LINE = re.compile(
    r"(^[\w.]*(Error|Exception|Interrupt)\b[^:]*:|\berror\b|\bfatal\b|\bkilled\b|\bcrash"
    r"|\babort|segmentation fault|core dumped|out of memory)", re.IGNORECASE)


@dataclass(frozen=True)
class Verdict:
    state: str
    reason: str | None = None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL


def first_error_line(text: str) -> str | None:
    """The first line of ``text`` that says something went wrong (in log order, so the root
    cause on one rank comes before the other ranks' reports of a lost peer)."""
    for line in text.splitlines():
        ln = line.strip()
        if not ln:
            continue
        # The job script's own banner names the job key, which may be any word.
        if ln.startswith(("Traceback", "flm: task ")):
            continue
        if _ERROR_LINE.search(ln):
            return ln[:500]
    return None


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
    scheduler_state: str,
    exit_code: str | int | None = None,
    *,
    trace: dict[str, Any] | None = None,
    trace_problem: str | None = None,
    log_text: str = "",
    heartbeat_age_s: float | None = None,
    running_for_s: float | None = None,
    hung_after_s: float | None = None,
) -> Verdict:
    """One verdict. ``scheduler_state`` is SLURM's word (or the local executor's)."""
    state = (scheduler_state or UNKNOWN).split()[0].upper()
    code, sig = exit_status(exit_code)
    status = trace.get("status") if trace else None
    error = (trace.get("error") or None) if trace else None

    if state in _ACTIVE:
        return Verdict(PENDING)
    if state in _RUNNING:
        if hung_after_s is not None:
            quiet = heartbeat_age_s if heartbeat_age_s is not None else running_for_s
            if quiet is not None and quiet > hung_after_s:
                what = "heartbeat" if heartbeat_age_s is not None else "first heartbeat"
                return Verdict(HUNG, f"no {what} for {quiet:.0f} s (limit {hung_after_s:.0f} s)")
        return Verdict(RUNNING)

    # The run's own account of an out-of-memory beats the scheduler's generic FAILED.
    if status == "oom" or state == "OUT_OF_MEMORY" or code == EXIT_OOM:
        return Verdict(OOM, error or first_error_line(log_text) or "out of memory")
    if state in ("TIMEOUT", "DEADLINE"):
        return Verdict(TIMEOUT, "time limit reached")
    if state in ("NODE_FAIL", "BOOT_FAIL"):
        return Verdict(NODE_FAIL, f"SLURM state {state}")
    # Before the trace's "timeout": flm bench writes that on any SIGTERM, and scancel sends one
    # too, so only the scheduler knows whether the job was cancelled or ran out of time.
    if state in ("CANCELLED", "REVOKED", "PREEMPTED"):
        if "DUE TO TIME LIMIT" in log_text:
            return Verdict(TIMEOUT, "time limit reached")
        return Verdict(CANCELLED, f"SLURM state {state}")
    if status == "timeout":
        return Verdict(TIMEOUT, "time limit reached")
    if state == "COMPLETED" or (state == "EXITED" and (
            code == 0 or (code is None and status in ("completed", "suspect")))):
        if status == "completed":
            return Verdict(COMPLETED)
        if status == "suspect":  # ran to the end; the trace says why its figures are doubtful
            return Verdict(COMPLETED, error or "suspect measurement")
        if status in ("failed", None) and trace is not None:
            return Verdict(FAILED, error or "trace status failed")
        return Verdict(FAILED, f"exit 0 but {trace_problem or 'no valid trace'}")
    if state in ("FAILED", "EXITED", "SPECIAL_EXIT"):
        reason = first_error_line(log_text) or error
        if not reason:
            reason = f"exit code {code}" if code else (f"signal {sig}" if sig else "failed")
        return Verdict(FAILED, reason)
    return Verdict(UNKNOWN, f"scheduler state {scheduler_state!r}")
