"""``flm collect``: ingest trace files into the store.

Properties the rest of the system relies on:

- Idempotent. A run is keyed by its ``run_id``; ``trace_digest`` (sha256 of the file's bytes)
  says whether the file changed since it was stored. Equal digest: nothing is written. A new
  digest (a trace rewritten with more steps): the run row is updated and its steps and per-rank
  memory rows are replaced.
- One transaction per batch of files: a crash loses at most the batch in flight, and a re-run
  picks it up (nothing is marked "done" outside the database).
- Bad files do not stop the rest: a file that is not JSON, breaks the trace schema, holds a
  value the database cannot store (an integer beyond 64 bits, NaN, a lone surrogate, a date out
  of range, nesting too deep), is larger than ``MAX_TRACE_BYTES``, or claims a ``run_id``
  already stored from another file moves to a quarantine folder (``<DIR>/quarantine/`` by
  default) beside ``<file>.reason.txt``. Only regular files are read (a FIFO or a device named
  ``*.trace.json`` is skipped with a warning: reading it would hang or never end), and only
  regular files inside the collected folder are moved (a symlink stays, and so does its target).
- Two collectors at once neither duplicate nor lose rows. Every write is an upsert
  (``INSERT ... ON CONFLICT``) on a unique key, so the database decides who inserts a row; the
  run upsert only touches a row whose digest differs and returns the rows it wrote, and only
  those get their steps written. Rows are written in key order so PostgreSQL writers take row
  locks in one order (no deadlock cycles); SQLite writers queue on ``BEGIN IMMEDIATE`` with a
  long busy timeout, and a "database is locked" (or a PostgreSQL deadlock / serialization
  failure) retries the whole batch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import random
import sqlite3
import stat
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Table, bindparam, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, OperationalError, StatementError

from frontier_llm.bench.trace import TRACE_SUFFIX, TraceError
from frontier_llm.errors import UserError
from frontier_llm.specs import plausible
from frontier_llm.specs.axes import RANK_FIELDS
from frontier_llm.specs.identity import layout_hash
from frontier_llm.specs.layout import Layout, Sharding
from frontier_llm.specs.model import ModelSpec
from frontier_llm.store import SQLITE_BUSY_TIMEOUT_S, Store
from frontier_llm.store.schema import (
    LAYOUT_COLUMNS,
    flm_layouts,
    flm_predictions,
    flm_rank_memory,
    flm_runs,
    flm_steps,
)
from frontier_llm.store.schema_check import validate_trace_fast

QUARANTINE_DIR = "quarantine"
# The largest trace file read (docs/store.md): a trace of 100,000 steps is about 10 MB.
MAX_TRACE_BYTES = 64 * 2**20
# What a database column holds: a signed 64-bit integer (SQLite INTEGER, PostgreSQL BIGINT).
_INT_MIN, _INT_MAX = -(2**63), 2**63 - 1
REASON_SUFFIX = ".reason.txt"
DEFAULT_BATCH = 500
# The most a trace's labels may hold, as JSON: a sweep's labels are a few words each.
MAX_LABELS_BYTES = 64 * 1024
MAX_ATTEMPTS = 8

_PREDICTION_COLUMNS = ("step_time_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu",
                       "peak_memory_bytes", "fits")
_SUMMARY_COLUMNS = ("steps_measured", "step_time_s", "tokens_per_s", "model_tflops_per_gpu",
                    "hardware_tflops_per_gpu", "mfu", "hfu", "peak_memory_bytes")
_MEMORY_COLUMNS = (*RANK_FIELDS, "params_bytes", "grads_bytes",
                   "optimizer_bytes", "activations_peak_bytes", "device_allocated_peak_bytes",
                   "device_reserved_peak_bytes", "host_rss_peak_bytes")
# The layout's columns copied as the trace holds them (the sharding is turned into its text).
_LAYOUT_COLUMNS = tuple(c for c in LAYOUT_COLUMNS if c not in ("sharding", "zero_stage"))
_LAYOUT_DEFAULTS = Layout().to_dict()


@dataclass
class IngestReport:
    """What one ``collect`` did. ``quarantined`` holds (new path, reason) pairs."""

    seen: int = 0
    inserted: int = 0
    updated: int = 0
    unchanged: int = 0
    vanished: int = 0  # listed, then gone before reading (moved by another collector)
    # Parsed and sent to the database, which already held them: another collector stored the
    # same file in the meantime (counted in ``unchanged`` too).
    contended: int = 0
    quarantined: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    batches: int = 0
    retries: int = 0
    waited: bool = False  # found the database's write lock held by another program
    seconds: float = 0.0

    def summary(self, where: str) -> str:
        """What was stored, in a sentence (``where``: the database, its password hidden)."""
        return (f"collected {self.seen} trace files into {where}: {self.inserted} new, "
                f"{self.updated} updated, {self.unchanged} unchanged, "
                f"{len(self.quarantined)} quarantined ({self.seconds:.2f} s)")

    def as_dict(self) -> dict[str, Any]:
        return {
            "seen": self.seen, "inserted": self.inserted, "updated": self.updated,
            "unchanged": self.unchanged, "vanished": self.vanished,
            "contended": self.contended,
            "quarantined": [{"path": p, "reason": r} for p, r in self.quarantined],
            "warnings": list(self.warnings), "batches": self.batches, "retries": self.retries,
            "seconds": round(self.seconds, 3),
        }


class RowError(ValueError):
    """A trace that passes the JSON schema but cannot be stored (e.g. a step listed twice)."""


# --- finding files ---------------------------------------------------------------------------

def find_traces(dirs: Iterable[str | Path], quarantine: str | Path | None = None,
                ) -> list[tuple[Path, Path]]:
    """``(trace file, the DIR it was found under)`` for every ``*.trace.json`` below ``dirs``,
    in a stable order, skipping quarantine folders."""
    skip = Path(quarantine).resolve() if quarantine else None
    # Keyed by the file's real path (one file reached twice is read once); the path as found is
    # kept, so that a quarantine moves the link that was found, never the file it points to.
    out: dict[Path, tuple[Path, Path]] = {}
    for d in dirs:
        root = Path(d)
        if root.is_file():
            out.setdefault(root.resolve(), (root, root.parent))
            continue
        if not root.is_dir():
            raise UserError(f"collect: {root} is not a folder or a trace file")
        for path in root.rglob(f"*{TRACE_SUFFIX}"):
            rel = path.relative_to(root)
            if QUARANTINE_DIR in rel.parts[:-1] or path.name.startswith("."):
                continue
            real = path.resolve()
            if skip is not None and real.is_relative_to(skip):
                continue
            out.setdefault(real, (path, root))
    return [out[k] for k in sorted(out)]


def quarantine_file(path: Path, root: Path, reason: str, folder: str | Path | None = None,
                    ) -> Path | None:
    """Move ``path`` into the quarantine folder with ``<name>.reason.txt`` beside it.

    Returns the new path, or None when the file was gone (another collector moved it first).
    Raises :class:`NotMoved` for what is not moved: a symbolic link (moving its target would
    take a file out of a folder that was not collected), anything but a regular file, a file
    outside the collected folder ``root``, or a default quarantine folder that is a link.
    """
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(info.st_mode):
        raise NotMoved("a symbolic link: left where it is (its target is not moved)")
    if not stat.S_ISREG(info.st_mode):
        raise NotMoved("not a regular file: left where it is")
    root_real = Path(root).resolve()
    if not Path(path).parent.resolve().is_relative_to(root_real):
        raise NotMoved(f"outside the collected folder {root}: left where it is")
    dest_dir = Path(folder) if folder else Path(root) / QUARANTINE_DIR
    if not folder and dest_dir.is_symlink():
        raise NotMoved(f"{dest_dir} is a symbolic link: nothing moved into it")
    if not os.access(path.parent, os.W_OK):
        # A read-only folder (another user's, a read-only mount): the file cannot leave it, so
        # nothing is copied either (a copy per attempt used to pile up in --quarantine), and
        # the good files beside it are still collected.
        raise NotMoved(f"its folder {path.parent} is not writable: left where it is")
    try:
        dest_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise NotMoved(f"cannot make the quarantine folder {dest_dir} ({exc.strerror}): left "
                       "where it is") from None
    # Where the last file of this name landed in this folder: 3,000 files of one name used to
    # try name, name.1, ... name.k for the k-th (quadratic, 117 s); now each try starts past
    # the last taken suffix, so a collect's quarantines cost linear time.
    slot = (str(dest_dir.resolve()), path.name)
    n = _NEXT_SUFFIX.get(slot, 0)
    while True:
        dest = dest_dir / (path.name if n == 0 else f"{path.name}.{n}")
        try:
            # A hard link fails if dest exists (planted or another collector's): never
            # overwritten, and the file stays whole in one of the two places.
            os.link(path, dest, follow_symlinks=False)
            break
        except FileExistsError:
            n += 1
        except FileNotFoundError:
            return None
        except OSError:  # another file system (--quarantine elsewhere): copy, then remove
            import shutil

            if dest.exists() or dest.is_symlink():
                n += 1
                continue
            shutil.copy2(path, dest, follow_symlinks=False)
            break
    _NEXT_SUFFIX[slot] = n + 1
    try:
        os.unlink(path)
    except FileNotFoundError:
        # Another collector moved it first: its copy stands, ours goes.
        dest.unlink(missing_ok=True)
        return None
    except OSError as exc:
        # Not removable after all: one copy of it, in one place (the original).
        dest.unlink(missing_ok=True)
        raise NotMoved(f"cannot remove it ({exc.strerror}): left where it is") from None
    stamp = datetime.now(UTC).isoformat(timespec="seconds")
    _write_new(Path(f"{dest}{REASON_SUFFIX}"),
               f"{reason}\noriginal path: {path}\nquarantined at: {stamp} by flm collect (pid "
               f"{os.getpid()})\n")
    return dest


# (quarantine folder, file name) -> the next suffix to try (see quarantine_file).
_NEXT_SUFFIX: dict[tuple[str, str], int] = {}


class NotMoved(Exception):
    """A file to quarantine that is left in place, with why."""


def _write_new(path: Path, text: str) -> None:
    """Create ``path`` (never through a link planted there, never over an existing file)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except FileExistsError:
        return
    # backslashreplace: a file name that is not UTF-8 (held as lone surrogates) is written as
    # its escapes; the reason file used to be lost to a UnicodeEncodeError.
    with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as fh:
        fh.write(text)


