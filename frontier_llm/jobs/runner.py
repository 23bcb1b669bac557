"""The sweep commands' logic: submit, refresh (status), cancel, retry, over an executor and the
job rows in the database. The CLI (frontier_llm/cli/sweep.py) is a thin layer over this."""

from __future__ import annotations

import os
import stat
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from frontier_llm.errors import UserError
from frontier_llm.jobs import secrets, site_policy
from frontier_llm.jobs.classify import classify, heartbeat_age, load_trace
from frontier_llm.jobs.contract import TOKEN_FILE, restart_of
from frontier_llm.jobs.contract import run_id as make_run_id
from frontier_llm.jobs.executors import Executor, Submission, make_executor
from frontier_llm.jobs.lifecycle import JobState, Observation, SchedulerState
from frontier_llm.jobs.slurm import ControllerUnreachable, SlurmClient, SlurmError, base_id
from frontier_llm.jobs.state import SweepJobs
from frontier_llm.jobs.sweepdir import (
    Manifest,
    load_manifest,
    render_sweep,
    sweep_lock,
    with_resources,
)
from frontier_llm.jobs.sweepspec import Sweep, load_sweep
from frontier_llm.store import Store

DEFAULT_HUNG_AFTER_S = 1800.0
# How long status, cancel and retry keep asking a controller that does not answer (slurmctld
# restarting, failing over, overloaded) before they give up; --wait keeps asking until its own
# --timeout. A restart takes seconds to minutes; a longer outage is an incident to report.
DEFAULT_OUTAGE_LIMIT_S = 600.0


@dataclass
class Session:
    manifest: Manifest
    state: SweepJobs
    executor: Executor
    hung_after_s: float | None = DEFAULT_HUNG_AFTER_S
    # Told the sweep's rows whenever a submission or an observation is recorded, and after
    # every poll of wait(): the CLI draws its progress bar from them.
    watch: Callable[[list[dict[str, Any]]], None] | None = None
    # Told one line when the controller stops answering and when it answers again.
    say: Callable[[str], None] | None = None
    outage_limit_s: float = DEFAULT_OUTAGE_LIMIT_S
    # Since when the scheduler has not answered (None: it answered the last query), and what
    # its client said.
    unreachable_since: datetime | None = None
    unreachable_said: str | None = None

    def notify(self, rows: list[dict[str, Any]] | None = None) -> None:
        if self.watch is not None:
            self.watch(self.state.rows() if rows is None else rows)

    def tell(self, line: str) -> None:
        if self.say is not None:
            self.say(line)

    @property
    def outage(self) -> str | None:
        """``controller unreachable since <time>`` while the scheduler does not answer."""
        if self.unreachable_since is None:
            return None
        return (f"controller unreachable since {_stamp(self.unreachable_since)} "
                f"({self.unreachable_said})")


