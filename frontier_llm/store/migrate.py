"""Schema version and migrations of the flm_ tables.

Why not Alembic: Optuna already keeps its own ``alembic_version`` table in the same database, and
the flm_ tables are few and change rarely. A short ordered list of Python functions, keyed by the
version each one produces and recorded in ``flm_meta.schema_version``, does the job with no
second migration environment to configure.

The rules:

- A new database runs every migration in order, so it is built by the same code that upgrades
  an old one.
- Migration 1 creates the tables as :mod:`frontier_llm.store.schema` defines them now (without
  the indexes of later versions). A later migration that adds a column must therefore check
  that it is missing before it adds it; each one inspects before it changes.
- An older database is not upgraded silently on open: other machines may still run an older
  frontier_llm against it, so ``flm db upgrade`` is an explicit step, and every other command
  says to run it.
- A newer database is refused, naming both versions: an older frontier_llm would misread it.

All of it runs in one transaction holding a schema lock, so two collectors that start on an
empty database at once do not both create the tables.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Connection, inspect, select
from sqlalchemy.schema import CreateTable

from frontier_llm.errors import UserError
from frontier_llm.store import schema
from frontier_llm.store.calibration_tables import migrate_v3

VERSION_KEY = "schema_version"

# Postgres advisory-lock key for schema changes ("FLM" in ASCII).
_PG_LOCK_KEY = 0x464C4D


def _v1_create_tables(conn: Connection) -> None:
    existing = set(inspect(conn).get_table_names())
    for table in schema.TABLES:
        if table.name not in existing:
            conn.execute(CreateTable(table))


def _v2_query_indexes(conn: Connection) -> None:
    insp = inspect(conn)
    for index in schema.INDEXES_V2:
        names = {ix["name"] for ix in insp.get_indexes(index.table.name)}
        if index.name not in names:
            index.create(conn)


# (version produced, what it does, function). Append only; never edit a released entry.
MIGRATIONS: tuple[tuple[int, str, Callable[[Connection], None]], ...] = (
    (1, "create the flm_ tables", _v1_create_tables),
    (2, "indexes on flm_runs(sweep_name), flm_runs(layout_id), flm_jobs(state)",
     _v2_query_indexes),
    (3, "flm_calibrations, flm_calibration_samples (store/calibration_tables.py)", migrate_v3),
)

assert [v for v, _, _ in MIGRATIONS] == list(range(1, schema.SCHEMA_VERSION + 1))


class SchemaVersionError(UserError):
    """The database's schema version is not the one this frontier_llm uses."""


def stored_version(conn: Connection) -> int | None:
    """The database's schema version; None for a database without flm_ tables (a new one)."""
    if not inspect(conn).has_table(schema.flm_meta.name):
        return None
    value = conn.execute(
        select(schema.flm_meta.c.value).where(schema.flm_meta.c.key == VERSION_KEY)
    ).scalar_one_or_none()
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise SchemaVersionError(
            f"flm_meta.schema_version is {value!r}, not a number: the database is damaged"
        ) from None


def lock_schema(conn: Connection) -> None:
    """Serialize schema checks and changes between processes, for this transaction."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_PG_LOCK_KEY})")
    # SQLite: the store begins schema transactions with BEGIN IMMEDIATE, which takes the
    # database's write lock up front; nothing more to do here.


def _set_version(conn: Connection, version: int) -> None:
    meta = schema.flm_meta
    updated = conn.execute(
        meta.update().where(meta.c.key == VERSION_KEY).values(value=str(version))
    ).rowcount
    if not updated:
        conn.execute(meta.insert().values(key=VERSION_KEY, value=str(version)))


def upgrade(conn: Connection, target: int = schema.SCHEMA_VERSION) -> list[int]:
    """Run the migrations after the stored version up to ``target``; returns the ones run.

    Call inside a transaction (the store's ``schema_transaction``) so that a failure leaves the
    database at its old version.
    """
    lock_schema(conn)
    current = stored_version(conn) or 0
    if current > schema.SCHEMA_VERSION:
        raise newer_error(current)
    ran = []
    for version, _, fn in MIGRATIONS:
        if current < version <= target:
            fn(conn)
            _set_version(conn, version)
            ran.append(version)
    return ran


def newer_error(version: int) -> SchemaVersionError:
    return SchemaVersionError(
        f"the database has schema version {version}, newer than this frontier_llm's "
        f"{schema.SCHEMA_VERSION}: upgrade frontier_llm to use it"
    )


def older_error(version: int, url_redacted: str) -> SchemaVersionError:
    return SchemaVersionError(
        f"the database has schema version {version}, older than this frontier_llm's "
        f"{schema.SCHEMA_VERSION}: run 'flm db upgrade --db {url_redacted}' to upgrade it "
        "(older frontier_llm versions will then refuse it)"
    )


def check(conn: Connection, url_redacted: str) -> int | None:
    """Refuse a database whose schema is not current; returns its version (None when new)."""
    version = stored_version(conn)
    if version is None or version == schema.SCHEMA_VERSION:
        return version
    if version > schema.SCHEMA_VERSION:
        raise newer_error(version)
    raise older_error(version, url_redacted)