def read_trace_file(path: Path) -> bytes | None:
    """The bytes of a regular trace file of at most :data:`MAX_TRACE_BYTES`; None for a file
    that is gone. Raises :class:`NotRegular` for a FIFO, device or socket (opened without
    blocking, so a FIFO with no writer does not hang the collector) and :class:`TooLarge`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegular("not a regular file (a FIFO, device or socket): skipped, not read")
        if info.st_size > MAX_TRACE_BYTES:
            raise TooLarge(f"larger than {MAX_TRACE_BYTES // 2**20} MiB "
                           f"({info.st_size} bytes); not read")
        chunks, left = [], MAX_TRACE_BYTES + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        if left <= 0:  # it grew while read
            raise TooLarge(f"larger than {MAX_TRACE_BYTES // 2**20} MiB; not read")
        return b"".join(chunks)
    finally:
        os.close(fd)


class NotRegular(Exception):
    """A ``*.trace.json`` that is not a regular file."""


class TooLarge(Exception):
    """A trace file above :data:`MAX_TRACE_BYTES`."""


# --- turning one trace into rows -------------------------------------------------------------

def storable_path(path: Path) -> str:
    """``path`` as text a database column holds: a name that is not UTF-8 (its bytes held as
    lone surrogates, which no UTF-8 column takes) with those bytes as ``\\xNN`` escapes."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def _utc(text: str | None, field_name: str) -> datetime | None:
    if text is None:
        return None
    try:
        value = datetime.fromisoformat(text)
        # The trace's times are UTC by contract; a time without an offset is read as UTC.
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except (ValueError, OverflowError):
        # OverflowError: 0001-01-01T00:00:00+01:00 is before the first representable UTC time.
        raise RowError(f"{field_name} {text[:40]!r} is not an ISO 8601 time in range") from None


