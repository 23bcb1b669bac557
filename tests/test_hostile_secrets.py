"""Passwords in every form a database URL takes, and secrets in a sweep's ``site:`` section
(issue 31): one redaction (store.url.redact) for messages and logs, and the sweep check
refuses what it would have copied into job scripts. The value never shows."""

from __future__ import annotations

from pathlib import Path

import pytest
from sweep_texts import local_sweep

from frontier_llm.cli import main
from frontier_llm.jobs.secrets import password_url, secret_name
from frontier_llm.store.url import parse_url, redact, redact_text

SECRET = "Sek-rit 9'x"  # a blank and a quote too


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("postgresql://flm:pw-Sek@db/flm", "postgresql://flm:***@db/flm"),
        (
            "postgresql://flm@db/flm?password=pw-Sek&sslmode=require",
            "postgresql://flm@db/flm?password=***&sslmode=require",
        ),
        (
            "postgresql://flm@db/flm?sslmode=require&PASSWORD=pw-Sek",
            "postgresql://flm@db/flm?sslmode=require&PASSWORD=***",
        ),
        ("host=db password=pw-Sek dbname=flm", "host=db password=*** dbname=flm"),
        ("host=db password='pw-Sek \\' x' dbname=flm", "host=db password=*** dbname=flm"),
    ],
)
def test_one_redaction_for_every_url_form(text, shown):
    assert redact(text) == shown
    assert redact_text(f"could not connect to {text}: refused").count("pw-Sek") == 0
    if "://" in text:
        # SQLAlchemy sorts the query's keys; the password stays hidden.
        assert "pw-Sek" not in redact(parse_url(text)) and "***" in redact(parse_url(text))


def _cli(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    assert "pw-Sek" not in err, err
    return err


def test_a_query_string_password_is_not_printed_by_db_version(capsys):
    # Port 1 on this machine: nothing listens, the driver's refusal comes back at once.
    err = _cli(
        capsys,
        [
            "db",
            "version",
            "--db",
            "postgresql://flm@127.0.0.1:1/flm?password=pw-Sek&connect_timeout=2",
        ],
    )
    assert "cannot open database postgresql+psycopg://flm@127.0.0.1:1/flm?" in err
    assert "password=***" in err


def test_a_keyword_string_is_refused_not_made_a_file(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "traces").mkdir()
    err = _cli(capsys, ["collect", "traces", "--db", "host=db password=pw-Sek dbname=flm"])
    assert "libpq keyword string" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["traces"]


def test_a_malformed_postgresql_url_is_one_line(capsys):
    err = _cli(capsys, ["db", "version", "--db", "postgresql://flm:pw-Sek@db:notaport/flm"])
    assert "not a database URL" in err


@pytest.mark.parametrize("name", ["DB_PASS", "GH_PAT", "SSH_KEY_PASSPHRASE", "MYSQL_PASS"])
def test_common_secret_names(name):
    assert secret_name(name)


@pytest.mark.parametrize("name", ["PATH", "FLM_PASS_ENV", "PATCH_LEVEL", "COMPASS_DIR"])
def test_names_that_stay_allowed(name):
    assert not secret_name(name)


@pytest.mark.parametrize(
    "text",
    [
        "postgresql://flm:'Sek rit'@db/flm",
        'postgresql://flm:"Sek rit"@db/flm',
        "postgresql://flm:Sek rit@db/flm",
        "postgresql://flm@db/flm?password=Sek",
    ],
)
def test_spaced_quoted_and_query_passwords_are_found(text):
    assert password_url(text)
    assert password_url(f"flm collect runs --db {text} --quiet")


def test_a_port_then_an_address_is_no_password():
    assert not password_url("see https://host:8080/x or mail me@example.org")


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ("site:\n  env:\n    DB_PASS: x1\n", "site.env.DB_PASS is named like a secret"),
        (
            "site:\n  env_multi_node:\n    FLM_DB: 'postgresql://u@db/f?password=x1'\n",
            "site.env_multi_node.FLM_DB holds a URL with a password",
        ),
        ("site:\n  setup:\n    - export GH_PAT=x1\n", "site.setup sets GH_PAT"),
        (
            "environment:\n  setup:\n    - export SSH_KEY_PASSPHRASE='x1 x2'\n",
            "environment.setup sets SSH_KEY_PASSPHRASE",
        ),
        ("labels: {db: \"postgresql://u:'x1 x2'@db/flm\"}\n", "db holds a URL with a password"),
        ("labels: {db: 'host=db password=x1'}\n", "db holds a password= pair"),
    ],
)
def test_the_sweeps_site_section_and_every_form_are_checked(tmp_path, capsys, extra, words):
    path = tmp_path / "s.yaml"
    path.write_text(local_sweep("sec", ["{dp: 1, micro_batch: 2, name: one}"], extra))
    out = tmp_path / "run"
    assert main(["sweep", "render", str(path), "--out", str(out)]) == 2
    stdout, err = capsys.readouterr()
    assert stdout == "" and err.count("\n") == 1, err
    assert words in err and "x1" not in err, err
    assert not Path(out).exists()
