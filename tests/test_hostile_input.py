"""Careless and hostile input that used to hang or end in a traceback (issue 31): a YAML alias
bomb, deep nesting, odd digits, and OS and database errors, each one line with exit 2."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_checks import one_line_refusal as _one_line
from store_fixtures import make_trace
from sweep_texts import local_sweep

from frontier_llm.cli import main
from frontier_llm.jobs.runner import LOG_TAIL_BYTES, tail_text


def _bomb(levels: int = 9) -> str:
    """About 1 KB of YAML that stands for 9**levels values once its aliases are expanded."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_in_time(tmp_path, capsys):
    path = tmp_path / "bomb.yaml"
    path.write_text(
        local_sweep(
            "bomb",
            ["{dp: 1, micro_batch: 2, name: one}"],
            f"labels:\n  {_bomb().replace(chr(10), chr(10) + '  ')}\n",
        )
    )
    assert len(path.read_bytes()) < 2000
    started = time.monotonic()
    _one_line(
        capsys,
        ["sweep", "render", str(path), "--out", str(tmp_path / "run")],
        "once its aliases are expanded",
    )
    assert time.monotonic() - started < 5


def test_deep_nesting_is_one_line(tmp_path, capsys):
    path = tmp_path / "deep.yaml"
    path.write_text("name: deep\nlabels: " + "[" * 100_000 + "]" * 100_000 + "\n")
    _one_line(
        capsys, ["sweep", "render", str(path), "--out", str(tmp_path / "run")], "nested too deeply"
    )


def test_a_superscript_port_is_refused(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(
        local_sweep(
            "port", ["{dp: 1, micro_batch: 2, name: one}"], 'template_options: {master_port: "²"}\n'
        )
    )
    _one_line(
        capsys,
        ["sweep", "render", str(path), "--out", str(tmp_path / "run")],
        "master_port must be a port number",
    )


@contextlib.contextmanager
def _tmpfs(where: Path, options: str) -> Iterator[Path]:
    """A small tmpfs mounted at ``where`` (a real full or read-only file system); the test is
    skipped where this process may not mount one (not root, or no CAP_SYS_ADMIN)."""
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)


def _sweep(tmp_path: Path) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(local_sweep("disk", ["{dp: 1, micro_batch: 2, name: one}"]))
    return path


def test_a_full_disk_is_one_line(tmp_path, capsys):
    with _tmpfs(tmp_path / "full", "size=64k") as mnt:
        with contextlib.suppress(OSError), open(mnt / "filler", "wb") as fh:
            while True:
                fh.write(b"\0" * 4096)
                fh.flush()
        _one_line(
            capsys,
            ["sweep", "render", str(_sweep(tmp_path)), "--out", str(mnt / "run")],
            "No space left on device",
        )
        _one_line(capsys, ["collect", str(tmp_path), "--db", f"sqlite:///{mnt}/flm.db"], "full")


def test_a_read_only_folder_is_one_line(tmp_path, capsys):
    with _tmpfs(tmp_path / "ro", "ro,size=64k") as mnt:
        _one_line(
            capsys,
            ["sweep", "render", str(_sweep(tmp_path)), "--out", str(mnt / "run")],
            f"Read-only file system: {mnt / 'run'}",
        )


def _damaged_db(tmp_path: Path, capsys) -> Path:
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "r.trace.json").write_text(json.dumps(make_trace("r")))
    db = tmp_path / "flm.db"
    assert main(["collect", str(tmp_path / "t"), "--db", f"sqlite:///{db}", "--quiet"]) == 0
    capsys.readouterr()
    return db


def test_a_corrupted_sqlite_page_is_one_line(tmp_path, capsys):
    db = _damaged_db(tmp_path, capsys)
    with sqlite3.connect(db) as conn:
        [root] = conn.execute("select rootpage from sqlite_master where name='flm_runs'").fetchone()
        [page] = conn.execute("pragma page_size").fetchone()
    conn.close()
    with open(db, "r+b") as fh:  # the table's first page: its header says no b-tree page type
        fh.seek((root - 1) * page)
        fh.write(b"\xff" * 8)
    _one_line(capsys, ["results", "--db", f"sqlite:///{db}"], "database disk image is malformed")


def test_an_unknown_alembic_revision_is_one_line(tmp_path, capsys):
    db = _damaged_db(tmp_path, capsys)
    with sqlite3.connect(db) as conn:
        conn.execute("update flm_alembic_version set version_num = '0000'")
    conn.close()
    _one_line(
        capsys,
        ["db", "upgrade", "--db", f"sqlite:///{db}"],
        "Can't locate revision identified by '0000'",
    )


def test_a_log_tail_is_read_from_the_end_in_bounded_memory(tmp_path):
    log = tmp_path / "big.out"
    with open(log, "wb") as fh:  # 300 MB, sparse: cheap to make, costly to read whole
        fh.truncate(300 * 2**20)
        fh.seek(300 * 2**20)
        fh.write(b"\nOOM: the last line\n")
    tracemalloc.start()
    try:
        text = tail_text(log, LOG_TAIL_BYTES)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert text.endswith("OOM: the last line\n") and len(text) == LOG_TAIL_BYTES
    assert peak < 4 * LOG_TAIL_BYTES
    os.mkfifo(tmp_path / "fifo.out")
    assert tail_text(tmp_path / "fifo.out", LOG_TAIL_BYTES) == ""  # not hung


@pytest.mark.parametrize("special", ["/dev/zero", "fifo"])
def test_a_sweep_file_that_is_no_regular_file_is_one_line(tmp_path, capsys, special):
    path = Path(special)
    if special == "fifo":
        path = tmp_path / "s.yaml"
        os.mkfifo(path)
    _one_line(
        capsys, ["sweep", "render", str(path), "--out", str(tmp_path / "run")], "not a regular file"
    )


def test_a_deeply_nested_trace_is_an_invalid_trace_for_status(tmp_path):
    from frontier_llm.jobs.classify import load_trace

    (tmp_path / "r.trace.json").write_text("[" * 200_000 + "]" * 200_000)
    assert load_trace(tmp_path, "r") == (None, "invalid trace: nested too deeply")