@lru_cache(maxsize=4096)
def _sharding_text(params: str, grads: str, optim: str) -> str:
    try:
        return Sharding.parse({"params": params, "grads": grads, "optim": optim}).describe()
    except UserError as exc:
        raise RowError(f"layout/sharding: {exc}") from None


def _dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


@dataclass
class TraceRows:
    """One trace, flattened into the rows of each table (run and layout rows without ids)."""

    path: Path
    digest: str
    layout: dict
    prediction: dict | None
    run: dict
    steps: list[dict]
    memory: list[dict]


def trace_rows(trace: dict, path: Path, digest: str) -> TraceRows:
    """Flatten a schema-valid trace; RowError for what the schema cannot express."""
    lay = trace["layout"]
    sh = lay["sharding"]
    # A knob added after a trace was written is absent from it: the trace ran at its default.
    layout = {k: lay[k] if k in lay else _LAYOUT_DEFAULTS[k] for k in _LAYOUT_COLUMNS}
    layout.update(
        layout_hash=trace["layout_hash"], model_name=trace["model"]["name"],
        system_name=trace["system"]["name"],
        sharding=_sharding_text(sh["params"], sh["grads"], sh["optim"]),
        zero_stage=lay.get("zero_stage"), model_json=_dumps(trace["model"]),
        layout_json=_dumps(lay),
    )
    pred = trace["prediction"]
    prediction = None
    if pred is not None:
        prediction = {k: pred.get(k) for k in _PREDICTION_COLUMNS}
        if prediction["peak_memory_bytes"] is not None:
            prediction["peak_memory_bytes"] = int(prediction["peak_memory_bytes"])
        prediction.update(costmodel_version=pred["costmodel_version"],
                          breakdown_json=_dumps(pred))
    labels = trace["labels"]
    summary = trace["summary"]
    run = {k: summary.get(k) for k in _SUMMARY_COLUMNS}
    run.update(
        run_id=trace["run_id"], sweep_name=labels.get("sweep"), job_key=labels.get("job_key"),
        status=trace["status"], error=trace["error"], engine=trace["engine"],
        started_at=_utc(trace["started_at"], "started_at"),
        finished_at=_utc(trace["finished_at"], "finished_at"),
        world_size=trace["environment"]["world_size"],
        costmodel_version=pred["costmodel_version"] if pred is not None else None,
        trace_path=storable_path(path), trace_digest=digest, labels_json=_dumps(labels),
        environment_json=_dumps(trace["environment"]),
    )
    steps = [{"step": s["step"], "time_s": s["time_s"], "loss": s["loss"],
              "warmup": s["warmup"]} for s in trace["steps"]]
    if len({s["step"] for s in steps}) != len(steps):
        raise RowError("steps: a step number appears twice")
    # A rank field the trace lacks (cp_rank at cp 1, or in a trace from before cp) is index 0:
    # along that axis the rank's group was itself alone.
    memory = [{"rank": m["rank"], **{k: m.get(k, 0 if k in RANK_FIELDS else None)
                                     for k in _MEMORY_COLUMNS}}
              for m in trace["memory"]]
    if len({m["rank"] for m in memory}) != len(memory):
        raise RowError("memory: a rank appears twice")
    return TraceRows(path, digest, layout, prediction, run, steps, memory)


