"""Which database a command talks to, and how to name it without leaking its password."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from frontier_llm.errors import UserError

ENV_VAR = "FLM_DB"
DEFAULT_FILE = "flm.db"
# The SQLAlchemy dialect+driver names flm runs on: Python's sqlite3 and psycopg 3, the one
# PostgreSQL driver this package depends on (pyproject.toml).
DRIVERS = ("sqlite", "sqlite+pysqlite", "postgresql+psycopg")

# A secret given as a key=value pair: in a URL's query string (?password=..&) or in a libpq
# keyword string (host=db password='it s' dbname=flm). Any key that ends in pass, password,
# passwd, passphrase, secret or token: libpq's password and sslpassword (the client key's
# passphrase; libpq docs, "Parameter Key Words"), and whatever a driver adds (max_tokens= is
# no secret). The value runs to the next & or blank, or is a quoted string (libpq's quoting:
# '...' with \' inside).
_SECRET_KEY = r"[A-Za-z_]*(?:pass(?:word|wd|phrase)?|secret|token)"
_PASSWORD_PAIR = re.compile(
    rf"(?P<key>(?:^|(?<=[\s?&;])){_SECRET_KEY}\s*=\s*)"
    r"(?P<value>'(?:[^'\\]|\\.)*'?|\"(?:[^\"\\]|\\.)*\"?|[^\s&]*)",
    re.IGNORECASE)
# The start of a libpq keyword string: a word, then "=" (``host=db dbname=flm``).
_KEYWORD_FORM = re.compile(r"^\s*[A-Za-z_]+\s*=")
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"]*")
_BAD_URL = ("--db: not a database URL (expected sqlite:///PATH or postgresql://USER@HOST/NAME; "
            "the text is not repeated here because it may hold a password)")


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
    if "://" not in text and _KEYWORD_FORM.match(text):
        # Taken as a file path, "host=db password=..." became a SQLite file named with the
        # password, in the working folder, for anyone listing it to read.
        raise UserError("--db: a libpq keyword string (host=... dbname=...) is not accepted; "
                        "write postgresql://USER@HOST:PORT/NAME and keep the password in "
                        "$PGPASSWORD or ~/.pgpass (the text is not repeated here because it may "
                        "hold a password)")
    if "://" not in text:
        return f"sqlite:///{Path(text).expanduser().resolve()}"
    url = parse_url(text)
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    if url.drivername not in DRIVERS:
        # Another driver (postgresql+asyncpg, +pg8000, mysql://) is not installed, or needs
        # an async engine: SQLAlchemy would fail deep inside with a traceback.
        raise UserError(f"--db: the database driver {url.drivername!r} is not supported; flm "
                        "talks to SQLite (sqlite:///PATH) and to PostgreSQL through psycopg 3 "
                        "(postgresql://USER@HOST/NAME)")
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
    except (ArgumentError, ValueError):
        # ValueError: a port that is not a number (SQLAlchemy's int() of it).
        raise UserError(_BAD_URL) from None
    user, colon, password = cred.partition(":")
    return url.set(username=unquote(user) or None,
                   password=unquote(password) if colon else None)


def redact(url: str | URL) -> str:
    """The URL with every password replaced by ``***``; safe for logs and error messages.

    The one redaction for every form a database URL takes: the password of the credentials
    (``user:PASSWORD@host``; a string is cut at its last ``@`` whatever the password holds:
    ``@``, ``:``, ``/``, ``%``), a ``password=`` pair in the query string, and a libpq keyword
    string (``host=db password='a b'``). Text with none of these comes back as it is.
    """
    if isinstance(url, URL):
        # SQLAlchemy's rendering hides the credentials' password but prints the query string
        # as it is: its secret parameters (sslpassword=) are replaced before it renders.
        query = {k: ("***" if _is_secret_key(k) else v) for k, v in url.query.items()}
        return _redact_pairs(url.set(query=query).render_as_string(hide_password=True))
    scheme, sep, rest = url.partition("://")
    cred, at, host = _split_credentials(rest)
    if not at:
        return _redact_pairs(url)
    user, colon, _ = cred.partition(":")
    if not sep:
        return "***@" + _redact_pairs(host)
    shown = f"{scheme}://{user}:***@{host}" if colon else f"{scheme}://{user}@{host}"
    return _redact_pairs(shown)


def redact_text(text: str) -> str:
    """A message (a driver's or library's error) with each URL in it redacted by
    :func:`redact` and every ``password=`` pair hidden; the rest as it is."""
    return _redact_pairs(_URL_IN_TEXT.sub(lambda m: redact(m.group(0)), text))


def password_pairs(text: str) -> list[str]:
    """The values of the ``password=`` pairs in ``text`` (query string or keyword string),
    quotes removed: what :func:`redact` hides besides the credentials' password."""
    return [m.group("value").strip("'\"") for m in _PASSWORD_PAIR.finditer(text)]


def _redact_pairs(text: str) -> str:
    return _PASSWORD_PAIR.sub(lambda m: f"{m.group('key')}***", text)


def _is_secret_key(key: str) -> bool:
    return re.fullmatch(_SECRET_KEY, key, re.IGNORECASE) is not None


def url_password(url: URL) -> str | None:
    """The password a parsed URL carries (credentials or query string: password=,
    sslpassword=...), to scrub it from a driver's messages."""
    if url.password:
        return str(url.password)
    value = next((v for k, v in url.query.items() if _is_secret_key(k)), None)
    if isinstance(value, tuple):
        value = value[0] if value else None
    return value or None


def has_password(text: str) -> bool:
    """Whether ``text`` is a URL (``scheme://``) that holds a password, in its credentials or
    as a query-string ``password=``: what :func:`redact` would hide is what callers refuse to
    copy elsewhere."""
    scheme, sep, rest = text.partition("://")
    if not sep or not scheme:
        return False
    if any(password_pairs(rest)):
        return True
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