def _stamp(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def default_out(name: str) -> Path:
    return Path("runs") / name


def prepare(sweep: Sweep, out: str | Path | None, store: Store,
            client: SlurmClient | None = None, executor: str | None = None,
            allow_overtime: bool = False, allow_oom: bool = False) -> Session:
    """Render ``sweep`` into its folder and open (or create) its rows in the database.
    A pass_env variable missing from the jobs' environment stops it before anything is
    written."""
    chosen = make_executor(executor or sweep.spec.executor, client)
    require_passed(sweep.spec.environment.pass_env or (), chosen)
    manifest = render_sweep(sweep, out or default_out(sweep.name), allow_overtime, allow_oom)
    state = SweepJobs.open(store, manifest, sweep.text)
    return Session(manifest, state, chosen)


def require_passed(names: Sequence[str], executor: Executor) -> None:
    """Refuse (one line, no value) when a pass_env variable would not reach ``executor``'s
    jobs: missing from the environment they start from, or kept back by $SBATCH_EXPORT."""
    secrets.require_passed(names, executor.job_environ(), slurm=executor.name == "slurm")


def resolve(target: str, out: str | None, store: Store, client: SlurmClient | None = None
            ) -> Session:
    """A submitted sweep named by its file, its folder or its name."""
    path = Path(target)
    if out:
        manifest = load_manifest(out)
    elif path.is_dir():
        manifest = load_manifest(path)
    elif path.suffix in (".yaml", ".yml") and path.is_file():
        name = load_sweep(path).name
        manifest = load_manifest(SweepJobs.find(store, name).directory)
    else:
        manifest = load_manifest(SweepJobs.find(store, target).directory)
    state = SweepJobs.find(store, manifest.sweep)
    return Session(manifest, state, make_executor(manifest.data["executor"], client))


class _Recorder:
    """Writes what an executor reports, as it reports it."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def submitted(self, jobs: Mapping[str, Submission], state: JobState) -> None:
        self.session.state.mark_submitted(jobs, state=state)
        self.session.notify()

    def observed(self, jobs: Mapping[str, Observation]) -> None:
        rows = {r["job_key"]: r for r in self.session.state.rows(list(jobs))}
        self.session.state.record([_verdict_update(self.session, rows[k], o)
                                   for k, o in jobs.items() if k in rows])
        self.session.notify()


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text).astimezone()
    except ValueError:
        return None


# How much of a job's log the classifier reads: its last lines say how it ended.
LOG_TAIL_BYTES = 200_000


def tail_text(path: Path, limit: int) -> str:
    """The last ``limit`` bytes of a regular file as text ("" when it is not one), read from
    the end: a poll of a sweep whose jobs write 300 MB logs reads 200 KB of each, not all."""
    try:
        # O_NONBLOCK: a FIFO planted at a log's name must not hang the poll.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return ""
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return ""
        fh.seek(max(0, info.st_size - limit))
        return fh.read(limit).decode(errors="replace")


def _verdict_update(session: Session, row: Mapping[str, Any], obs: Observation
                    ) -> dict[str, Any]:
    manifest = session.manifest
    trace, problem = load_trace(manifest.trace_dir, row.get("run_id"))
    log = session.executor.log_path(manifest, row)
    log_text = tail_text(log, LOG_TAIL_BYTES) if log is not None else ""
    started = _parse_time(obs.start)
    running_for = None
    if started is not None and obs.state == SchedulerState.RUNNING:
        running_for = (datetime.now().astimezone() - started).total_seconds()
    verdict = classify(
        obs, trace=trace, trace_problem=problem, log_text=log_text,
        heartbeat_age_s=heartbeat_age(manifest.trace_dir, row.get("run_id")),
        running_for_s=running_for, hung_after_s=session.hung_after_s,
    )
    update = {"k": row["job_key"], "state": verdict.state, "reason": verdict.reason}
    if obs.exit_code is not None:
        update["exit_code"] = obs.exit_code
    if obs.nodelist:
        update["nodelist"] = obs.nodelist
    if started is not None:
        update["started_at"] = started
    if verdict.terminal:
        update["finished_at"] = _parse_time(obs.end) or datetime.now().astimezone()
    return update


def _resume(session: Session) -> int:
    """Adopt submissions a crashed command made but did not record; revert the others."""
    stuck = [r for r in session.state.rows() if r["state"] == JobState.SUBMITTING]
    if not stuck:
        return 0
    tokens = {(r["reason"] or "").removeprefix("token ") for r in stuck}
    keys = {r["job_key"] for r in stuck}
    found: dict[str, Submission] = {}
    for token in tokens:
        if session.executor.name == "slurm":
            # squeue remembers an ended job only MinJobAge seconds (300 by default); the token
            # file a job writes when it starts is there for good.
            found.update(_started_under(session.manifest, token, keys))
        found.update(session.executor.find_submitted(session.manifest, token))
    found = {k: v for k, v in found.items() if k in keys}
    session.state.mark_submitted(found)
    lost = [r["job_key"] for r in stuck if r["job_key"] not in found]
    session.state.revert_submitting(lost, "not found in the queue after an interrupted submit")
    return len(found)


def _started_under(manifest: Manifest, token: str, keys: set[str]) -> dict[str, Submission]:
    """Jobs of ``keys`` that started under submit ``token``, from the token files they wrote
    beside their traces (contract.TOKEN_FILE): key -> (scheduler id, array index, run id)."""
    found: dict[str, Submission] = {}
    for path in Path(manifest.trace_dir).glob(f"*{TOKEN_FILE}"):
        try:
            if path.read_text().strip() != token:
                continue
        except OSError:
            continue
        run = path.name[: -len(TOKEN_FILE)]
        for key in keys:
            job = run[len(key) + 2:].split("-r")[0] if run.startswith(f"{key}-j") else ""
            if job.isdigit() and restart_of(run, key, job) is not None:
                index = manifest.job(key)["index"]
                found[key] = (f"{job}_{index}", index, make_run_id(key, job))
    return found


def submit(session: Session, keys: Iterable[str] | None = None, *,
           max_in_flight: int | None = None, hold: bool = False) -> dict[str, int]:
    """Submit every job not yet submitted (or ``keys``); returns counts for the summary.
    One command at a time per sweep folder (sweepdir.sweep_lock): another submit of the same
    sweep is refused until this one ends."""
    with sweep_lock(session.manifest.directory):
        return _submit(session, keys, max_in_flight=max_in_flight, hold=hold)


def _submit(session: Session, keys: Iterable[str] | None, *, max_in_flight: int | None,
            hold: bool) -> dict[str, int]:
    adopted = _resume(session)
    rows = session.state.rows()
    wanted = set(keys) if keys is not None else None
    todo = [r["job_key"] for r in rows if r["state"] == JobState.RENDERED
            and (wanted is None or r["job_key"] in wanted)]
    if not todo:
        return {"submitted": 0, "adopted": adopted, "already": len(rows)}
    # Every submit (retry, a study's trials too) checks: the jobs read the values at start.
    require_passed(session.manifest.pass_env, session.executor)
    _check_queue_room(session, todo)
    token = uuid.uuid4().hex[:12]
    session.state.mark_submitting(todo, token, session.executor.name)
    try:
        session.executor.submit(session.manifest, todo, _Recorder(session), token=token,
                                max_in_flight=max_in_flight, hold=hold)
    except ControllerUnreachable:
        # sbatch may or may not have reached the queue: the rows stay SUBMITTING with their
        # token, and the next submit adopts what the queue holds under it (_resume).
        raise
    except SlurmError as exc:
        # Nothing of a refused sbatch reached the queue: those rows are not submitted.
        left = [r["job_key"] for r in session.state.rows(todo)
                if r["state"] == JobState.SUBMITTING]
        session.state.revert_submitting(left, f"sbatch refused: {exc}")
        raise
    return {"submitted": len(todo), "adopted": adopted, "already": len(rows) - len(todo)}


def _check_queue_room(session: Session, todo: Sequence[str]) -> None:
    """The site's per-user queue limit, against the jobs the user has queued now (any sweep's,
    any tool's): sbatch would reject the excess at submit time, part of an array included."""
    limit = session.manifest.data.get("queue_limit")
    client = getattr(session.executor, "client", None)
    if not limit or session.executor.name != "slurm" or client is None:
        return
    tasks = {(session.manifest.job(k)["group"], session.manifest.job(k)["index"]) for k in todo}
    site_policy.check_queue_room(limit, client.queued_count(), len(tasks))


def refresh(session: Session, *, ride_out: bool = False) -> list[dict[str, Any]]:
    """Observe every live job once (one batched query) and record the verdicts.

    A controller that does not answer changes nothing recorded: the outage is noted on the
    session (``session.outage``) and the rows come back as they were. With ``ride_out`` the
    query is repeated with back-off (1 s, x1.5, up to 15 s) until the controller answers or
    ``session.outage_limit_s`` of outage have passed.
    """
    import time

    interval = 1.0
    while True:
        rows = _refresh_once(session)
        if session.unreachable_since is None or not ride_out:
            return rows
        waited = (datetime.now(UTC) - session.unreachable_since).total_seconds()
        if waited >= session.outage_limit_s:
            return rows
        time.sleep(min(interval, session.outage_limit_s - waited))
        interval = min(15.0, interval * 1.5)


def _refresh_once(session: Session) -> list[dict[str, Any]]:
    rows = session.state.rows()
    live = [r for r in rows if JobState(r["state"]).active and r.get("scheduler_job_id")]
    if live:
        asked = datetime.now(UTC)  # a client may wait long before it says it got no answer
        try:
            seen = session.executor.observe(session.manifest, live)
            by_key = _follow_requeues(session, {r["job_key"]: r for r in live}, seen)
        except ControllerUnreachable as exc:
            if session.unreachable_since is None:
                session.unreachable_since = asked
                session.unreachable_said = str(exc)
                session.tell(f"flm: {session.outage}; still tracking, states as last seen")
            return rows
        if session.unreachable_since is not None:
            gone = (datetime.now(UTC) - session.unreachable_since).total_seconds()
            session.tell(f"flm: controller answers again after {gone:.0f} s unreachable")
            session.unreachable_since = session.unreachable_said = None
        session.state.record([_verdict_update(session, by_key[k], o) for k, o in seen.items()])
        rows = session.state.rows()
    if _relook_lost(session, rows):
        rows = session.state.rows()
    if link_layouts(session, rows):
        rows = session.state.rows()
    return rows


def _attempt_record(session: Session, row: Mapping[str, Any], state: str, reason: str | None,
                    obs: Observation | None = None) -> dict[str, Any]:
    """An ended attempt as flm_attempts keeps it."""
    log = session.executor.log_path(session.manifest, row)
    return {
        "job_key": row["job_key"], "attempt": row["attempts"],
        "scheduler_job_id": row.get("scheduler_job_id"), "run_id": row.get("run_id"),
        "state": str(state), "reason": reason,
        "exit_code": obs.exit_code if obs else row.get("exit_code"),
        "nodelist": (obs.nodelist if obs else None) or row.get("nodelist"),
        "started_at": _parse_time(obs.start) if obs else row.get("started_at"),
        "finished_at": _parse_time(obs.end) if obs else row.get("finished_at"),
        "log_path": str(log) if log is not None else None,
    }


def _follow_requeues(session: Session, rows: dict[str, dict[str, Any]],
                     seen: Mapping[str, Observation]) -> dict[str, dict[str, Any]]:
    """Jobs the scheduler requeued since the last look (same job id, a higher restart count)
    start a new attempt: each ended one is kept in flm_attempts with its own verdict (NODE_FAIL,
    PREEMPTED, ...), judged by its own run id's trace and log, and the job's row moves on to
    the new run id, so the new attempt is never judged by an old attempt's heartbeat."""
    moved: dict[str, tuple[int, int, str]] = {}
    for key, obs in seen.items():
        row = rows.get(key)
        sid = row.get("scheduler_job_id") if row else None
        if not obs.restarts or not sid or not row.get("run_id"):
            continue
        job = base_id(sid)
        current = restart_of(row["run_id"], key, job)
        if current is not None and obs.restarts > current:
            moved[key] = (current, obs.restarts, job)
    if not moved:
        return rows
    history = session.executor.ended_attempts([rows[k] for k in moved])
    kept, updates = [], []
    for key, (current, now_at, job) in moved.items():
        row, runs = rows[key], history.get(key, [])
        for restart in range(current, now_at):
            old = {**row, "run_id": make_run_id(key, job, restart),
                   "attempts": row["attempts"] + restart - current}
            obs = runs[restart] if restart < len(runs) else None
            if obs is None:
                kept.append(_attempt_record(session, old, JobState.LOST,
                                            "requeued by the scheduler; no record says why"))
                continue
            verdict = _verdict_update(session, old, obs)
            state, reason = verdict["state"], verdict["reason"]
            if not JobState(state).terminal:  # the record a requeue leaves (scontrol requeue)
                state, reason = JobState.CANCELLED, f"requeued ({obs.said})"
            kept.append(_attempt_record(session, old, state, reason, obs))
        updates.append({"k": key, "run_id": make_run_id(key, job, now_at),
                        "attempts": row["attempts"] + now_at - current, "reason": None,
                        "exit_code": None, "started_at": None, "finished_at": None})
        session.tell(f"flm: {key}: attempt {row['attempts']} ended {kept[-1]['state']}; "
                     f"SLURM requeued it as attempt {updates[-1]['attempts']}")
    session.state.archive(kept)
    session.state.record(updates)
    fresh = {r["job_key"]: r for r in session.state.rows(list(moved))}
    return {**rows, **fresh}


def _relook_lost(session: Session, rows: Sequence[Mapping[str, Any]]) -> int:
    """LOST jobs are judged again from their files (no scheduler call): a trace that turns up
    later (a job that lived on after its controller forgot it) gives its real verdict."""
    gone = Observation(SchedulerState.UNKNOWN, gone=True)
    updates = [u for u in (_verdict_update(session, r, gone) for r in rows
                           if r["state"] == JobState.LOST) if u["state"] != JobState.LOST]
    session.state.record(updates)
    return len(updates)


def link_layouts(session: Session, rows: Sequence[Mapping[str, Any]] | None = None) -> int:
    """Point ended jobs at their layout row (made by the collector); returns how many lacked
    one."""
    rows = session.state.rows() if rows is None else rows
    loose = {r["job_key"]: session.manifest.job(r["job_key"])["layout_hash"] for r in rows
             if r["layout_id"] is None and JobState(r["state"]).terminal}
    session.state.link_layouts(loose)
    return len(loose)


def wait(session: Session, timeout_s: float, *, min_interval_s: float = 1.0,
         max_interval_s: float = 15.0) -> list[dict[str, Any]]:
    """Refresh with back-off until no job is live (HUNG ones count as live) or the timeout."""
    import time

    deadline = time.monotonic() + timeout_s
    interval = min_interval_s
    while True:
        rows = refresh(session)
        session.notify(rows)
        if not unfinished(rows) and session.unreachable_since is None:
            return rows
        if time.monotonic() >= deadline:
            return rows
        if session.unreachable_since is not None:
            down = (datetime.now(UTC) - session.unreachable_since).total_seconds()
            if down >= session.outage_limit_s:
                return rows
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))
        interval = min(max_interval_s, interval * 1.5)