# --- writing a batch -------------------------------------------------------------------------

def _insert(conn: Connection, table: Table):
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    return dialect.insert(table)


def _layout_ids(conn: Connection, layouts: dict[str, dict]) -> dict[str, int]:
    rows = [layouts[h] for h in sorted(layouts)]
    conn.execute(_insert(conn, flm_layouts).on_conflict_do_nothing(
        index_elements=["layout_hash"]), rows)
    found = conn.execute(
        select(flm_layouts.c.layout_hash, flm_layouts.c.id)
        .where(flm_layouts.c.layout_hash.in_(bindparam("hashes", expanding=True))),
        {"hashes": sorted(layouts)},
    )
    return dict(found.all())


def _write_predictions(conn: Connection, preds: dict[tuple[int, str], dict]) -> None:
    if not preds:
        return
    # A cost-model version's prediction for a layout is deterministic, so the first one stored
    # stays: re-ingesting or rewriting traces never flips it.
    stmt = _insert(conn, flm_predictions).on_conflict_do_nothing(
        index_elements=["layout_id", "costmodel_version"])
    conn.execute(stmt, [preds[k] for k in sorted(preds)])


def _write_runs(conn: Connection, runs: list[dict]
                ) -> tuple[dict[str, int], set[str], dict[str, str]]:
    """Upsert run rows; returns ({run_id: pk} of rows written, run_ids that existed before,
    {run_id: stored trace path} of those refused because another file holds them)."""
    ids = [r["run_id"] for r in runs]
    stored = dict(conn.execute(
        select(flm_runs.c.run_id, flm_runs.c.trace_path)
        .where(flm_runs.c.run_id.in_(bindparam("ids", expanding=True))), {"ids": ids},
    ).all())
    # A run is replaced only by a newer version of its own file (more steps): a trace from
    # another path with the same run_id (a copy edited, a name reused) would silently take
    # the stored run's place.
    conflicts = {r["run_id"]: stored[r["run_id"]] for r in runs
                 if r["run_id"] in stored and stored[r["run_id"]] != r["trace_path"]}
    runs = [r for r in runs if r["run_id"] not in conflicts]
    if not runs:
        return {}, set(stored), conflicts
    stmt = _insert(conn, flm_runs)
    cols = [c.name for c in flm_runs.columns if c.name not in ("id", "run_id")]
    stmt = stmt.on_conflict_do_update(
        index_elements=["run_id"],
        set_={c: stmt.excluded[c] for c in cols},
        # Equal digest: the stored run already is this file; leave it (and report unchanged).
        # Another path (stored meanwhile by another collector): leave it too.
        where=(flm_runs.c.trace_digest != stmt.excluded.trace_digest)
        & (flm_runs.c.trace_path == stmt.excluded.trace_path),
    ).returning(flm_runs.c.run_id, flm_runs.c.id)
    written = dict(conn.execute(stmt, runs).all())
    return written, set(stored), conflicts


