"""Which database a command talks to, and how to name it without leaking its password."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote

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
    """``text`` as a SQLAlchemy URL, with the credentials split at the *last* ``@``.

    SQLAlchemy splits at the first ``@``, so a password holding a raw ``@`` would leak its tail
    into the host name (and into every message that prints the URL). Percent-escapes in the
    user and password are decoded, as SQLAlchemy does. An unparseable URL is refused without
    echoing it: it may hold a password.
    """
    scheme, sep, rest = text.partition("://")
    cred, at, hostpart = _split_credentials(rest)
    try:
        if not sep or not at:
            return make_url(text)
        url = make_url(f"{scheme}://{hostpart}")
    except ArgumentError:
        raise UserError(
            "--db: not a database URL (expected sqlite:///PATH or postgresql://USER@HOST/NAME; "
            "the text is not repeated here because it may hold a password)"
        ) from None
    user, colon, password = cred.partition(":")
    return url.set(username=unquote(user) or None,
                   password=unquote(password) if colon else None)


def redact(url: str | URL) -> str:
    """The URL with its password replaced by ``***``; safe for logs and error messages.

    A string is cut at its last ``@`` whatever the password holds (``@``, ``:``, ``/``, ``%``);
    anything that is not a URL with credentials comes back as it is only when it has no ``@``.
    """
    if isinstance(url, URL):
        return url.render_as_string(hide_password=True)
    scheme, sep, rest = url.partition("://")
    cred, at, host = _split_credentials(rest)
    if not at:
        return url
    user, colon, _ = cred.partition(":")
    if not sep:
        return "***@" + host
    return f"{scheme}://{user}:***@{host}" if colon else f"{scheme}://{user}@{host}"


def has_password(text: str) -> bool:
    """Whether ``text`` is a URL (``scheme://``) whose credentials hold a password: the test
    :func:`redact` applies, so what it would hide is what callers refuse to copy elsewhere."""
    scheme, sep, rest = text.partition("://")
    if not sep or not scheme:
        return False
    cred, at, _ = _split_credentials(rest)
    return bool(at) and ":" in cred


def _split_credentials(rest: str) -> tuple[str, str, str]:
    """``(user[:password], "@", host...)`` of what follows ``://``, or ``("", "", rest)``.

    The last ``@`` ends the credentials, since a password may hold any character. A user name
    never holds ``/``: then the ``@`` lies in a path or query (``sqlite:///a@b.db``), and there
    are no credentials.
    """
    cred, at, host = rest.rpartition("@")
    if not at or "/" in cred.partition(":")[0]:
        return "", "", rest
    return cred, at, host
