"""flm collect's ingestion: idempotence, rewrites, quarantine, predictions, and two real collector
processes at once, on SQLite and a real PostgreSQL."""

from __future__ import annotations

import json
import multiprocessing as mp
import queue
import time

import pytest
from sqlalchemy import func, select
from store_fixtures import make_trace, many_traces

from frontier_llm.bench.trace import write_json_atomic, write_trace
from frontier_llm.store import open_store
from frontier_llm.store.ingest import collect
from frontier_llm.store.schema import (
    flm_layouts,
    flm_predictions,
    flm_rank_memory,
    flm_runs,
    flm_steps,
)

TABLES = (flm_layouts, flm_predictions, flm_runs, flm_steps, flm_rank_memory)


def counts(store) -> dict[str, int]:
    with store.read() as conn:
        return {t.name: conn.execute(select(func.count()).select_from(t)).scalar_one()
                for t in TABLES}


def snapshot(store) -> dict[str, list]:
    with store.read() as conn:
        return {t.name: sorted(map(tuple, conn.execute(select(t)).all()), key=repr)
                for t in TABLES}


def test_collect_twice_changes_nothing(tmp_path, db_url):
    traces = many_traces(25)
    for t in traces:
        write_trace(tmp_path / "traces", t)
    store = open_store(db_url)
    lines = []
    first = collect(store, [tmp_path / "traces"], batch_size=10, progress=lines.append)
    assert (first.seen, first.inserted, first.updated, first.unchanged) == (25, 25, 0, 0)
    assert first.batches == 3 and len(lines) == 3 and lines[0].startswith("collect: batch 1/3")
    expected_steps = sum(len(t["steps"]) for t in traces)
    expected_ranks = sum(len(t["memory"]) for t in traces)
    c = counts(store)
    assert c["flm_runs"] == 25 and c["flm_steps"] == expected_steps
    assert c["flm_rank_memory"] == expected_ranks
    assert c["flm_layouts"] == len({t["layout_hash"] for t in traces})
    before = snapshot(store)

    second = collect(store, [tmp_path / "traces"], batch_size=10)
    assert (second.inserted, second.updated, second.unchanged) == (0, 0, 25)
    assert snapshot(store) == before
    store.close()


def test_rewritten_trace_updates_its_run(tmp_path, db_url):
    store = open_store(db_url)
    write_trace(tmp_path, make_trace("grow", steps=4, warmup=1))
    write_trace(tmp_path, make_trace("other", steps=4))
    assert collect(store, [tmp_path]).inserted == 2
    with store.read() as conn:
        pk, measured = conn.execute(select(flm_runs.c.id, flm_runs.c.steps_measured)
                                    .where(flm_runs.c.run_id == "grow")).one()
    assert measured == 3

    longer = make_trace("grow", steps=12, warmup=1, seed=7)
    write_trace(tmp_path, longer)
    report = collect(store, [tmp_path])
    assert (report.inserted, report.updated, report.unchanged) == (0, 1, 1)
    with store.read() as conn:
        row = conn.execute(select(flm_runs).where(flm_runs.c.run_id == "grow")).one()
        steps = conn.execute(select(flm_steps.c.step, flm_steps.c.time_s)
                             .where(flm_steps.c.run == pk).order_by(flm_steps.c.step)).all()
    assert row.id == pk and row.steps_measured == 11
    assert row.step_time_s == pytest.approx(longer["summary"]["step_time_s"])
    assert [s.step for s in steps] == list(range(12))
    assert [s.time_s for s in steps] == [s["time_s"] for s in longer["steps"]]
    assert counts(store)["flm_runs"] == 2
    store.close()


