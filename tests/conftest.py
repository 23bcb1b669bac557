"""Fixtures shared by several test modules: a real PostgreSQL/SQLite database URL
(``db_url``, ``pg_server``; tests/store_fixtures.py) and a real local SLURM cluster
(``slurm_cluster``; tests/slurm_fixtures.py), and the database of real ``flm bench`` runs the
report tests read (``bench_db``; tests/report_fixtures.py). Defined there, offered to every
module here."""

from report_fixtures import bench_db
from slurm_fixtures import slurm_cluster
from store_fixtures import db_url, pg_server

__all__ = ["bench_db", "db_url", "pg_server", "slurm_cluster"]
