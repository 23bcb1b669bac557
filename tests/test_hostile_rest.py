"""Hostile and careless input, the rest of issue 38: a template that asks for a billion of
something, a disk that fills while a sweep is rendered, a database another program holds, and
one measurement collected twice.

Real parts: the CLI's ``main``, real sweep and template files, real SQLite with a second real
connection holding the write lock, real trainer logs (tests/data/trainer_logs). Only the full
disk is simulated (a write that raises ENOSPC), said in its test.
"""

from __future__ import annotations

import errno
import json
import shutil
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from cli_checks import one_line_refusal as _one_line
from store_fixtures import make_trace
from sweep_texts import local_sweep

from frontier_llm.cli import main

DATA = Path(__file__).parent / "data" / "trainer_logs"



def _template_sweep(folder: Path, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "big.sh.j2").write_text(
        '{% extends "local.sh.j2" %}\n{% block system_env %}' + body + "{% endblock %}\n")
    path = folder / "sweep.yaml"
    path.write_text(local_sweep("big", ["{dp: 1, micro_batch: 2, name: one}"],
                                "template: big.sh.j2\n"))
    return path


# --- item 8: a sandboxed template's unbounded cost -----------------------------------------

@pytest.mark.parametrize(("body", "words"), [
    # Jinja2's own sandbox raised OverflowError here: a traceback.
    ("{% for i in range(10**9) %}{{ i }}{% endfor %}", "Range too big"),
    # These ran for minutes and took the memory (10 GB for the first).
    ("{{ 'x' * 10**10 }}", "a repetition ('x' * n) would make 10,000,000,000 characters"),
    ("{{ (['x'] * 10**10) | length }}", "a repetition"),
    ("{{ 10 ** 100000000 }}", "a power (10 ** 100000000) of more than 4096 bits"),
    ("{{ 'x'.ljust(10**10) }}", "str.ljust(10000000000)"),
    ("{{ 'x' | center(10**10) }}", "a width of 10000000000"),
    ("{{ '%9999999999s' % 'x' }}", "a format width of 8 digits or more"),
    ("{{ '{:>9999999999}'.format('x') }}", "a format width of 8 digits or more"),
    ("{{ '{:>{w}}'.format('x', w=10**10) }}", "str.format(10000000000)"),
    ("{{ '%*s' % (10**10, 'x') }}", "a '%*' width(10000000000)"),
    # Each piece is small; together they pass what a batch script may hold (4 MB).
    ("{% for i in range(5000) %}{{ 'x' * 1000 }}{% endfor %}", "its output passes 4,000,000"),
])
def test_8_a_template_asking_for_a_billion_is_one_line_and_fast(tmp_path, capsys, body, words):
    path = _template_sweep(tmp_path / "s", body)
    t0 = time.monotonic()
    err = _one_line(capsys, ["sweep", "render", str(path), "--out", str(tmp_path / "run")],
                    words)
    assert "refused by the template sandbox" in err
    assert time.monotonic() - t0 < 20  # seconds, not the minutes (or the OOM) it was
    assert not (tmp_path / "run").exists()


def test_8_a_template_within_the_bounds_still_renders(tmp_path, capsys):
    """The bounds refuse sizes no script has, not arithmetic or loops a template uses."""
    path = _template_sweep(tmp_path / "s", "# {{ 'ab' * 3 }} {{ 2 ** 10 }} {{ '%5s' % 'x' }} "
                           "{% for i in range(3) %}{{ i }}{% endfor %} {{ 'y' | center(7) }}\n")
    assert main(["sweep", "render", str(path), "--out", str(tmp_path / "run")]) == 0
    script = next((tmp_path / "run" / "scripts").glob("*.sh")).read_text()
    assert "# ababab 1024     x 012    y   \n" in script


# --- item 8: a full disk while a sweep folder is written -----------------------------------

def _fill_after(monkeypatch, writes: int) -> list[Path]:
    """Simulated full disk (a real one cannot be made here without a mount): the atomic
    writer under render_sweep raises ENOSPC from its ``writes``-th file on."""
    from frontier_llm.jobs import sweepdir

    real = sweepdir.write_text_atomic
    done: list[Path] = []

    def write(path, text, mode=None, durable=False):
        if len(done) >= writes:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        done.append(Path(path))
        return real(path, text, mode, durable)

    monkeypatch.setattr(sweepdir, "write_text_atomic", write)
    return done


def _tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def _two_group_sweep(tmp_path: Path, micro: int = 2) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(local_sweep("full", [f"{{dp: 1, micro_batch: {micro}, name: one}}",
                                         "{dp: 2, micro_batch: 2, name: two}"]))
    return path


