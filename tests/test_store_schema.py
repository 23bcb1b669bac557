"""The store's URL handling, schema creation and versioning, on SQLite and a real PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect

from frontier_llm.errors import UserError
from frontier_llm.store import SCHEMA_VERSION, connect, migrate, open_store, resolve_url
from frontier_llm.store.schema import TABLES
from frontier_llm.store.url import redact


def test_url_resolution_order(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FLM_DB", raising=False)
    assert resolve_url(None) == f"sqlite:///{tmp_path / 'flm.db'}"
    monkeypatch.setenv("FLM_DB", "sqlite:////data/env.db")
    assert resolve_url(None) == "sqlite:////data/env.db"
    assert resolve_url("sqlite:////data/explicit.db") == "sqlite:////data/explicit.db"
    # A bare path is a SQLite file; postgresql:// gets the psycopg 3 driver.
    assert resolve_url("runs.db") == f"sqlite:///{tmp_path / 'runs.db'}"
    assert resolve_url("postgresql://u:pw@h/db") == "postgresql+psycopg://u:pw@h/db"


def test_redact_hides_password_everywhere():
    assert redact("postgresql://flm:hunter2@db.example/flm") == (
        "postgresql://flm:***@db.example/flm")
    assert "hunter2" not in redact("postgres ql://flm:hunter2@db/flm")
    with pytest.raises(UserError) as info:
        resolve_url("postgres ql://flm:hunter2@db/flm")
    assert "hunter2" not in str(info.value)


def test_unsupported_database_and_missing_folder(tmp_path):
    with pytest.raises(UserError, match="the database driver 'mysql' is not supported"):
        open_store("mysql://u:secretpw@h/db")
    with pytest.raises(UserError, match="does not exist"):
        open_store(f"sqlite:///{tmp_path}/no/such/dir/flm.db")


def test_new_database_gets_every_table_and_current_version(db_url):
    store = open_store(db_url)
    try:
        with store.read() as conn:
            names = set(inspect(conn).get_table_names())
            indexes = {ix["name"] for ix in inspect(conn).get_indexes("flm_runs")}
        assert {t.name for t in TABLES} <= names
        assert {"ix_flm_runs_sweep_name", "ix_flm_runs_layout_id"} <= indexes
        assert store.schema_version() == SCHEMA_VERSION
    finally:
        store.close()
    # Opening again neither fails nor changes the version.
    store = open_store(db_url)
    assert store.schema_version() == SCHEMA_VERSION
    store.close()


def _make_old_database(url: str, version: int) -> None:
    """A database as an older frontier_llm left it: migrations up to ``version`` only."""
    store = connect(url)
    with store.write() as conn:
        migrate.upgrade(conn, target=version)
    store.close()


def test_older_database_is_refused_until_upgraded(db_url):
    _make_old_database(db_url, 1)
    with pytest.raises(migrate.SchemaVersionError) as info:
        open_store(db_url)
    assert f"schema version 1, older than this frontier_llm's {SCHEMA_VERSION}" in str(info.value)
    assert "flm db upgrade" in str(info.value)

    store = open_store(db_url, check=False)
    with store.read() as conn:
        assert "ix_flm_runs_sweep_name" not in {
            ix["name"] for ix in inspect(conn).get_indexes("flm_runs")}
    assert store.upgrade() == list(range(2, SCHEMA_VERSION + 1))
    assert store.upgrade() == []  # idempotent
    with store.read() as conn:  # revision 0004: the calibration tables
        assert {"flm_calibrations", "flm_calibration_samples"} <= set(
            inspect(conn).get_table_names())
    store.close()
    store = open_store(db_url)
    with store.read() as conn:
        assert "ix_flm_runs_sweep_name" in {
            ix["name"] for ix in inspect(conn).get_indexes("flm_runs")}
    store.close()


def test_newer_database_is_refused_naming_both_versions(db_url):
    store = open_store(db_url)
    with store.write() as conn:
        conn.exec_driver_sql(f"UPDATE {migrate.VERSION_TABLE} "
                             f"SET version_num = '{migrate.revision_id(SCHEMA_VERSION + 5)}'")
    store.close()
    msg = (f"schema version {SCHEMA_VERSION + 5}, newer than this frontier_llm's "
           f"{SCHEMA_VERSION}: upgrade frontier_llm")
    with pytest.raises(migrate.SchemaVersionError, match=msg):
        open_store(db_url)
    store = open_store(db_url, check=False)
    with pytest.raises(migrate.SchemaVersionError, match=msg):
        store.upgrade()  # an older frontier_llm must not "upgrade" a newer database
    store.close()


def test_optuna_tables_live_beside_ours(db_url):
    import optuna

    store = open_store(db_url)
    store.close()
    url = db_url.replace("postgresql://", "postgresql+psycopg://", 1)
    study = optuna.create_study(storage=url, study_name="flm-side-by-side")
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    store = open_store(db_url)  # our schema check ignores Optuna's tables and alembic_version
    with store.read() as conn:
        names = set(inspect(conn).get_table_names())
    assert "studies" in names and "alembic_version" in names and "flm_runs" in names
    store.close()


@pytest.mark.postgres
def test_postgres_password_urls_work_and_never_leak(pg_server):
    good = f"postgresql://postgres:{pg_server.password}@127.0.0.1:{pg_server.port}/flm"
    store = open_store(good)
    assert pg_server.password not in store.url_redacted
    assert pg_server.password not in repr(store)
    assert store.url_redacted.startswith("postgresql+psycopg://postgres:***@127.0.0.1")
    store.close()

    wrong = "Wr0ngPassw0rdXYZ"
    with pytest.raises(UserError) as info:
        open_store(f"postgresql://postgres:{wrong}@127.0.0.1:{pg_server.port}/flm")
    assert "password authentication failed" in str(info.value)
    assert wrong not in str(info.value)
    with pytest.raises(UserError) as info:  # nothing listening there
        open_store(f"postgresql://postgres:{wrong}@127.0.0.1:1/flm")
    assert "cannot open database" in str(info.value) and wrong not in str(info.value)
