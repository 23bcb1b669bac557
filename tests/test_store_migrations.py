"""The store's Alembic migrations, on SQLite and a real PostgreSQL: a new database gets exactly
the tables of schema.py, databases made by the hand-written migrations before Alembic upgrade,
and Optuna's alembic_version and ours (flm_alembic_version) live in one database."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text

from frontier_llm.store import SCHEMA_VERSION, migrate, open_store, resolve_url
from frontier_llm.store.schema import metadata

LEGACY = Path(__file__).parent / "data" / "legacy_store"


def _schema_diff(store) -> list:
    """What differs between the database's flm_ tables and schema.py (empty: identical)."""
    with store.read() as conn:
        ctx = MigrationContext.configure(conn, opts={"include_name": migrate.include_name,
                                                     "version_table": migrate.VERSION_TABLE})
        return compare_metadata(ctx, metadata)


def _versions(store) -> tuple[str, str | None]:
    with store.read() as conn:
        ours = conn.exec_driver_sql(f"SELECT version_num FROM {migrate.VERSION_TABLE}").scalar()
        meta = conn.exec_driver_sql(
            "SELECT value FROM flm_meta WHERE key = 'schema_version'").scalar()
    return ours, meta


def _dialect(url: str) -> str:
    return "sqlite" if url.startswith("sqlite") else "postgresql"


def _engine(url: str):
    return create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))


def _load_legacy(url: str, version: int) -> None:
    """Restore a database dumped from frontier_llm before Alembic (tests/data/legacy_store)."""
    sql = (LEGACY / f"v{version}.{_dialect(url)}.sql").read_text()
    engine = _engine(url)
    raw = engine.raw_connection()
    try:
        if _dialect(url) == "sqlite":
            raw.driver_connection.executescript(sql)
        else:
            with raw.cursor() as cur:
                cur.execute(sql)
            raw.commit()
    finally:
        raw.close()
        engine.dispose()


def test_migrations_are_one_line_numbered_by_version():
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(migrate.SCRIPT_DIR))
    script = ScriptDirectory.from_config(cfg)
    assert script.get_heads() == [migrate.revision_id(SCHEMA_VERSION)]
    revs = list(script.walk_revisions())
    assert [r.revision for r in reversed(revs)] == [
        migrate.revision_id(v) for v in range(1, SCHEMA_VERSION + 1)]
    assert all(r.down_revision == (migrate.revision_id(int(r.revision) - 1)
                                   if r.revision != "0001" else None) for r in revs)


def test_new_database_is_exactly_schema_py(db_url):
    store = open_store(db_url)
    try:
        assert _schema_diff(store) == []
        # flm_meta's pre-Alembic row stops at 3 (revision 0003), whatever the head is.
        assert _versions(store) == (migrate.revision_id(SCHEMA_VERSION), "3")
        with store.read() as conn:
            assert "alembic_version" not in inspect(conn).get_table_names()
    finally:
        store.close()


@pytest.mark.parametrize("legacy", [1, 2])
def test_database_from_before_alembic_upgrades(db_url, legacy):
    _load_legacy(db_url, legacy)
    with pytest.raises(migrate.SchemaVersionError,
                       match=f"schema version {legacy}, older than this frontier_llm's "
                             f"{SCHEMA_VERSION}: run 'flm db upgrade"):
        open_store(db_url)
    store = open_store(db_url, check=False)
    try:
        assert store.schema_version() == legacy
        assert store.upgrade() == list(range(legacy + 1, SCHEMA_VERSION + 1))
        assert store.upgrade() == []
        assert _schema_diff(store) == []
        # flm_meta keeps a version an older frontier_llm refuses as newer than its own (2).
        assert _versions(store) == (migrate.revision_id(SCHEMA_VERSION), "3")
        with store.read() as conn:
            runs = conn.execute(text("SELECT run_id FROM flm_runs")).scalars().all()
        assert runs == (["legacy-run"] if legacy == 2 else [])
    finally:
        store.close()
    open_store(db_url).close()  # current now: opens without complaint


