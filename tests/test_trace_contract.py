"""The trace contract: schema validation and atomic writes."""

from __future__ import annotations

import json
import os

import pytest

from frontier_llm.bench.trace import (
    TraceError,
    read_trace,
    validate_trace,
    write_heartbeat,
    write_json_atomic,
)


def test_newer_schema_version_is_refused_clearly():
    with pytest.raises(TraceError, match="schema_version 2 is not supported"):
        validate_trace({"schema_version": 2})


def test_missing_field_is_named():
    with pytest.raises(TraceError, match="'run_id' is a required property"):
        validate_trace({"schema_version": 1})


def test_corrupt_file_is_a_trace_error(tmp_path):
    path = tmp_path / "x.trace.json"
    path.write_text('{"schema_version": 1, ')
    with pytest.raises(TraceError, match="not valid JSON"):
        read_trace(path)


def test_atomic_write_leaves_no_temp_files_and_replaces(tmp_path):
    target = tmp_path / "a.json"
    write_json_atomic(target, {"v": 1})
    write_json_atomic(target, {"v": 2})
    assert json.loads(target.read_text()) == {"v": 2}
    assert os.listdir(tmp_path) == ["a.json"]


def test_atomic_write_refuses_nan_and_keeps_old_file(tmp_path):
    target = tmp_path / "a.json"
    write_json_atomic(target, {"v": 1})
    with pytest.raises(ValueError):
        write_json_atomic(target, {"v": float("nan")})
    assert json.loads(target.read_text()) == {"v": 1}
    assert os.listdir(tmp_path) == ["a.json"]


def test_heartbeat_records_progress(tmp_path):
    path = write_heartbeat(tmp_path, "run1", step=3, total_steps=10)
    beat = json.loads(path.read_text())
    assert beat["step"] == 3 and beat["total_steps"] == 10 and beat["run_id"] == "run1"


def test_a_cost_model_failure_is_recorded_in_the_trace():
    """The cost model refuses this layout (5 stages of a 4-layer model); the trace still validates,
    carries no prediction, and says why instead of a silent null."""
    from frontier_llm.bench.config import BenchConfig
    from frontier_llm.bench.run import skeleton_trace
    from frontier_llm.catalog import load_model, load_system
    from frontier_llm.specs.layout import Layout

    cfg = BenchConfig(model=load_model("tiny-gpt"), system=load_system("cpu-local"),
                      layout=Layout(pp=5, global_batch=5, dtype="fp32"), run_id="r1")
    trace = skeleton_trace(cfg, 5, "local", "gloo", "cpu", "2026-01-01T00:00:00+00:00")
    validate_trace(trace)
    assert trace["prediction"] is None
    assert trace["prediction_error"].startswith("cost model: SpecError: layers (4)")
    ok = BenchConfig(model=cfg.model, system=cfg.system, layout=Layout(pp=2, global_batch=2),
                     run_id="r2")
    trace = skeleton_trace(ok, 2, "local", "gloo", "cpu", "2026-01-01T00:00:00+00:00")
    assert trace["prediction"]["step_time_s"] > 0 and "prediction_error" not in trace
