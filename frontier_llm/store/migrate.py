"""Schema version and migrations of the flm_ tables, run by Alembic.

The revisions are files in ``store/migrations/versions/`` (shipped as package data), one per
schema version, named by their number: revision ``0004`` is schema version 4. History is one
line (no branches), so the version is a number users can compare. Alembic records it in
``flm_alembic_version``: Optuna keeps its own ``alembic_version`` table in the same database, and
Alembic's ``version_table`` option keeps the two apart.

The rules:

- A new database runs every revision in order, so it is built by the same code that upgrades
  an old one. A revision writes its tables out as they are at that version, never from
  ``schema.py``.
- An older database is not upgraded silently on open: other machines may still run an older
  frontier_llm against it, so ``flm db upgrade`` is an explicit step, and every other command
  says to run it.
- A newer database is refused, naming both versions: an older frontier_llm would misread it.
- A database made before Alembic (``flm_meta.schema_version`` 1 or 2, no
  ``flm_alembic_version``) is stamped at that revision (revisions 1 and 2 build exactly what the
  hand-written migrations 1 and 2 built) and upgraded from there. Revision 3 sets
  ``flm_meta.schema_version`` to 3 for good, so an older frontier_llm refuses the database.

All of it runs in one transaction holding a schema lock, so two collectors that start on an
empty database at once do not both create the tables.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, inspect, select

from frontier_llm.errors import UserError
from frontier_llm.store import schema

if TYPE_CHECKING:
    from alembic.config import Config

VERSION_TABLE = "flm_alembic_version"
SCRIPT_DIR = Path(__file__).with_name("migrations")
LEGACY_KEY = "schema_version"  # flm_meta's row that held the version before Alembic
LEGACY_VERSIONS = (1, 2)

# Postgres advisory-lock key for schema changes ("FLM" in ASCII).
_PG_LOCK_KEY = 0x464C4D


class SchemaVersionError(UserError):
    """The database's schema version is not the one this frontier_llm uses."""


def revision_id(version: int) -> str:
    return f"{version:04d}"


def include_name(name: str | None, type_: str, _parent: dict) -> bool:
    """Only flm_ tables are ours (Optuna's share the database); for autogenerate."""
    return type_ != "table" or (name or "").startswith("flm_")


def _config(conn: Connection | None = None) -> Config:
    # Alembic loads only when a schema changes: opening a current database needs none of it.
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(SCRIPT_DIR))
    if conn is not None:
        cfg.attributes["connection"] = conn
    return cfg


@lru_cache(maxsize=1)
def head_version() -> int:
    """The schema version this frontier_llm uses: the newest revision's number, read from the
    file names (``NNNN_what.py``) so that opening a store does not load Alembic.
    ``tests/test_store_migrations.py`` checks against Alembic that the revisions are one line
    whose ids are these numbers."""
    return max(int(p.name[:4]) for p in (SCRIPT_DIR / "versions").glob("[0-9][0-9][0-9][0-9]_*.py"))


def _number(value: str, where: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise SchemaVersionError(
            f"{where} is {value!r}, not a number: the database is damaged") from None


def _alembic_version(conn: Connection) -> int | None:
    if not inspect(conn).has_table(VERSION_TABLE):
        return None
    value = conn.exec_driver_sql(f"SELECT version_num FROM {VERSION_TABLE}").scalar_one_or_none()
    return None if value is None else _number(value, f"{VERSION_TABLE}.version_num")


def _legacy_version(conn: Connection) -> int | None:
    if not inspect(conn).has_table(schema.flm_meta.name):
        return None
    value = conn.execute(
        select(schema.flm_meta.c.value).where(schema.flm_meta.c.key == LEGACY_KEY)
    ).scalar_one_or_none()
    return None if value is None else _number(value, "flm_meta.schema_version")


def stored_version(conn: Connection) -> int | None:
    """The database's schema version; None for a database without flm_ tables (a new one)."""
    version = _alembic_version(conn)
    if version is not None:
        return version
    legacy = _legacy_version(conn)
    if legacy is not None and legacy not in LEGACY_VERSIONS:
        raise SchemaVersionError(
            f"flm_meta.schema_version is {legacy} but {VERSION_TABLE} is missing: "
            "the database is damaged")
    return legacy


def lock_schema(conn: Connection) -> None:
    """Serialize schema checks and changes between processes, for this transaction."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_PG_LOCK_KEY})")
    # SQLite: the store begins schema transactions with BEGIN IMMEDIATE, which takes the
    # database's write lock up front; nothing more to do here.


def upgrade(conn: Connection, target: int | None = None) -> list[int]:
    """Run the revisions after the stored version up to ``target`` (default: the newest);
    returns the versions run.

    Call inside a transaction (the store's ``schema_transaction``) so that a failure leaves the
    database at its old version.
    """
    lock_schema(conn)
    head = head_version()
    target = head if target is None else target
    current = stored_version(conn) or 0
    if current > head:
        raise newer_error(current)
    if current >= target:
        return []
    from alembic import command

    cfg = _config(conn)
    if current and _alembic_version(conn) is None:
        # Made by the hand-written migrations: its tables are what revision `current` builds.
        command.stamp(cfg, revision_id(current))
    command.upgrade(cfg, revision_id(target))
    return list(range(current + 1, target + 1))


def newer_error(version: int) -> SchemaVersionError:
    return SchemaVersionError(
        f"the database has schema version {version}, newer than this frontier_llm's "
        f"{head_version()}: upgrade frontier_llm to use it"
    )


def older_error(version: int, url_redacted: str) -> SchemaVersionError:
    return SchemaVersionError(
        f"the database has schema version {version}, older than this frontier_llm's "
        f"{head_version()}: run 'flm db upgrade --db {url_redacted}' to upgrade it "
        "(older frontier_llm versions will then refuse it)"
    )


def check(conn: Connection, url_redacted: str) -> int | None:
    """Refuse a database whose schema is not current; returns its version (None when new)."""
    version = stored_version(conn)
    head = head_version()
    if version is None or version == head:
        return version
    if version > head:
        raise newer_error(version)
    raise older_error(version, url_redacted)
