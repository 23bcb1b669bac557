"""Which database a command talks to, and how to name it without leaking its password."""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from frontier_llm.errors import UserError

ENV_VAR = "FLM_DB"
DEFAULT_FILE = "flm.db"


def resolve_url(explicit: str | None = None) -> str:
    """``--db`` when given, else ``$FLM_DB``, else ``sqlite:///flm.db`` in the working directory.

    A bare file path is taken as a SQLite file, so ``--db results.db`` does what it looks like.
    ``postgresql://`` is pinned to psycopg 3 (the driver this package depends on); SQLAlchemy
    would otherwise look for psycopg2.
    """
    text = explicit or os.environ.get(ENV_VAR) or ""
    text = text.strip()
    if not text:
        return f"sqlite:///{Path.cwd() / DEFAULT_FILE}"
    if "://" not in text:
        return f"sqlite:///{Path(text).expanduser().resolve()}"
    url = parse_url(text)
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    return url.render_as_string(hide_password=False)


def parse_url(text: str) -> URL:
    try:
        return make_url(text)
    except ArgumentError:
        # The message of ArgumentError repeats the URL, password included.
        raise UserError(
            f"--db: {redact(text)!r} is not a database URL "
            "(expected sqlite:///PATH or postgresql://USER@HOST/NAME)"
        ) from None


def redact(url: str | URL) -> str:
    """The URL with its password replaced by ``***``; safe for logs and error messages."""
    if isinstance(url, URL):
        return url.render_as_string(hide_password=True)
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        # Not parseable: strip anything between "://user:" and "@" by hand.
        scheme, sep, rest = url.partition("://")
        if not sep or "@" not in rest:
            return url
        cred, _, host = rest.rpartition("@")
        user = cred.split(":", 1)[0]
        return f"{scheme}://{user}:***@{host}" if ":" in cred else url