def unfinished(rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The jobs --wait waits for: live ones (HUNG included) and those caught inside sbatch."""
    return [r for r in rows
            if JobState(r["state"]).active or r["state"] == JobState.SUBMITTING]


def require_controller(session: Session) -> None:
    """cancel and retry act on what the scheduler says now: not while it does not answer."""
    if session.unreachable_since is not None:
        raise ControllerUnreachable(
            f"{session.outage}; gave up after {session.outage_limit_s:g} s (--outage-limit); "
            "nothing was changed")


def cancel(session: Session, keys: Sequence[str] | None = None, *, hung_only: bool = False
           ) -> int:
    rows = refresh(session, ride_out=True)
    require_controller(session)
    targets = [r for r in rows if (JobState(r["state"]).active or r["state"] == JobState.LOST)
               and r.get("scheduler_job_id") and (keys is None or r["job_key"] in keys)
               and (not hung_only or r["state"] == JobState.HUNG)]
    session.executor.cancel([r for r in targets if r["state"] != JobState.LOST])
    # The scheduler has no record of a LOST job: nothing to scancel, but the user's word ends it.
    # A pending job that was scancelled never starts: it is CANCELLED now, whatever the
    # scheduler remembers of it later (SLURM may forget a cancelled pending array task at once).
    ended = [r for r in targets if session.executor.name == "local"
             or r["state"] in (JobState.LOST, JobState.PENDING)]
    session.state.record([{"k": r["job_key"], "state": JobState.CANCELLED,
                           "reason": "cancelled by flm sweep cancel"
                           + ("" if r["state"] != JobState.LOST else
                              " (the scheduler had no record of it)")} for r in ended])
    return len(targets)


def retry(session: Session, *, failed_only: bool, max_in_flight: int | None = None,
          hold: bool = False) -> dict[str, int]:
    """Resubmit ended jobs: those that did not complete (``failed_only``) or all of them.
    Under the sweep folder's submit lock from the first read of the rows on."""
    require_passed(session.manifest.pass_env, session.executor)  # before any row changes
    with sweep_lock(session.manifest.directory):
        return _retry(session, failed_only=failed_only, max_in_flight=max_in_flight, hold=hold)


def _retry(session: Session, *, failed_only: bool, max_in_flight: int | None,
           hold: bool) -> dict[str, int]:
    rows = refresh(session, ride_out=True)
    require_controller(session)
    hung = [r for r in rows if r["state"] == JobState.HUNG]
    if hung:
        session.executor.cancel(hung)

    def pick(state: JobState) -> bool:
        return state.retryable if failed_only else state.terminal or state == JobState.HUNG

    keys = [r["job_key"] for r in rows if pick(JobState(r["state"]))]
    if not keys:
        return {"submitted": 0, "adopted": 0, "already": len(rows)}
    # The attempt that ended keeps its verdict, log and run id; the job's row moves on.
    session.state.archive([_attempt_record(session, r, r["state"], r["reason"]) for r in rows
                           if r["job_key"] in keys and r.get("scheduler_job_id")])
    session.state.record([{"k": k, "state": JobState.RENDERED, "reason": None} for k in keys])
    return submit(session, keys, max_in_flight=max_in_flight, hold=hold)


def summary(rows: Sequence[Mapping[str, Any]]) -> str:
    counts = Counter(r["state"] for r in rows)
    J = JobState
    order = [J.COMPLETED, J.RUNNING, J.PENDING, J.HUNG, J.OOM, J.TIMEOUT, J.NODE_FAIL,
             J.PREEMPTED, J.CANCELLED, J.FAILED, J.LOST, J.SUBMITTING, J.RENDERED, J.UNKNOWN]
    parts = [f"{counts[s]} {s}" for s in order if counts.get(s)]
    parts += [f"{c} {s}" for s, c in counts.items() if s not in order]
    return f"{len(rows)} jobs: " + ", ".join(parts)


def sweep_with_overrides(path: str, **overrides: str | None) -> Sweep:
    sweep = load_sweep(path)
    return with_resources(sweep, **overrides)


def unknown_keys(manifest: Manifest, keys: Iterable[str]) -> list[str]:
    known = {j["key"] for j in manifest.jobs}
    return [k for k in keys if k not in known]


def require_keys(manifest: Manifest, keys: Iterable[str] | None) -> list[str] | None:
    if keys is None:
        return None
    keys = list(keys)
    bad = unknown_keys(manifest, keys)
    if bad:
        raise UserError(f"no job {bad[0]!r} in sweep {manifest.sweep}")
    return keys
