"""The results database: schema, trace ingestion, queries that return DataFrames.

    from frontier_llm.store import open_store
    store = open_store(None)          # --db, else $FLM_DB, else sqlite:///flm.db here
    store.engine, store.url_redacted

SQLite (the default) and PostgreSQL are both first-class. SQLite runs in WAL mode with a long
busy timeout, and write transactions begin with ``BEGIN IMMEDIATE`` so two writers queue for the
lock instead of failing half-way when one upgrades a read lock.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, OperationalError

from frontier_llm.errors import UserError
from frontier_llm.store import migrate
from frontier_llm.store.url import parse_url, redact, redact_text, resolve_url, url_password

__all__ = ["SCHEMA_VERSION", "Store", "connect", "open_existing", "open_store", "redact",
           "resolve_url"]

# The schema version this frontier_llm uses (the newest Alembic revision).
SCHEMA_VERSION = migrate.head_version()

# Seconds a SQLite writer waits for another's lock before "database is locked".
SQLITE_BUSY_TIMEOUT_S = 60.0


class Store:
    """An open results database. ``url_redacted`` and ``repr`` are safe to print (SQLAlchemy's
    own URL repr masks the password too); the password is kept only to scrub it from driver
    error messages."""

    def __init__(self, engine: Engine, url_redacted: str) -> None:
        self.engine = engine
        self.url_redacted = url_redacted
        self._password: str | None = None

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def __repr__(self) -> str:
        return f"Store({self.url_redacted!r})"

    @contextlib.contextmanager
    def write(self) -> Iterator[Connection]:
        """One write transaction (BEGIN IMMEDIATE on SQLite); commits on success."""
        with self.engine.connect() as conn:
            conn.execution_options(flm_begin="IMMEDIATE")
            with conn.begin():
                yield conn

    @contextlib.contextmanager
    def read(self) -> Iterator[Connection]:
        with self.engine.connect() as conn, conn.begin():
            yield conn

    def schema_version(self) -> int | None:
        with self.read() as conn:
            return migrate.stored_version(conn)

    def upgrade(self) -> list[int]:
        """Bring an older database to this frontier_llm's schema; returns the versions run."""
        with self.write() as conn:
            return migrate.upgrade(conn)

    def size_bytes(self) -> int:
        """Bytes the database takes on disk (SQLite file + WAL, or pg_database_size)."""
        if self.dialect == "sqlite":
            path = self.engine.url.database
            if not path or path == ":memory:":
                return 0
            return sum(os.path.getsize(p) for p in (path, f"{path}-wal") if os.path.exists(p))
        with self.read() as conn:
            return int(conn.exec_driver_sql(
                "SELECT pg_database_size(current_database())").scalar_one())

    def close(self) -> None:
        self.engine.dispose()


def _enable_wal(cur: sqlite3.Cursor) -> None:
    """WAL mode, so readers do not block the collector. The mode is stored in the file; once set,
    this is a read. Switching needs an exclusive lock and SQLite answers "database is locked" at
    once, without its busy handler, while another connection (a second collector creating the
    same new database) holds one, so wait for it here."""
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_S
    while True:
        try:
            if cur.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _sqlite_engine(url: str, read_only: bool = False) -> Engine:
    engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record) -> None:
        # Let SQLAlchemy (the "begin" hook below) emit BEGIN instead of pysqlite, which
        # otherwise defers it and never begins a transaction around DDL.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA foreign_keys=ON")
        if engine.url.database not in (None, "", ":memory:") and not read_only:
            _enable_wal(cur)
            cur.execute("PRAGMA synchronous=NORMAL")  # durable at each WAL checkpoint
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        mode = conn.get_execution_options().get("flm_begin", "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")

    return engine


def _connect_error(url_redacted: str, password: str | None, exc: Exception) -> UserError:
    orig = getattr(exc, "orig", None) or exc
    detail = (str(orig).strip().splitlines() or ["unknown error"])[0]
    if password:
        detail = detail.replace(password, "***")
    return UserError(f"cannot open database {url_redacted}: {redact_text(detail)}")


