"""One study, one driver at a time: a lock held for a whole ``flm tune step``.

Optuna writes through its own connections, so the lock cannot be a write transaction of ours (it
would block Optuna's writes until SQLite's busy timeout). SQLite: an ``flock`` on a file beside
the database (a SQLite database is a local file, so every process that can open it can lock
it). PostgreSQL: a session advisory lock on a connection of its own. Both are released by the
operating system or the server when the holder dies, so a SIGKILLed driver never leaves a stale
lock behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import sys
from collections.abc import Iterator

from sqlalchemy import text

from frontier_llm.store import Store


def _key(name: str) -> int:
    """A signed 64-bit advisory-lock key for the study."""
    digest = hashlib.sha256(f"flm-tune:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


@contextlib.contextmanager
def study_lock(store: Store, name: str) -> Iterator[None]:
    if store.dialect == "postgresql":
        with store.engine.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _key(name)})
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _key(name)})
                conn.commit()
        return
    db = store.engine.url.database
    if not db or db == ":memory:":
        yield
        return
    # One file per lock name: flock locks belong to the open file, so two names on one file
    # would block each other even inside one process.
    fd = os.open(f"{db}.flm-tune-{_key(name) & 0xFFFFFFFF:08x}.lock", os.O_RDWR | os.O_CREAT,
                 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            # Another step of this study holds it, maybe for as long as its trials run: say
            # so at once instead of waiting in silence.
            print(f"flm: waiting for another flm tune step of study {name!r} to finish "
                  "(it holds the study's lock)", file=sys.stderr, flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