def test_8_a_full_disk_leaves_no_half_rendered_sweep_folder(tmp_path, capsys, monkeypatch):
    """Before: the scripts written before the disk filled stayed in --out, without a
    manifest or with one naming scripts that were never written."""
    done = _fill_after(monkeypatch, 1)
    out = tmp_path / "run"
    err = _one_line(capsys, ["sweep", "render", str(_two_group_sweep(tmp_path)), "--out",
                             str(out)], "No space left on device")
    assert done, "the failure came before any file was written: the test proves nothing"
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"], "staging folder left"
    assert "Traceback" not in err


def test_8_a_full_disk_during_a_re_render_leaves_the_old_folder_as_it_was(
        tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    assert main(["sweep", "render", str(_two_group_sweep(tmp_path)), "--out", str(out)]) == 0
    (out / "traces" / "r.trace.json").write_text("{}")  # what the jobs wrote meanwhile
    before = _tree(out)
    capsys.readouterr()
    _fill_after(monkeypatch, 2)
    _one_line(capsys, ["sweep", "render", str(_two_group_sweep(tmp_path, micro=4)), "--out",
                       str(out)], "No space left on device")
    assert _tree(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "s.yaml"]


def test_8_a_re_render_replaces_the_files_and_keeps_the_jobs_output(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["sweep", "render", str(_two_group_sweep(tmp_path)), "--out", str(out)]) == 0
    (out / "traces" / "r.trace.json").write_text("{}")
    assert main(["sweep", "render", str(_two_group_sweep(tmp_path, micro=4)), "--out",
                 str(out)]) == 0
    assert "micro_batch: 4" in (out / "sweep.yaml").read_text()
    assert (out / "traces" / "r.trace.json").read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "s.yaml"]


# --- item 10: a busy database -------------------------------------------------------------

def test_10_collect_says_at_once_that_it_waits_for_a_busy_database(tmp_path, capsys):
    """A second, real SQLite connection holds the write lock (BEGIN IMMEDIATE): collect used to
    wait up to its busy timeout in silence."""
    db = tmp_path / "flm.db"
    for name in ("first", "r"):
        folder = tmp_path / name
        folder.mkdir()
        (folder / f"{name}.trace.json").write_text(json.dumps(make_trace(name)))
    assert main(["collect", str(tmp_path / "first"), "--db", f"sqlite:///{db}"]) == 0
    capsys.readouterr()
    holder = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    codes: list[int] = []
    t = threading.Thread(target=lambda: codes.append(
        main(["collect", str(folder), "--db", f"sqlite:///{db}"])))
    t.start()
    try:
        deadline = time.monotonic() + 20
        err = ""
        while "waiting" not in err:
            assert time.monotonic() < deadline, f"no word while waiting: {err!r}"
            time.sleep(0.05)
            err += capsys.readouterr().err
        assert "another program holds its write lock" in err, err
        assert not codes, "collect finished while the lock was held"
    finally:
        holder.execute("COMMIT")
        holder.close()
        t.join(60)
    assert codes == [0]
    assert "1 new" in capsys.readouterr().out


# --- item 10: one measurement collected twice -----------------------------------------------

def test_10_a_copied_log_folder_counts_once_in_calibration(tmp_path, capsys):
    """``flm collect --from-logs`` names a run by its log's path: a copy of the folder gave
    every run a second id, and ``calibrate --from-runs`` counted each measurement twice."""
    db = f"sqlite:///{tmp_path / 'flm.db'}"
    for copy in ("a", "b"):  # the same logs, and a copy of the folder
        folder = tmp_path / copy
        folder.mkdir()
        for name in ("torchtitan_1437_flex_debug.log", "torchtitan_1287_steps.log"):
            shutil.copy(DATA / name, folder / name)
    for copy in ("a", "b"):
        for name, batch in (("torchtitan_1437_flex_debug.log", 8),
                            ("torchtitan_1287_steps.log", 16)):
            assert main(["collect", "--from-logs", str(tmp_path / copy / name), "--trainer",
                         "torchtitan", "--system", "h100-sxm", "--model", "tiny-llama",
                         "--layout", f"tp=1,pp=1,dp=1,micro_batch={batch},global_batch={batch}",
                         "--db", db, "--traces", str(tmp_path / f"traces-{copy}"),
                         "--quiet"]) == 0
    capsys.readouterr()
    assert main(["calibrate", "--from-runs", "--sweep", "logs-h100-sxm", "--system",
                 "h100-sxm", "--db", db, "--folds", "2", "--format", "json"]) == 0
    out, err = capsys.readouterr()
    assert [r["runs"] for r in json.loads(out)["runs"]] == [1, 1]
    assert json.loads(out)["repeated_runs_left_out"] == 2
    assert "left out 2 run(s) that repeat another run's measurement" in err, err
