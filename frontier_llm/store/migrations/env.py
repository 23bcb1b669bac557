"""Alembic's environment for the flm_ tables.

frontier_llm runs it through :func:`frontier_llm.store.migrate.upgrade`, which hands it the
store's connection, already inside the schema transaction and holding the schema lock; the
alembic command line (see alembic.ini here) opens ``-x db=URL`` or ``$FLM_DB`` instead.

The version lives in ``flm_alembic_version``, not Alembic's default ``alembic_version``, which
Optuna uses for its own tables in the same database. Only ``flm_`` tables are ours: Optuna's
are left out of autogenerate's comparison.
"""

from alembic import context

from frontier_llm.store import migrate, schema


def _run(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=schema.metadata,
        version_table=migrate.VERSION_TABLE,
        include_name=migrate.include_name,
        # Autogenerate drafts column changes as batch operations: SQLite alters a table by
        # copying it, and on PostgreSQL a batch is plain ALTER TABLE statements.
        render_as_batch=True,
    )
    # Inside the store's transaction this begins nothing and commits nothing (Alembic sees the
    # external transaction); from the command line it is the migration's own transaction.
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("frontier_llm migrations run online only (no --sql)")

_conn = context.config.attributes.get("connection")
if _conn is not None:
    _run(_conn)
else:
    from frontier_llm.store import connect

    _store = connect(context.get_x_argument(as_dictionary=True).get("db"))
    try:
        with _store.write() as conn:
            migrate.lock_schema(conn)
            _run(conn)
    finally:
        _store.close()