def test_bad_files_are_quarantined_with_reasons_and_the_rest_goes_on(tmp_path, db_url):
    d = tmp_path / "runs"
    sub = d / "sweep-a"
    write_trace(d, make_trace("good-1"))
    write_trace(sub, make_trace("good-2"))
    (d / "truncated.trace.json").write_text('{"schema_version": 1, "run_id": "x"')
    (sub / "binary.trace.json").write_bytes(b"\xff\xfe\x00garbage")
    bad = make_trace("bad-status")
    bad["status"] = "exploded"
    write_json_atomic(d / "bad-status.trace.json", bad)
    dup = make_trace("dup-steps", steps=3)
    dup["steps"][1]["step"] = 0
    write_json_atomic(d / "dup-steps.trace.json", dup)

    store = open_store(db_url)
    report = collect(store, [d])
    assert report.inserted == 2
    reasons = {p.split("/")[-1]: r for p, r in report.quarantined}
    assert set(reasons) == {"truncated.trace.json", "binary.trace.json",
                            "bad-status.trace.json", "dup-steps.trace.json"}
    assert "not valid JSON" in reasons["truncated.trace.json"]
    assert "trace invalid at status" in reasons["bad-status.trace.json"]
    assert "step number appears twice" in reasons["dup-steps.trace.json"]
    # Each moved to quarantine/ of the DIR it was found under, with its reason beside it.
    q = d / "quarantine"
    assert (q / "binary.trace.json").exists() and not (sub / "binary.trace.json").exists()
    assert "not valid JSON" in (q / "truncated.trace.json.reason.txt").read_text()
    assert "trace invalid at status" in (q / "bad-status.trace.json.reason.txt").read_text()
    # The quarantine folder is not collected again.
    again = collect(store, [d])
    assert (again.seen, again.unchanged, again.quarantined) == (2, 2, [])
    store.close()


def test_explicit_quarantine_folder(tmp_path, db_url):
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "x.trace.json").write_text("[]")
    store = open_store(db_url)
    report = collect(store, [tmp_path / "runs"], quarantine=tmp_path / "bad")
    assert report.inserted == 0 and len(report.quarantined) == 1
    assert (tmp_path / "bad" / "x.trace.json").exists()
    assert (tmp_path / "bad" / "x.trace.json.reason.txt").read_text().startswith(
        "trace invalid at (top level)")
    store.close()


def test_predictions_are_stored_per_layout_and_version(tmp_path, db_url):
    a = make_trace("a", tp=2, costmodel_version="cm-1", predicted_step_time_s=0.5)
    b = make_trace("b", tp=2, seed=3, costmodel_version="cm-1", predicted_step_time_s=0.5)
    c = make_trace("c", tp=2, seed=4, costmodel_version="cm-2", predicted_step_time_s=0.25)
    none = make_trace("none", pp=2)
    none["prediction"] = None
    oom = make_trace("oom", dp=2, status="oom")
    for t in (a, b, c, none, oom):
        write_trace(tmp_path, t)
    store = open_store(db_url)
    assert collect(store, [tmp_path]).inserted == 5
    with store.read() as conn:
        preds = conn.execute(select(flm_predictions, flm_layouts.c.layout_hash).join(
            flm_layouts, flm_layouts.c.id == flm_predictions.c.layout_id)
            .order_by(flm_predictions.c.costmodel_version)).all()
        runs = {r.run_id: r for r in conn.execute(select(flm_runs)).all()}
    tp2 = [p for p in preds if p.layout_hash == a["layout_hash"]]
    assert [(p.costmodel_version, p.step_time_s) for p in tp2] == [("cm-1", 0.5), ("cm-2", 0.25)]
    assert json.loads(tp2[0].breakdown_json)["breakdown"]["time"]["bubble_s"] == 0.0
    assert tp2[0].fits is True and tp2[0].peak_memory_bytes == a["prediction"][
        "peak_memory_bytes"]
    assert runs["c"].costmodel_version == "cm-2"
    assert runs["none"].costmodel_version is None
    assert runs["oom"].status == "oom" and runs["oom"].step_time_s is None
    assert runs["oom"].error.startswith("oom")
    store.close()


def _collector(url: str, folder: str, barrier, results) -> None:
    """One collector process: wait for the other, then open (maybe create) the store and
    ingest the same folder in small batches so the two interleave."""
    barrier.wait(timeout=60)
    store = open_store(url)
    report = collect(store, [folder], batch_size=15)
    store.close()
    results.put(report.as_dict())


