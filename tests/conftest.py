"""Fixtures shared by several test modules: a real PostgreSQL/SQLite database URL
(``db_url``, ``pg_server``; tests/store_fixtures.py) and a real local SLURM cluster
(``slurm_cluster``; tests/slurm_fixtures.py), the database of real ``flm bench`` runs the
report tests read (``bench_db``; tests/report_fixtures.py), and ``sigint_raises`` for tests
that send SIGINT. Defined there, offered to every module here.

At the end of the session, after the shared servers are stopped, any process the tests started
that is still alive fails the run, named, and is stopped (tests/processes.py). Under
pytest-xdist (scripts/test.sh runs two workers) each worker is such a session, with its own
SLURM cluster and PostgreSQL (their own folders and ports), and tells the controller what it
found; ``--dist loadfile`` keeps a module's tests, and so its module fixtures, on one worker.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest
from processes import end, mark_session, survivors
from report_fixtures import bench_db
from slurm_fixtures import CLUSTER, slurm_cluster
from store_fixtures import POSTGRES, db_url, pg_server

__all__ = ["bench_db", "db_url", "pg_server", "sigint_raises", "slurm_cluster"]

_TOKEN: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    _TOKEN.append(mark_session())


@pytest.fixture
def sigint_raises() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt here, as at an interactive prompt, whatever this process
    inherited: a shell without job control starts a background command with SIGINT ignored,
    and Python then leaves it ignored."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")  # a pytest-xdist worker process


def _is_controller(config: pytest.Config) -> bool:
    # pytest-xdist's controller runs no test: its workers do, each with its own token, servers
    # and end-of-session check (the controller's processes include the workers themselves).
    return not _is_worker(config) and bool(getattr(config.option, "numprocesses", None))


_FROM_WORKERS: list[str] = []


def pytest_testnodedown(node, error) -> None:  # pytest-xdist's hook, in the controller
    _FROM_WORKERS.extend(getattr(node, "workeroutput", {}).get("flm_survivors", []))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # The shared servers are stopped here rather than at interpreter exit, so that what they
    # leave behind (a job step of a forgotten job, say) is seen below.
    CLUSTER.stop()
    POSTGRES.stop()
    if _is_controller(session.config):
        left_text = list(_FROM_WORKERS)
    else:
        left = survivors(_TOKEN[0]) if _TOKEN else []
        end(left)
        left_text = [str(s) for s in left]
        if _is_worker(session.config):
            # Told to the controller, which fails the run: a worker's exit status is not.
            session.config.workeroutput["flm_survivors"] = left_text
            return
    if not left_text:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    title = "processes the tests started, still running at the end (now stopped)"
    if reporter is not None:
        reporter.write_line("")  # after the progress line, which has no end of line yet
        reporter.write_sep("=", title, red=True)
        for s in left_text:
            reporter.write_line(f"  {s}", red=True)
    else:
        print(title, *left_text, sep="\n  ")
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
