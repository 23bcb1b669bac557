"""Database URLs whose passwords hold the characters a URL uses for its own structure: the
password never shows in a message, and a raw ``@`` still reaches the server whole."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest
from sqlalchemy import create_engine

from frontier_llm.errors import UserError
from frontier_llm.store import open_store
from frontier_llm.store.url import parse_url, redact, resolve_url

HOSTILE = ["p@ss-Zq9", "a:b@c", "x%y", "pa/ss@w", "q?u=1&v@", "@@", "per%40cent", "trail:"]


def _pieces(secret: str) -> list[str]:
    """The fragments of a password a broken redaction would leave in a message."""
    parts = {secret}
    for sep in "@:/?%&=":
        parts.update(p for p in secret.split(sep) if len(p) >= 3)
    return sorted(parts)


@pytest.mark.parametrize("password", HOSTILE)
def test_hostile_passwords_are_parsed_whole_and_never_shown(password):
    raw = f"postgresql://flm:{password}@db.example:5432/results"
    url = parse_url(raw)
    assert (url.username, url.host, url.port, url.database) == ("flm", "db.example", 5432,
                                                                "results")
    # Percent escapes are decoded as in any URL; everything else arrives as written.
    assert url.password == password.replace("%40", "@")
    for shown in (redact(raw), redact(url), redact(resolve_url(raw))):
        assert shown.startswith("postgresql") and "flm:***@db.example:5432/results" in shown
        for piece in _pieces(password):
            assert piece not in shown.replace("flm:***@db.example:5432/results", "")


@pytest.mark.parametrize("text", ["sqlite:////tmp/a@b.db", "postgresql://h/db?options=a@b",
                                  "postgresql://u@h/db"])
def test_an_at_sign_outside_the_credentials_is_left_alone(text):
    url = parse_url(text)
    assert url.password is None
    assert redact(text) == text


def test_an_unparseable_url_is_refused_without_echoing_it():
    with pytest.raises(UserError) as info:
        resolve_url("postgres ql://flm:s3cr3t-Pw@db/flm")
    assert "s3cr3t" not in str(info.value) and "not a database URL" in str(info.value)


def test_the_cli_error_for_a_bad_url_holds_no_password(tmp_path):
    out = subprocess.run([sys.executable, "-m", "frontier_llm.cli", "results", "--db",
                          "postgres ql://flm:s3cr3t-Pw@db/flm"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 2
    assert "s3cr3t" not in out.stdout + out.stderr
    assert "not a database URL" in out.stderr


@pytest.mark.slow
@pytest.mark.postgres
def test_a_raw_at_sign_password_reaches_postgresql_and_a_wrong_one_never_leaks(pg_server):
    """A real PostgreSQL role whose password holds ``@``, ``:`` and ``/``, written raw."""
    admin = create_engine(pg_server.start().replace("postgresql://", "postgresql+psycopg://", 1),
                          isolation_level="AUTOCOMMIT")
    role = f"flm_{uuid.uuid4().hex[:8]}"
    password = "p@ss:w/rd-Zq9"
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE ROLE {role} LOGIN PASSWORD '{password}' SUPERUSER")
    admin.dispose()
    base = f"127.0.0.1:{pg_server.port}/flm"

    store = open_store(f"postgresql://{role}:{password}@{base}")
    with store.read() as conn:
        assert conn.exec_driver_sql("select current_user").scalar() == role
    for piece in _pieces(password):
        assert piece not in store.url_redacted.replace(f"{role}:***@127.0.0.1", "")
    store.close()

    wrong = "Wr0ng@pass:Zq9"
    with pytest.raises(UserError) as info:
        open_store(f"postgresql://{role}:{wrong}@{base}")
    message = str(info.value)
    assert "password authentication failed" in message
    for piece in _pieces(wrong):
        assert piece not in message.replace(f"{role}:***@127.0.0.1", "")