def _bulk_insert(conn: Connection, table: Table, rows: list[dict]) -> None:
    """Plain inserts of many rows: COPY on PostgreSQL (psycopg's executemany sends one
    statement per row, 5x slower here), executemany on SQLite (already fast in-process)."""
    if not rows:
        return
    if conn.dialect.name != "postgresql":
        conn.execute(table.insert(), rows)
        return
    cols = [c.name for c in table.columns]
    cursor = conn.connection.driver_connection.cursor()
    names = ", ".join(f'"{c}"' for c in cols)
    with cursor.copy(f'COPY "{table.name}" ({names}) FROM STDIN') as copy:
        for row in rows:
            copy.write_row([row.get(c) for c in cols])


def _write_batch(conn: Connection, rows: list[TraceRows]) -> tuple[int, int, dict[str, str]]:
    """All rows of one batch in the caller's transaction; returns (inserted, updated,
    {run_id: stored path} of the runs refused because another file holds their run_id)."""
    layouts = {r.layout["layout_hash"]: r.layout for r in rows}
    layout_ids = _layout_ids(conn, layouts)
    preds: dict[tuple[int, str], dict] = {}
    runs = []
    for r in sorted(rows, key=lambda r: r.run["run_id"]):
        lid = layout_ids[r.layout["layout_hash"]]
        if r.prediction is not None:
            preds.setdefault((lid, r.prediction["costmodel_version"]),
                             {**r.prediction, "layout_id": lid})
        runs.append({**r.run, "layout_id": lid})
    _write_predictions(conn, preds)
    written, before, conflicts = _write_runs(conn, runs)
    if not written:
        return 0, 0, conflicts
    replaced = [written[i] for i in written if i in before]
    if replaced:
        for table in (flm_steps, flm_rank_memory):
            conn.execute(table.delete().where(
                table.c.run.in_(bindparam("pks", expanding=True))), {"pks": replaced})
    by_id = {r.run["run_id"]: r for r in rows}
    steps = [{**s, "run": pk} for rid, pk in sorted(written.items(), key=lambda kv: kv[1])
             for s in by_id[rid].steps]
    memory = [{**m, "run": pk} for rid, pk in sorted(written.items(), key=lambda kv: kv[1])
              for m in by_id[rid].memory]
    _bulk_insert(conn, flm_steps, steps)
    _bulk_insert(conn, flm_rank_memory, memory)
    return len(written) - len(replaced), len(replaced), conflicts