@pytest.mark.slow
def test_two_collectors_at_once_neither_duplicate_nor_lose(tmp_path, db_url):
    """Two real processes ingest one folder at the same time into a database neither has
    created yet."""
    traces = many_traces(240)
    for t in traces:
        write_trace(tmp_path / "runs", t)
    (tmp_path / "runs" / "broken.trace.json").write_text("{")
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_collector, args=(db_url, str(tmp_path / "runs"), barrier,
                                                 results)) for _ in range(2)]
    for p in procs:
        p.start()
    reports = []
    deadline = time.monotonic() + 300
    while len(reports) < 2:
        try:
            reports.append(results.get(timeout=0.5))
        except queue.Empty:
            # A collector that died does not report: fail now, not at the deadline.
            assert not any(p.exitcode for p in procs), [p.exitcode for p in procs]
            assert time.monotonic() < deadline, "collectors did not finish in 300 s"
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    # Each run was inserted by exactly one of them; whatever the other saw it counted unchanged.
    assert sum(r["inserted"] for r in reports) == 240
    assert all(r["inserted"] + r["unchanged"] + r["updated"] == 240 for r in reports)
    assert sum(len(r["quarantined"]) for r in reports) == 1
    assert sorted(p.name for p in (tmp_path / "runs" / "quarantine").iterdir()) == [
        "broken.trace.json", "broken.trace.json.reason.txt"]
    store = open_store(db_url)
    c = counts(store)
    assert c["flm_runs"] == 240
    assert c["flm_steps"] == sum(len(t["steps"]) for t in traces)
    assert c["flm_rank_memory"] == sum(len(t["memory"]) for t in traces)
    assert c["flm_layouts"] == len({t["layout_hash"] for t in traces})
    with store.read() as conn:
        ids = conn.execute(select(flm_runs.c.run_id)).scalars().all()
    assert sorted(ids) == sorted(t["run_id"] for t in traces)
    store.close()


@pytest.fixture(scope="module")
def bench_trace_dir(tmp_path_factory):
    """A trace written by a real `flm bench` run (2 gloo ranks, tiny model, 3 steps)."""
    import os
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("bench")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "frontier_llm.cli", "bench", "--model", "tiny-gpt", "--tp", "2",
         "--micro-batch", "1", "--global-batch", "2", "--steps", "3", "--warmup", "1",
         "--trace-dir", str(out), "--run-id", "e2e-tp2", "--label", "sweep=e2e"],
        capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


@pytest.mark.slow
def test_a_real_flm_bench_trace_flows_in(bench_trace_dir, db_url):
    trace = json.loads((bench_trace_dir / "e2e-tp2.trace.json").read_text())
    store = open_store(db_url)
    assert collect(store, [bench_trace_dir]).inserted == 1
    from frontier_llm.store.queries import runs_frame, validation_frame

    row = runs_frame(store, sweep="e2e").iloc[0]
    assert (row["run_id"], row["tp"], row["world_size"], row["status"]) == (
        "e2e-tp2", 2, 2, "completed")
    assert row["step_time_s"] == pytest.approx(trace["summary"]["step_time_s"])
    assert row["predicted_step_time_s"] == pytest.approx(trace["prediction"]["step_time_s"])
    assert len(validation_frame(store)) == 1
    assert counts(store)["flm_rank_memory"] == 2
    store.close()


def test_sqlite_writer_waits_and_retries_on_a_held_lock(tmp_path, monkeypatch):
    """Another connection holds SQLite's write lock for a second while the busy timeout is cut
    to 0.1 s: the batch hits a real "database is locked", backs off, retries and succeeds."""
    import sqlite3
    import threading

    import frontier_llm.store as store_module

    monkeypatch.setattr(store_module, "SQLITE_BUSY_TIMEOUT_S", 0.1)
    for t in many_traces(5):
        write_trace(tmp_path / "runs", t)
    path = tmp_path / "flm.db"
    store = open_store(f"sqlite:///{path}")
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    release = threading.Timer(1.0, lambda: holder.execute("COMMIT"))
    release.start()
    try:
        report = collect(store, [tmp_path / "runs"])
    finally:
        release.join()
        holder.close()
    assert report.inserted == 5 and report.retries >= 1 and report.seconds >= 0.9
    assert counts(store)["flm_runs"] == 5
    store.close()


def test_collect_of_a_missing_folder_is_a_user_error(tmp_path):
    from frontier_llm.errors import UserError

    store = open_store(f"sqlite:///{tmp_path / 'x.db'}")
    with pytest.raises(UserError, match="is not a folder or a trace file"):
        collect(store, [tmp_path / "nope"])
    store.close()
