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