def read_only_file(db: str) -> bool:
    """Whether the SQLite file ``db`` exists and this user cannot write it (or its folder,
    where SQLite keeps the journal): such a database can still be read, opened read-only."""
    path = Path(db)
    return path.is_file() and not (os.access(path, os.W_OK) and os.access(path.parent, os.W_OK))


def _read_only_url(db: str) -> str:
    """A SQLite URI that opens ``db`` read-only (https://sqlite.org/uri.html: ``mode=ro``).
    ``immutable=1`` as well: a WAL database needs its ``-shm`` file, which a read-only folder
    cannot hold, and an immutable open does without (it takes no locks: a writer's
    concurrent changes may be missed, which a listing can live with)."""
    return f"sqlite:///file:{quote(db)}?mode=ro&immutable=1&uri=true"


def connect(url: str | None = None) -> Store:
    """A Store on ``url`` without looking at or creating its schema (see :func:`open_store`).
    A SQLite file this user cannot write is opened read-only: it can be listed, and a write
    fails in one line."""
    full = resolve_url(url)
    parsed = parse_url(full)
    shown = redact(parsed)
    if parsed.get_backend_name() == "sqlite":
        db = parsed.database
        if db and db != ":memory:" and not Path(db).parent.is_dir():
            raise UserError(
                f"cannot open database {shown}: folder {Path(db).parent} does not exist")
        if db and db != ":memory:" and read_only_file(db):
            engine = _sqlite_engine(_read_only_url(db), read_only=True)
        else:
            engine = _sqlite_engine(full)
    elif parsed.get_backend_name() == "postgresql":
        engine = create_engine(full)
    else:
        raise UserError(
            f"--db: unsupported database {parsed.get_backend_name()!r} in {shown} "
            "(use sqlite:///PATH or postgresql://...)"
        )
    store = Store(engine, shown)
    store._password = url_password(parsed)  # only to scrub it from driver messages
    return store


def open_existing(url: str | None = None, *, check: bool = True) -> Store:
    """Open a database that a read expects to exist: a missing SQLite file is a mistake (wrong
    directory, no --db), not an empty result, and a read must not create it. ``check``: as
    :func:`open_store`'s."""
    parsed = make_url(resolve_url(url))
    if parsed.get_backend_name() == "sqlite" and parsed.database \
            and parsed.database != ":memory:" and not Path(parsed.database).exists():
        raise UserError(f"no database at {parsed.database}: run 'flm collect DIR' first, or pass "
                        "--db URL (or set $FLM_DB)")
    return open_store(url, check=check)


def open_store(url: str | None = None, *, check: bool = True) -> Store:
    """Open (and on first use create) the database at ``url`` (see :func:`resolve_url`).

    A database at an older schema version is refused with the command that upgrades it
    (``flm db upgrade``, i.e. :meth:`Store.upgrade`); a newer one is refused too. ``check=False``
    opens any version without changing it (for ``flm db version`` and ``flm db upgrade``).
    """
    store = connect(url)
    created = _new_sqlite_file(store)
    try:
        with store.read() as conn:
            version = migrate.stored_version(conn)
            if version is not None and check:
                migrate.check(conn, store.url_redacted)
        if version is None:
            # A new database: lock, re-check and create; another process may have created the
            # tables since the read above.
            store.upgrade()
    except (OperationalError, DBAPIError) as exc:
        store.close()
        _remove_empty(created)
        raise _connect_error(store.url_redacted, store._password, exc) from None
    except BaseException:
        store.close()
        _remove_empty(created)
        raise
    return store


def _new_sqlite_file(store: Store) -> Path | None:
    """The SQLite file this open is about to create (None: it exists, or no file)."""
    db = store.engine.url.database
    if store.dialect != "sqlite" or not db or db == ":memory:" or db.startswith("file:"):
        return None
    return None if Path(db).exists() else Path(db)


def _remove_empty(created: Path | None) -> None:
    """Remove a database file this open created and left empty (a full disk failed the
    schema's creation): a 0-byte file would make the next command take it for a database."""
    if created is None:
        return
    for path in (created, Path(f"{created}-wal"), Path(f"{created}-shm")):
        with contextlib.suppress(OSError):
            if path.exists() and (path != created or path.stat().st_size == 0):
                path.unlink()