@pytest.mark.parametrize("optuna_first", [True, False], ids=["optuna-first", "flm-first"])
def test_optuna_and_flm_upgrade_side_by_side(db_url, optuna_first):
    """Optuna's storage upgrade and ours, in one database, in either order, each keeps its
    own version table. Starts from a pre-Alembic flm database to cover the stamping too."""
    _load_legacy(db_url, 1)
    url = db_url.replace("postgresql://", "postgresql+psycopg://", 1)

    def run_optuna() -> None:
        storage = optuna.storages.RDBStorage(url)
        study = optuna.create_study(storage=storage, study_name="side-by-side",
                                    load_if_exists=True)
        study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
        storage.upgrade()  # Optuna's own Alembic, on alembic_version
        assert storage.get_current_version() == storage.get_head_version()
        storage.remove_session()
        storage.engine.dispose()

    def run_flm() -> None:
        store = open_store(db_url, check=False)
        try:
            store.upgrade()
            assert _schema_diff(store) == []
        finally:
            store.close()

    for step in ((run_optuna, run_flm) if optuna_first else (run_flm, run_optuna)):
        step()
    engine = _engine(db_url)
    with engine.connect() as conn:
        names = set(inspect(conn).get_table_names())
        optuna_rev = conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar()
        ours = conn.exec_driver_sql(f"SELECT version_num FROM {migrate.VERSION_TABLE}").scalar()
    engine.dispose()
    assert {"studies", "trials", "alembic_version", migrate.VERSION_TABLE, "flm_runs"} <= names
    assert ours == migrate.revision_id(SCHEMA_VERSION)
    assert not optuna_rev.startswith("0")  # Optuna's revision id, untouched by ours
    assert len(optuna.load_study(study_name="side-by-side", storage=url).trials) == 1
    open_store(db_url).close()


def test_damaged_version_rows_are_named(tmp_path):
    url = f"sqlite:///{tmp_path / 'flm.db'}"
    _load_legacy(url, 2)
    engine = _engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE flm_meta SET value = '7' WHERE key = 'schema_version'")
    engine.dispose()
    with pytest.raises(migrate.SchemaVersionError, match="flm_alembic_version is missing"):
        open_store(url)


def test_migrations_ship_as_package_data():
    """setup.cfg's package_data names every file Alembic needs from an installed package."""
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(Path(__file__).parents[1] / "setup.cfg")
    patterns = cfg["options.package_data"]["frontier_llm"].split()
    pkg = Path(migrate.__file__).parents[1]
    shipped = {p for pat in patterns for p in pkg.glob(pat)}
    needed = {p for p in migrate.SCRIPT_DIR.rglob("*")
              if p.is_file() and "__pycache__" not in p.parts}
    assert needed and needed <= shipped


def test_a_new_table_is_one_revision_file(tmp_path, monkeypatch):
    """The documented way to add a table (docs/store.md): one file in versions/ with the next
    number. Done on a copy of the migrations, on a database at the current version."""
    import shutil

    url = f"sqlite:///{tmp_path / 'flm.db'}"
    open_store(url).close()
    scripts = tmp_path / "migrations"
    shutil.copytree(migrate.SCRIPT_DIR, scripts, ignore=shutil.ignore_patterns("__pycache__"))
    nxt = migrate.revision_id(SCHEMA_VERSION + 1)
    (scripts / "versions" / f"{nxt}_add_flm_example.py").write_text(f'''"""add flm_example"""
import sqlalchemy as sa
from alembic import op

revision = "{nxt}"
down_revision = "{migrate.revision_id(SCHEMA_VERSION)}"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table("flm_example", sa.Column("id", sa.Integer(), primary_key=True))
''')
    monkeypatch.setattr(migrate, "SCRIPT_DIR", scripts)
    migrate.head_version.cache_clear()
    try:
        assert migrate.head_version() == SCHEMA_VERSION + 1
        with pytest.raises(migrate.SchemaVersionError, match="run 'flm db upgrade"):
            open_store(url)
        store = open_store(url, check=False)
        assert store.upgrade() == [SCHEMA_VERSION + 1]
        with store.read() as conn:
            assert inspect(conn).has_table("flm_example")
        store.close()
    finally:
        monkeypatch.undo()
        migrate.head_version.cache_clear()


def test_jobs_nodes_column_becomes_nodelist_and_keeps_its_values(db_url):
    """Revision 0005 renames flm_jobs.nodes (a SLURM node list) to nodelist, rows kept."""
    engine = create_engine(resolve_url(db_url))
    with engine.begin() as conn:  # a database made by a frontier_llm at version 4
        migrate.upgrade(conn, target=4)
        conn.execute(text("INSERT INTO flm_sweeps (id, name) VALUES (1, 's')"))
        conn.execute(text("INSERT INTO flm_jobs (sweep_id, job_key, state, nodes, attempts) "
                          "VALUES (1, 'k', 'COMPLETED', 'frontier[00001-00004]', 1)"))
    engine.dispose()
    store = open_store(db_url, check=False)
    assert store.upgrade() == list(range(5, SCHEMA_VERSION + 1))
    with store.read() as conn:
        assert conn.execute(text("SELECT nodelist FROM flm_jobs")).scalar() == (
            "frontier[00001-00004]")
        assert "nodes" not in {c["name"] for c in inspect(conn).get_columns("flm_jobs")}
    assert _schema_diff(store) == []
    store.close()