def _retryable(exc: DBAPIError) -> bool:
    text = str(getattr(exc, "orig", exc)).lower()
    if "database is locked" in text or "database is busy" in text:
        return True
    code = getattr(getattr(exc, "orig", None), "sqlstate", None)
    return code in ("40P01", "40001")  # deadlock_detected, serialization_failure


def write_with_retry(store: Store, rows: list[TraceRows], report: IngestReport
                     ) -> tuple[int, int, dict[str, str]]:
    for attempt in range(1, MAX_ATTEMPTS + 1):
        try:
            with store.write() as conn:
                return _write_batch(conn, rows)
        except (OperationalError, DBAPIError) as exc:
            if attempt == MAX_ATTEMPTS or not _retryable(exc):
                raise
            report.retries += 1
            time.sleep(min(2.0, 0.05 * 2 ** attempt) * random.uniform(0.5, 1.5))
    raise AssertionError("unreachable")


# --- the collector ---------------------------------------------------------------------------

def _known_digests(store: Store, digests: Sequence[str]) -> set[str]:
    if not digests:
        return set()
    with store.read() as conn:
        return set(conn.execute(
            select(flm_runs.c.trace_digest)
            .where(flm_runs.c.trace_digest.in_(bindparam("d", expanding=True))),
            {"d": list(digests)},
        ).scalars())


def _say_on_stderr(line: str) -> None:
    print(f"flm: {line}", file=sys.stderr, flush=True)


def sqlite_write_locked(store: Store) -> bool:
    """Whether another connection holds the SQLite database's write lock right now: a probe
    that takes the lock without waiting (a second connection, ``timeout=0``) and gives it
    back at once. False for PostgreSQL (its writers lock rows, not the database) and for a
    database that is not a file."""
    if store.dialect != "sqlite":
        return False
    db = store.engine.url.database
    if not db or db == ":memory:" or not os.path.isfile(db):
        return False
    try:
        probe = sqlite3.connect(db, timeout=0, isolation_level=None)
    except sqlite3.Error:
        return False
    try:
        probe.execute("BEGIN IMMEDIATE")
        probe.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError as exc:
        return "locked" in str(exc) or "busy" in str(exc)
    finally:
        probe.close()


def collect(store: Store, dirs: Iterable[str | Path], *, quarantine: str | Path | None = None,
            batch_size: int = DEFAULT_BATCH, progress: Callable[[str], None] | None = None,
            advance: Callable[[int, int], None] | None = None,
            notice: Callable[[str], None] = _say_on_stderr) -> IngestReport:
    """Ingest every ``*.trace.json`` below ``dirs``; see the module docstring.

    ``progress`` gets one line per batch; ``advance(files done, files found)`` is called before
    the first batch and after each one (for a progress bar). ``notice`` gets one line, once,
    when the database's write lock is held by another program: SQLite's busy handler waits
    up to a minute per try (and the batch is tried again), which looked like a hang.
    """
    if batch_size < 1:
        raise UserError(f"collect: --batch-size must be at least 1 (got {batch_size})")
    t0 = time.perf_counter()
    report = IngestReport()
    files = find_traces(dirs, quarantine)
    report.seen = len(files)
    nbatches = (len(files) + batch_size - 1) // batch_size
    if advance:
        advance(0, len(files))
    for b in range(nbatches):
        tb = time.perf_counter()
        chunk = files[b * batch_size:(b + 1) * batch_size]
        if not report.waited and sqlite_write_locked(store):
            report.waited = True
            notice(f"waiting for the database {store.url_redacted}: another program holds its "
                   f"write lock (each try waits up to {SQLITE_BUSY_TIMEOUT_S:.0f} s, "
                   f"{MAX_ATTEMPTS} tries)")
        counts = _collect_batch(store, chunk, quarantine, report)
        report.batches += 1
        if progress:
            progress(f"collect: batch {b + 1}/{nbatches}: {len(chunk)} files, "
                     f"{counts[0]} new, {counts[1]} updated, {counts[2]} unchanged, "
                     f"{counts[3]} quarantined ({time.perf_counter() - tb:.2f} s)")
        if advance:
            advance(min(len(files), (b + 1) * batch_size), len(files))
    report.seconds = time.perf_counter() - t0
    return report


