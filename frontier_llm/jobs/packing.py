"""Packed allocations (sweep ``pack: N``): several layouts in one SLURM job, one srun step each.

The scheduler sees one job; the tracker keeps one row per layout. So each layout is judged by
its own step — the files the job script leaves beside its trace (contract.STEP_*: when the step
started, its exit status, its output) — and not by the allocation's state, which says only how
the last step (or the whole job) ended. Pure functions of an Observation and those files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from frontier_llm.jobs.contract import STEP_EXIT, STEP_START
from frontier_llm.jobs.lifecycle import Observation, SchedulerState

# Allocation endings that say more about a step that had not finished than its own exit code
# does (the script may write the status of a step killed by scancel or the time limit).
_ALLOCATION_ENDINGS = (SchedulerState.CANCELLED, SchedulerState.TIMEOUT,
                       SchedulerState.NODE_FAIL, SchedulerState.PREEMPTED,
                       SchedulerState.OUT_OF_MEMORY)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _mtime_iso(path: Path) -> str | None:
    try:
        return datetime.fromtimestamp(path.stat().st_mtime, UTC).isoformat()
    except OSError:
        return None


def step_observation(allocation: Observation, trace_dir: str | Path, run_id: str | None
                     ) -> Observation:
    """What became of one layout's step, from its allocation's observation and its files."""
    if run_id is None or allocation.state == SchedulerState.PENDING:
        return allocation
    base = Path(trace_dir) / run_id
    started = _read(base.with_name(base.name + STEP_START))
    status = _read(base.with_name(base.name + STEP_EXIT))
    exit_file = base.with_name(base.name + STEP_EXIT)
    if status is not None and status.lstrip("-").isdigit():
        code = int(status)
        if code != 0 and allocation.state in _ALLOCATION_ENDINGS:
            return allocation
        return Observation(SchedulerState.EXITED, f"{code}:0", nodelist=allocation.nodelist,
                           start=started or allocation.start, end=_mtime_iso(exit_file))
    if started is not None:
        # Running now, or the allocation ended while it ran: the allocation's word, timed from
        # the step's own start (the hung check measures from there).
        return Observation(allocation.state, allocation.exit_code, nodelist=allocation.nodelist,
                           start=started, end=allocation.end, said=allocation.said)
    if allocation.gone:
        return allocation  # forgotten by the scheduler: judged by its files (classify)
    if not allocation.state.ended:
        return Observation(SchedulerState.PENDING, nodelist=allocation.nodelist,
                           said="waiting for the layouts before it in its allocation")
    return Observation(SchedulerState.CANCELLED, nodelist=allocation.nodelist, end=allocation.end,
                       said=f"its allocation ended ({allocation.state}) before this layout's "
                            "step started")


def pack_keys(manifest: Any, group: str, jobs: Sequence[Mapping[str, Any]]) -> str | None:
    """The keys to run when ``jobs`` are only some layouts of the packs they belong to (a
    retry), joined by ":" for the script; None when every layout of those packs runs."""
    chosen = {j["key"] for j in jobs}
    indices = {j["index"] for j in jobs}
    packed = {j["key"] for j in manifest.jobs
              if j["group"] == group and j["index"] in indices and "step" in j}
    if not packed or packed <= chosen:
        return None
    return ":".join(j["key"] for j in jobs)
