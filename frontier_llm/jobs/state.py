"""Job state in the project database (the store's flm_sweeps and flm_jobs tables).

A job row moves RENDERED -> SUBMITTING -> PENDING -> RUNNING -> a terminal verdict (the states
are :class:`frontier_llm.jobs.lifecycle.JobState`, stored as their words). SUBMITTING
is written (and committed) before sbatch runs, with a token that also goes into the job's SLURM
comment: a command that dies between sbatch and the database finds its submission again by that
token instead of submitting the job twice. Every write is one short transaction, so a crashed
or repeated command resumes from what is recorded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import and_, bindparam, select, update
from sqlalchemy.dialects import postgresql, sqlite

from frontier_llm.errors import UserError
from frontier_llm.jobs.lifecycle import JobState
from frontier_llm.jobs.sweepdir import Manifest
from frontier_llm.store import Store
from frontier_llm.store.schema import flm_attempts, flm_jobs, flm_layouts, flm_sweeps

_JOB_FIELDS = ("job_key", "state", "reason", "exit_code", "nodelist", "scheduler_job_id",
               "array_index", "script_path", "executor", "attempts", "run_id", "submitted_at",
               "started_at", "finished_at", "updated_at", "layout_id")


def now() -> datetime:
    return datetime.now(UTC)


def _insert(store: Store, table):
    return (postgresql if store.dialect == "postgresql" else sqlite).insert(table)


class SweepJobs:
    """The rows of one sweep."""

    def __init__(self, store: Store, sweep_id: int, name: str, directory: str) -> None:
        self.store = store
        self.sweep_id = sweep_id
        self.name = name
        self.directory = directory

    # --- sweeps -----------------------------------------------------------------------------
    @classmethod
    def open(cls, store: Store, manifest: Manifest, spec_yaml: str) -> SweepJobs:
        """The sweep's rows, created on first use; a sweep of the same name rendered from a
        different file or into a different folder is refused (its jobs would be confused)."""
        directory = str(manifest.directory)
        with store.write() as conn:
            conn.execute(_insert(store, flm_sweeps).values(
                name=manifest.sweep, spec_yaml=spec_yaml, directory=directory,
                created_at=now()).on_conflict_do_nothing(index_elements=["name"]))
            row = conn.execute(select(flm_sweeps).where(
                flm_sweeps.c.name == manifest.sweep)).mappings().one()
            if row["directory"] != directory:
                raise UserError(
                    f"sweep {manifest.sweep} is recorded in the database with folder "
                    f"{row['directory']}; use --out {row['directory']} or rename the sweep")
            if row["spec_yaml"] != spec_yaml:
                raise UserError(
                    f"sweep {manifest.sweep} was submitted from a different sweep file; give "
                    "the changed sweep a new name (its jobs would otherwise mix)")
            state = cls(store, row["id"], manifest.sweep, directory)
            state._add_jobs(conn, manifest)
        return state

    @classmethod
    def find(cls, store: Store, name: str) -> SweepJobs:
        with store.read() as conn:
            row = conn.execute(select(flm_sweeps).where(
                flm_sweeps.c.name == name)).mappings().first()
        if row is None:
            raise UserError(f"no sweep named {name!r} in {store.url_redacted} (submit it first)")
        return cls(store, row["id"], name, row["directory"])

    def _add_jobs(self, conn, manifest: Manifest) -> None:
        rows = [{
            "sweep_id": self.sweep_id, "job_key": j["key"], "script_path": j["script"],
            "executor": manifest.data["executor"], "array_index": j["index"],
            "state": JobState.RENDERED, "attempts": 0, "updated_at": now(),
        } for j in manifest.jobs]
        if rows:
            conn.execute(_insert(self.store, flm_jobs).on_conflict_do_nothing(
                index_elements=["sweep_id", "job_key"]), rows)

    # --- reads ------------------------------------------------------------------------------
    def rows(self, keys: Iterable[str] | None = None) -> list[dict[str, Any]]:
        query = select(*(flm_jobs.c[f] for f in _JOB_FIELDS)).where(
            flm_jobs.c.sweep_id == self.sweep_id).order_by(flm_jobs.c.id)
        if keys is not None:
            query = query.where(flm_jobs.c.job_key.in_(list(keys)))
        with self.store.read() as conn:
            return [dict(r) for r in conn.execute(query).mappings()]

    def earlier_attempts(self) -> dict[str, list[dict[str, Any]]]:
        """Each job's ended attempts before its current one, oldest first."""
        query = select(flm_attempts).where(flm_attempts.c.sweep_id == self.sweep_id).order_by(
            flm_attempts.c.job_key, flm_attempts.c.attempt)
        out: dict[str, list[dict[str, Any]]] = {}
        with self.store.read() as conn:
            for r in conn.execute(query).mappings():
                out.setdefault(r["job_key"], []).append(dict(r))
        return out

    # --- writes -----------------------------------------------------------------------------
    def archive(self, attempts: list[dict[str, Any]]) -> None:
        """Keep ended attempts (dicts of flm_attempts' columns, with job_key and attempt) before
        their job's row moves on to a new one; an attempt already kept is left as it is."""
        if not attempts:
            return
        rows = [{"sweep_id": self.sweep_id, **a} for a in attempts]
        with self.store.write() as conn:
            conn.execute(_insert(self.store, flm_attempts).on_conflict_do_nothing(
                index_elements=["sweep_id", "job_key", "attempt"]), rows)


    def mark_submitting(self, keys: list[str], token: str, executor: str) -> None:
        """Record the intent before sbatch: reason holds the token SLURM's comment will carry."""
        self._update_many([{"k": k, "state": JobState.SUBMITTING, "reason": f"token {token}",
                            "executor": executor} for k in keys])

    def mark_submitted(self, submitted: Mapping[str, tuple[str, int | None, str | None]],
                       state: JobState = JobState.PENDING) -> None:
        """``submitted`` maps key -> (scheduler id, array index, run id); attempts + 1."""
        if not submitted:
            return
        t = now()
        stmt = (update(flm_jobs)
                .where(and_(flm_jobs.c.sweep_id == self.sweep_id,
                            flm_jobs.c.job_key == bindparam("k")))
                .values(state=state, scheduler_job_id=bindparam("sid"),
                        array_index=bindparam("idx"), run_id=bindparam("rid"), reason=None,
                        exit_code=None, nodelist=None, started_at=None, finished_at=None,
                        submitted_at=t, updated_at=t, attempts=flm_jobs.c.attempts + 1))
        with self.store.write() as conn:
            conn.execute(stmt, [{"k": k, "sid": sid, "idx": idx, "rid": rid}
                                for k, (sid, idx, rid) in submitted.items()])

    def revert_submitting(self, keys: list[str], reason: str) -> None:
        """sbatch refused: nothing was submitted, so the rows go back to RENDERED."""
        self._update_many([{"k": k, "state": JobState.RENDERED, "reason": reason} for k in keys])

    def record(self, updates: list[dict[str, Any]]) -> None:
        """Write observed states: each dict has "k" (job key) and the columns that changed."""
        groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
        for u in updates:
            groups.setdefault(tuple(sorted(c for c in u if c != "k")), []).append(u)
        for batch in groups.values():
            self._update_many(batch)

    def link_layouts(self, key_to_hash: Mapping[str, str]) -> None:
        """Point jobs at their flm_layouts row once the collector has made it."""
        if not key_to_hash:
            return
        with self.store.write() as conn:
            ids = dict(conn.execute(select(flm_layouts.c.layout_hash, flm_layouts.c.id).where(
                flm_layouts.c.layout_hash.in_(sorted(set(key_to_hash.values()))))).all())
            params = [{"k": k, "lid": ids[h]} for k, h in key_to_hash.items() if h in ids]
            if params:
                conn.execute(update(flm_jobs).where(and_(
                    flm_jobs.c.sweep_id == self.sweep_id, flm_jobs.c.job_key == bindparam("k"),
                    flm_jobs.c.layout_id.is_(None))).values(layout_id=bindparam("lid")), params)

    def _update_many(self, items: list[dict[str, Any]]) -> None:
        if not items:
            return
        fields = sorted(c for c in items[0] if c != "k")
        stmt = (update(flm_jobs)
                .where(and_(flm_jobs.c.sweep_id == self.sweep_id,
                            flm_jobs.c.job_key == bindparam("k")))
                .values(updated_at=now(), **{f: bindparam(f"v_{f}") for f in fields}))
        with self.store.write() as conn:
            conn.execute(stmt, [{"k": i["k"], **{f"v_{f}": i[f] for f in fields}}
                                for i in items])