def _parse(item: tuple[Path, Path, bytes, str]) -> tuple[TraceRows | None, str]:
    """(rows, "") for a good trace file, (None, reason) for one to quarantine."""
    path, _, data, digest = item
    try:
        try:
            trace = json.loads(data, parse_constant=_no_constant, parse_int=_int64,
                               parse_float=_finite)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise TraceError(f"not valid JSON: {exc}") from None
        except RecursionError:
            raise TraceError("not valid JSON: nested too deeply") from None
        if b"\\ud" in data or b"\\uD" in data:  # an escaped surrogate: is each one paired?
            try:
                json.dumps(trace, ensure_ascii=False).encode("utf-8")
            except UnicodeEncodeError:
                raise RowError("a string holds a lone surrogate (not UTF-8)") from None
        validate_trace_fast(trace)
        why = implausible(trace)
        if why:
            raise RowError(f"implausible measurement: {why}")
        return trace_rows(trace, path.resolve(), digest), ""
    except (TraceError, RowError) as exc:
        return None, str(exc)
    except (ValueError, TypeError, KeyError, OverflowError, RecursionError) as exc:
        # What the schema lets through and the rows still cannot hold: this file's problem,
        # never the batch's.
        return None, f"cannot be stored: {type(exc).__name__}: {str(exc)[:200]}"


def implausible(trace: dict) -> str | None:
    """Why a schema-valid trace cannot be stored as a measurement (specs/plausible.py), or
    None: what no machine does (a step of 1e305 s, a negative memory peak, more TFLOP/s than
    the device's peak), or labels too large to be labels."""
    if len(_dumps(trace.get("labels") or {})) > MAX_LABELS_BYTES:
        return f"labels hold more than {MAX_LABELS_BYTES // 1024} KiB"
    why = _hash_problem(trace)
    if why:
        return why
    layout = trace.get("layout") or {}
    device_bytes, peak = _device(str((trace.get("system") or {}).get("name")),
                                 str(layout.get("dtype", "bf16")))
    return plausible.trace_problem(trace, device_bytes, peak)


def _hash_problem(trace: dict) -> str | None:
    """Why the trace's ``layout_hash`` is not the hash of its own model, system and layout, or
    None. The store files a run under its layout's hash: a hash taken on trust would file a
    run of one model under another's layout (specs/identity.py computes it; a model missing
    fields that flm's writers always write takes their defaults)."""
    model = trace.get("model") or {}
    known = {f.name for f in dataclasses.fields(ModelSpec)}
    try:
        spec = ModelSpec(**{k: v for k, v in model.items() if k in known})
        expected = layout_hash(spec, str((trace.get("system") or {}).get("name")),
                               trace.get("layout") or {})
    except (UserError, TypeError, ValueError):
        return "its model cannot be read back to check its layout_hash"
    if expected != trace.get("layout_hash"):
        return ("its layout_hash is not the hash of its own model, system and layout "
                "(specs/identity.py); it would file the run under another layout")
    return None


@lru_cache(maxsize=64)
def _device(system: str, dtype: str) -> tuple[float | None, float | None]:
    """(memory bytes, peak FLOP/s) of a shipped system of that name, for the plausible
    ranges; (None, None) for another (a trace names its system, which may be anyone's file:
    only the catalog's own names are looked up, never a path)."""
    from frontier_llm.catalog import load_system, system_names

    if system not in system_names():
        return None, None
    spec = load_system(system)
    try:
        peak = spec.peak(dtype)
    except UserError:
        peak = None
    return spec.memory_bytes, peak


def _no_constant(name: str) -> Any:
    raise TraceError(f"not valid JSON: {name} is not a number JSON allows")


def _int64(text: str) -> int:
    """An integer of the trace, refused beyond what a database column holds (64 bits)."""
    value = int(text)
    if not _INT_MIN <= value <= _INT_MAX:
        raise RowError(f"integer {text[:30]} is out of the 64-bit range")
    return value


def _finite(text: str) -> float:
    """A float of the trace, refused when it does not fit one (1e400 would be infinity)."""
    value = float(text)
    if not math.isfinite(value):
        raise RowError(f"number {text[:30]} is out of range")
    return value


