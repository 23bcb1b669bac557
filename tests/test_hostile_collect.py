"""``flm collect`` against poison files (issue 31): each file that cannot be stored is
quarantined with its reason and the rest of the batch is stored; a FIFO is skipped, not read;
a symlink's target is never moved; a run_id stored from another file is never replaced.
Real SQLite, in process."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from pathlib import Path

import pytest
from store_fixtures import make_trace

from frontier_llm.cli import main
from frontier_llm.store.ingest import REASON_SUFFIX


def _text(run_id: str, **changes) -> str:
    trace = make_trace(run_id)
    for dotted, value in changes.items():
        *path, last = dotted.split(".")
        node = trace
        for p in path:
            node = node[p]
        node[last] = value
    return json.dumps(trace)


def _poisons() -> dict[str, str]:
    deep = "[" * 200_000 + "]" * 200_000
    return {
        "big-int": _text("big-int", **{"summary.peak_memory_bytes": 2**64}),
        "old-date": _text("old-date", started_at="0001-01-01T00:00:00+01:00"),
        "deep": _text("deep").replace('"labels": {}', f'"labels": {{"x": {deep}}}'),
        "surrogate": _text("surrogate", labels={"note": "\ud800"}),
        "nan": _text("nan").replace('"step_time_std_s": 0.001', '"step_time_std_s": NaN'),
    }


def _collect(capsys, db: Path, *dirs: Path) -> tuple[int, dict, str]:
    code = main(
        ["collect", *map(str, dirs), "--db", f"sqlite:///{db}", "--format", "json", "--quiet"]
    )
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, (json.loads(out) if out else {}), err


def _stored(db: Path) -> dict[str, str]:
    with sqlite3.connect(db) as conn:
        return dict(conn.execute("select run_id, trace_path from flm_runs"))


def test_poison_traces_are_quarantined_and_the_rest_stored(tmp_path, capsys):
    folder = tmp_path / "traces"
    folder.mkdir()
    for name, text in _poisons().items():
        (folder / f"{name}.trace.json").write_text(text)
    (folder / "good.trace.json").write_text(_text("good"))
    (folder / "zz-good.trace.json").write_text(_text("zz-good"))
    db = tmp_path / "flm.db"
    code, report, err = _collect(capsys, db, folder)
    assert code == 0, err
    assert set(_stored(db)) == {"good", "zz-good"}
    reasons = {Path(q["path"]).name.split(".")[0]: q["reason"] for q in report["quarantined"]}
    assert set(reasons) == set(_poisons())
    assert "64-bit" in reasons["big-int"] and "in range" in reasons["old-date"]
    assert "nested too deeply" in reasons["deep"] and "surrogate" in reasons["surrogate"]
    assert "NaN" in reasons["nan"]
    for q in report["quarantined"]:
        assert Path(q["path"] + REASON_SUFFIX).read_text().startswith(q["reason"])
    # A second run finds nothing more to do: the poison is out of the way.
    assert _collect(capsys, db, folder)[1]["unchanged"] == 2


def test_a_fifo_is_skipped_not_read(tmp_path, capsys):
    folder = tmp_path / "traces"
    folder.mkdir()
    os.mkfifo(folder / "pipe.trace.json")
    (folder / "zero.trace.json").symlink_to("/dev/zero")  # read whole, it exhausted memory
    (folder / "good.trace.json").write_text(_text("good"))
    db = tmp_path / "flm.db"
    result: list = []
    # In a thread with a bound: before the fix the open() of the FIFO never returned.
    worker = threading.Thread(
        target=lambda: result.append(_collect(capsys, db, folder)), daemon=True
    )
    worker.start()
    worker.join(30)
    if worker.is_alive():  # unblock the stuck reader so the test process can end
        fd = os.open(folder / "pipe.trace.json", os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        pytest.fail("flm collect hung on a FIFO")
    code, report, _ = result[0]
    assert code == 0 and set(_stored(db)) == {"good"}
    assert sum("not a regular file" in w for w in report["warnings"]) == 2
    assert (folder / "pipe.trace.json").exists()  # left where it is


def test_a_symlinked_bad_trace_leaves_its_target_alone(tmp_path, capsys):
    other = tmp_path / "someone-elses"
    other.mkdir()
    target = other / "theirs.trace.json"
    target.write_text("{not json")
    folder = tmp_path / "traces"
    folder.mkdir()
    (folder / "link.trace.json").symlink_to(target)
    code, report, _ = _collect(capsys, tmp_path / "flm.db", folder)
    assert code == 0
    assert target.read_text() == "{not json"  # not moved out of a folder not collected
    assert (folder / "link.trace.json").is_symlink()
    assert report["quarantined"] == []
    assert any("symbolic link" in w for w in report["warnings"])


def test_a_run_id_from_another_file_is_not_replaced(tmp_path, capsys):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    (first / "r.trace.json").write_text(_text("shared"))
    (second / "r.trace.json").write_text(_text("shared", status="failed", error="x"))
    db = tmp_path / "flm.db"
    assert _collect(capsys, db, first)[0] == 0
    stored = _stored(db)
    code, report, _ = _collect(capsys, db, second)
    assert code == 0 and _stored(db) == stored
    [q] = report["quarantined"]
    assert f"already stored from {first.resolve() / 'r.trace.json'}" in q["reason"]
    # The file's own path may still update it (a trace rewritten with more steps).
    (first / "r.trace.json").write_text(_text("shared", status="failed", error="x"))
    assert _collect(capsys, db, first)[1]["updated"] == 1


def test_a_planted_quarantine_link_is_not_followed(tmp_path, capsys):
    folder = tmp_path / "traces"
    folder.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (folder / "quarantine").symlink_to(elsewhere)
    (folder / "bad.trace.json").write_text("{")
    code, report, _ = _collect(capsys, tmp_path / "flm.db", folder)
    assert code == 0 and list(elsewhere.iterdir()) == []
    assert (folder / "bad.trace.json").exists()
    assert any("is a symbolic link" in w for w in report["warnings"])
