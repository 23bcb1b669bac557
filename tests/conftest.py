"""Fixtures shared by several test modules: a real PostgreSQL/SQLite database URL
(``db_url``, ``pg_server``; tests/store_fixtures.py) and a real local SLURM cluster
(``slurm_cluster``; tests/slurm_fixtures.py). Defined there, offered to every module here."""

from slurm_fixtures import slurm_cluster
from store_fixtures import db_url, pg_server

__all__ = ["db_url", "pg_server", "slurm_cluster"]