def _row_problem(exc: BaseException) -> bool:
    """Whether a write failed for its rows' values (then one row at a time finds the file),
    not for the database (locked, full, read-only: those stop the collector)."""
    if isinstance(exc, IntegrityError | DataError):
        return True
    if isinstance(exc, StatementError) and not isinstance(exc, OperationalError):
        return isinstance(exc.orig, OverflowError | UnicodeError | ValueError | TypeError)
    return isinstance(exc, OverflowError | UnicodeError | ValueError | TypeError)


def _write_rows(store: Store, rows: list[TraceRows], report: IngestReport
                ) -> tuple[int, int, dict[str, str], dict[str, str]]:
    """Write a batch; where it fails for a row's values, write the rows one by one and return
    those that fail with the reason: (inserted, updated, conflicts, {run_id: reason})."""
    try:
        return (*write_with_retry(store, rows, report), {})
    except Exception as exc:
        if not _row_problem(exc):
            raise
    inserted = updated = 0
    conflicts: dict[str, str] = {}
    failed: dict[str, str] = {}
    for row in rows:
        try:
            i, u, c = write_with_retry(store, [row], report)
        except Exception as exc:
            if not _row_problem(exc):
                raise
            failed[row.run["run_id"]] = ("cannot be stored: "
                                         f"{str(getattr(exc, 'orig', exc)).splitlines()[0][:200]}")
            continue
        inserted, updated = inserted + i, updated + u
        conflicts.update(c)
    return inserted, updated, conflicts, failed


def _set_aside(path: Path, root: Path, reason: str, quarantine: str | Path | None,
               report: IngestReport) -> bool:
    """Quarantine one file with its reason; True when it was moved."""
    try:
        dest = quarantine_file(path, root, reason, quarantine)
    except NotMoved as exc:
        report.warnings.append(f"{path}: {reason}; {exc}")
        return False
    if dest is None:
        report.vanished += 1
        return False
    report.quarantined.append((str(dest), reason))
    return True


def _collect_batch(store: Store, chunk: list[tuple[Path, Path]], quarantine: str | Path | None,
                   report: IngestReport) -> tuple[int, int, int, int]:
    raw: list[tuple[Path, Path, bytes, str]] = []
    nquarantined = 0
    for path, root in chunk:
        try:
            data = read_trace_file(path)
        except NotRegular as exc:
            report.warnings.append(f"{path}: {exc}")
            continue
        except TooLarge as exc:
            nquarantined += _set_aside(path, root, str(exc), quarantine, report)
            continue
        except OSError as exc:
            report.warnings.append(f"{path}: cannot be read: {exc.strerror}; skipped")
            continue
        if data is None:
            report.vanished += 1
            continue
        raw.append((path, root, data, hashlib.sha256(data).hexdigest()))
    known = _known_digests(store, sorted({d for *_, d in raw}))
    unchanged = sum(1 for *_, d in raw if d in known)
    rows: dict[str, TraceRows] = {}
    where: dict[str, tuple[Path, Path]] = {}
    todo = [item for item in raw if item[3] not in known]
    for (path, root, _, _), (row, error) in zip(todo, map(_parse, todo), strict=True):
        if row is None:
            nquarantined += _set_aside(path, root, error, quarantine, report)
            continue
        rid = row.run["run_id"]
        if rid in rows:
            report.warnings.append(
                f"run_id {rid} is in two files: {rows[rid].path} and {path}; kept {path}")
            unchanged += 1
        rows[rid] = row
        where[rid] = (path, root)
    inserted = updated = 0
    conflicts: dict[str, str] = {}
    failed: dict[str, str] = {}
    if rows:
        inserted, updated, conflicts, failed = _write_rows(store, list(rows.values()), report)
    for rid, stored in sorted(conflicts.items()):
        path, root = where[rid]
        nquarantined += _set_aside(
            path, root, f"run_id {rid} is already stored from {stored}; not replaced (a run is "
            "updated only from its own file)", quarantine, report)
    for rid, reason in sorted(failed.items()):
        nquarantined += _set_aside(*where[rid], reason, quarantine, report)
    # Rows the database already held with this digest (another collector got there first).
    contended = len(rows) - inserted - updated - len(conflicts) - len(failed)
    report.contended += contended
    unchanged += contended
    report.inserted += inserted
    report.updated += updated
    report.unchanged += unchanged
    return inserted, updated, unchanged, nquarantined
