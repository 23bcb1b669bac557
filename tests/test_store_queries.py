"""Queries: runs joined with layouts and predictions; predicted vs measured and its MAPE."""

from __future__ import annotations

import pandas as pd
import pytest
from store_fixtures import make_trace

from frontier_llm.bench.trace import write_trace
from frontier_llm.store import open_store
from frontier_llm.store.ingest import collect
from frontier_llm.store.queries import (
    error_stats,
    rank_memory_frame,
    runs_frame,
    sweep_names,
    validation_frame,
)


def _trace(run_id, system, measured_s, predicted_s, measured_mem, predicted_mem, **kw):
    t = make_trace(run_id, system=system, **kw)
    t["summary"]["step_time_s"] = measured_s
    t["summary"]["peak_memory_bytes"] = measured_mem
    t["prediction"]["step_time_s"] = predicted_s
    t["prediction"]["peak_memory_bytes"] = predicted_mem
    return t


@pytest.fixture
def store(tmp_path, db_url):
    traces = [
        # cpu-local: step-time errors +20 % and -10 %, memory errors 0 % and +50 %
        _trace("c1", "cpu-local", 1.0, 1.2, 1000, 1000, tp=1, labels={"sweep": "s1"}),
        _trace("c2", "cpu-local", 2.0, 1.8, 1000, 1500, tp=2, labels={"sweep": "s1",
                                                                         "job_key": "k2"}),
        # frontier: -40 %; memory unknown on the measured side
        _trace("f1", "frontier", 0.5, 0.3, None, 2000, dp=2, labels={"sweep": "s2"},
               costmodel_version="cm-9"),
        # failed runs are listed but never validated
        _trace("oops", "frontier", None, 0.3, None, 2000, dp=4, status="failed"),
    ]
    for t in traces:
        write_trace(tmp_path / "t", t)
    s = open_store(db_url)
    assert collect(s, [tmp_path / "t"]).inserted == 4
    yield s
    s.close()


def test_runs_frame_joins_layouts_and_predictions(store):
    df = runs_frame(store)
    assert list(df["run_id"]) == ["c1", "c2", "f1", "oops"]  # by sweep, runs without last
    row = df.set_index("run_id").loc["c2"]
    assert (row["model"], row["system"], row["tp"], row["pp"], row["dp"]) == (
        "tiny-gpt", "cpu-local", 2, 1, 1)
    assert row["sharding"] == "zero0" and row["job_key"] == "k2" and row["sweep_name"] == "s1"
    assert row["step_time_s"] == 2.0 and row["predicted_step_time_s"] == 1.8
    assert row["predicted_peak_memory_bytes"] == 1500
    assert row["predicted_costmodel_version"] == "test-1"
    assert df.loc[df.run_id == "f1", "predicted_costmodel_version"].item() == "cm-9"
    assert str(df["started_at"].dt.tz) == "UTC"
    assert df["started_at"].iloc[0] == pd.Timestamp("2025-01-02T03:04:05Z")


def test_runs_frame_by_sweep(store):
    assert list(runs_frame(store, sweep="s1")["run_id"]) == ["c1", "c2"]
    assert runs_frame(store, sweep="none-such").empty
    assert sweep_names(store) == ["s1", "s2"]


def test_validation_frame_signed_errors(store):
    v = validation_frame(store).set_index("run_id")
    assert set(v.index) == {"c1", "c2", "f1"}  # the failed run is left out
    assert v.loc["c1", "step_time_error_pct"] == pytest.approx(20.0)
    assert v.loc["c2", "step_time_error_pct"] == pytest.approx(-10.0)
    assert v.loc["f1", "step_time_error_pct"] == pytest.approx(-40.0)
    assert v.loc["c2", "memory_error_pct"] == pytest.approx(50.0)
    assert pd.isna(v.loc["f1", "memory_error_pct"])


def test_error_stats_per_system_and_overall(store):
    stats = error_stats(validation_frame(store)).set_index("system")
    assert list(stats.index) == ["cpu-local", "frontier", "(all)"]
    assert stats.loc["cpu-local", "runs"] == 2
    assert stats.loc["cpu-local", "step_time_mape_pct"] == pytest.approx(15.0)
    assert stats.loc["cpu-local", "step_time_max_ape_pct"] == pytest.approx(20.0)
    assert stats.loc["cpu-local", "memory_mape_pct"] == pytest.approx(25.0)
    assert stats.loc["frontier", "step_time_mape_pct"] == pytest.approx(40.0)
    assert stats.loc["frontier", "memory_runs"] == 0
    assert pd.isna(stats.loc["frontier", "memory_mape_pct"])
    assert stats.loc["(all)", "step_time_mape_pct"] == pytest.approx(70.0 / 3)
    assert stats.loc["(all)", "step_time_max_ape_pct"] == pytest.approx(40.0)


def test_compare_with_another_costmodel_version(store, tmp_path):
    # A later trace of c1's layout carries a newer cost model's prediction.
    newer = _trace("c1-again", "cpu-local", 1.0, 1.05, 1000, 1000, tp=1,
                   costmodel_version="test-2")
    write_trace(tmp_path / "t2", newer)
    assert collect(store, [tmp_path / "t2"]).inserted == 1
    v = validation_frame(store, costmodel_version="test-2").set_index("run_id")
    # Both runs of that layout are now compared with test-2; the others have no test-2 figure.
    assert sorted(v.index) == ["c1", "c1-again"]
    assert v.loc["c1", "step_time_error_pct"] == pytest.approx(5.0)


def test_empty_store_gives_empty_frames(tmp_path):
    s = open_store(f"sqlite:///{tmp_path / 'e.db'}")
    assert runs_frame(s).empty and validation_frame(s).empty
    stats = error_stats(validation_frame(s))
    assert list(stats["system"]) == ["(all)"] and stats["runs"].item() == 0
    s.close()


def test_rank_memory_frame_one_row_per_rank(store):
    df = rank_memory_frame(store, sweep="s1")
    assert sorted(set(df["run_id"])) == ["c1", "c2"]
    c2 = df[df["run_id"] == "c2"]
    assert c2["rank"].tolist() == [0, 1] and c2["tp_rank"].tolist() == [0, 1]  # tp = 2
    assert (c2["params_bytes"] > 0).all() and str(c2["params_bytes"].dtype) == "Int64"
    assert len(rank_memory_frame(store)) == 1 + 2 + 2 + 4  # every run's ranks
