"""flm collect / results / validate / db from the command line (in-process via main, and one
real `flm collect` subprocess for the progress lines and the exit code)."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys

import pandas as pd
import pytest
from store_fixtures import many_traces

from frontier_llm.bench.trace import write_trace
from frontier_llm.cli import main
from frontier_llm.store import SCHEMA_VERSION, connect, migrate, open_store


@pytest.fixture
def traces_dir(tmp_path):
    for t in many_traces(12, labels={"sweep": "s1"}):
        write_trace(tmp_path / "runs", t)
    for t in many_traces(3, prefix="other", labels={"sweep": "s2"}):
        write_trace(tmp_path / "runs", t)
    (tmp_path / "runs" / "junk.trace.json").write_text("not json")
    return tmp_path / "runs"


def test_collect_results_validate(traces_dir, db_url, capsys):
    assert main(["collect", str(traces_dir), "--db", db_url, "--batch-size", "5"]) == 0
    out, err = capsys.readouterr()
    assert "15 new, 0 updated, 0 unchanged, 1 quarantined" in out
    assert "collect: batch 1/4" in err and "quarantined" in err and "junk.trace.json" in err

    assert main(["collect", str(traces_dir), "--db", db_url, "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["inserted"], report["unchanged"], report["quarantined"]) == (0, 15, [])

    assert main(["results", "--db", db_url, "--sweep", "s1", "--format", "csv"]) == 0
    df = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert len(df) == 12 and set(df["sweep_name"]) == {"s1"}
    assert {"predicted_step_time_s", "layout_hash", "sharding"} <= set(df.columns)

    assert main(["results", "--db", db_url]) == 0
    table = capsys.readouterr().out
    assert "run-00011" in table and "other-00002" in table and "predicted_s" in table
    # What matters, in units, three significant figures: no six-decimal floats, no column of
    # timestamps or paths; --all prints every column as stored.
    header = table.splitlines()[0].split()
    assert {"step_s", "tokens/s", "MFU_%", "memory"} <= set(header)
    assert "trace_path" not in header and len(header) < 20
    assert not re.search(r"\d\.\d{5,}", table)
    assert main(["results", "--db", db_url, "--all"]) == 0
    wide = capsys.readouterr().out
    assert {"predicted_step_time_s", "trace_path"} <= set(wide.splitlines()[0].split())

    assert main(["results", "--db", db_url, "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["started_at"] == "2025-01-02T03:04:05+00:00"

    assert main(["validate", "--db", db_url, "--format", "json"]) == 0
    v = json.loads(capsys.readouterr().out)
    assert len(v["runs"]) == 15 and v["stats"][0]["system"] == "cpu-local"
    # Runs of one layout share its (first stored) prediction, so errors vary around the
    # factory's 10 %; the statistics are the mean and max of the per-run ones.
    errors = [abs(r["step_time_error_pct"]) for r in v["runs"]]
    assert v["stats"][0]["step_time_mape_pct"] == pytest.approx(sum(errors) / len(errors))
    assert v["stats"][0]["step_time_max_ape_pct"] == pytest.approx(max(errors))
    assert 5 < v["stats"][0]["step_time_mape_pct"] < 15

    assert main(["validate", "--db", db_url, "--sweep", "s2"]) == 0
    text = capsys.readouterr().out
    assert "predicted vs measured" in text and "other-00000" in text and "run-00000" not in text
    assert "step_time_mape_pct" in text
    # The table's header follows the title and the note on which FLOP/s figure is used.
    header = next(ln for ln in text.splitlines() if "run_id" in ln)
    assert "step_error_%" in header and not re.search(r"\d\.\d{5,}", text)
    assert main(["validate", "--db", db_url, "--sweep", "s2", "--all"]) == 0
    assert "measured_step_time_s" in capsys.readouterr().out


def test_flm_db_env_is_the_default(traces_dir, tmp_path, monkeypatch, capsys):
    url = f"sqlite:///{tmp_path / 'env.db'}"
    monkeypatch.setenv("FLM_DB", url)
    assert main(["collect", str(traces_dir), "--quiet"]) == 0
    assert capsys.readouterr().err.count("collect: batch") == 0
    store = open_store(url)
    assert len(pd.read_sql("SELECT run_id FROM flm_runs", store.engine)) == 15
    store.close()


def test_older_database_needs_flm_db_upgrade(db_url, capsys):
    store = connect(db_url)
    with store.write() as conn:
        migrate.upgrade(conn, target=1)
    store.close()
    assert main(["results", "--db", db_url]) == 2
    err = capsys.readouterr().err
    assert err.startswith("flm: error: the database has schema version 1, older than")
    assert "flm db upgrade" in err and "Traceback" not in err and err.count("\n") == 1

    assert main(["db", "version", "--db", db_url]) == 0
    assert "schema version: 1 (older: run 'flm db upgrade'" in capsys.readouterr().out
    assert main(["db", "upgrade", "--db", db_url]) == 0
    assert f"from schema version 1 to {SCHEMA_VERSION}" in capsys.readouterr().out
    assert main(["db", "upgrade", "--db", db_url]) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert main(["results", "--db", db_url]) == 0


def test_newer_database_is_refused_by_every_command(db_url, tmp_path, capsys):
    store = open_store(db_url)
    with store.write() as conn:
        conn.exec_driver_sql(f"UPDATE {migrate.VERSION_TABLE} SET version_num = '0099'")
    store.close()
    for argv in (["results"], ["validate"], ["collect", str(tmp_path)], ["db", "upgrade"]):
        assert main([*argv, "--db", db_url]) == 2
        err = capsys.readouterr().err
        assert f"schema version 99, newer than this frontier_llm's {SCHEMA_VERSION}" in err


@pytest.mark.postgres
def test_password_is_never_printed(pg_server, tmp_path, capsys):
    pw = pg_server.password
    url = f"postgresql://postgres:{pw}@127.0.0.1:{pg_server.port}/flm"
    assert main(["db", "version", "--db", url]) == 0
    assert main(["collect", str(tmp_path), "--db", url]) == 0
    out, err = capsys.readouterr()
    assert "postgres:***@127.0.0.1" in out and pw not in out + err
    bad = f"postgresql://postgres:{pw}x@127.0.0.1:{pg_server.port}/flm"
    assert main(["results", "--db", bad]) == 2
    err = capsys.readouterr().err
    assert "password authentication failed" in err and pw not in err


@pytest.mark.slow
def test_flm_collect_subprocess(traces_dir, tmp_path):
    url = f"sqlite:///{tmp_path / 'sub.db'}"
    proc = subprocess.run([sys.executable, "-m", "frontier_llm.cli", "collect", str(traces_dir),
                           "--db", url, "--batch-size", "8"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "collected 16 trace files" in proc.stdout and "15 new" in proc.stdout
    assert proc.stderr.count("collect: batch") == 2


def test_reading_a_missing_sqlite_database_is_an_error_not_a_new_file(tmp_path, monkeypatch):
    """`flm results` in the wrong directory must say so, not create an empty flm.db."""
    from frontier_llm.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FLM_DB", raising=False)
    for command in (["results"], ["validate"]):
        assert main(command) == 2
    assert not (tmp_path / "flm.db").exists()
