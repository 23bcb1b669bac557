"""One layout on both engines, end to end: a local-executor sweep with
``engine: [native, deepspeed]`` (real flm bench runs of tiny-gpt, 2 gloo ranks each, real
DeepSpeed), flm collect into a real SQLite store, then flm results / flm validate --by-engine."""

from __future__ import annotations

import json

import pytest
from ds_cache import extension_dir

from frontier_llm.cli import main

pytestmark = [pytest.mark.slow]

SWEEP = """\
name: engines-tiny
model: tiny-gpt
system: cpu-local
executor: local
gpus: [2]
dtype: fp32
steps: 2
warmup: 0
global_batch: 4
resources:
  time: "00:05:00"
space:
  tp: [1]
  pp: [1]
  micro_batch: [2]
  zero: [1]
  engine: [native, deepspeed]
"""


@pytest.fixture
def extension_cache(monkeypatch) -> None:
    """DeepSpeed's C++ op in the one cache the DeepSpeed tests use (tests/ds_cache.py), so the
    suite builds it at most once."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", extension_dir())


def test_one_layout_on_both_engines_side_by_side(tmp_path, extension_cache, capsys):
    spec = tmp_path / "engines.yaml"
    spec.write_text(SWEEP)
    db = f"sqlite:///{tmp_path}/flm.db"
    out = tmp_path / "run"
    assert main(["sweep", "submit", str(spec), "--out", str(out), "--db", db]) == 0
    assert "submitted 2 jobs" in capsys.readouterr().out
    assert main(["sweep", "status", "engines-tiny", "--db", db, "--format", "json"]) == 0
    states = {r["job_key"]: r["state"] for r in json.loads(capsys.readouterr().out)}
    assert list(states.values()) == ["COMPLETED", "COMPLETED"], states
    assert main(["collect", str(out), "--db", db, "--quiet"]) == 0
    assert "2 new" in capsys.readouterr().out

    assert main(["results", "--db", db, "--by-engine", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 1  # one layout, both engines in its row
    row = rows[0]
    assert (row["dp"], row["micro_batch"], row["sharding"]) == (2, 2, "zero1")
    assert row["native_runs"] == row["deepspeed_runs"] == 1
    for engine in ("native", "deepspeed"):
        assert row[f"{engine}_step_time_s"] > 0 and row[f"{engine}_peak_memory_bytes"] > 0
    assert row["step_time_deepspeed_over_native"] == pytest.approx(
        row["deepspeed_step_time_s"] / row["native_step_time_s"])
    # Same seed, same data, fp32: the two engines train alike.
    assert row["deepspeed_final_loss"] == pytest.approx(row["native_final_loss"], abs=1e-5)

    assert main(["results", "--db", db, "--by-engine"]) == 0
    table = capsys.readouterr().out
    with capsys.disabled():
        print(table)  # the side-by-side table, for the record (pytest -s)
    assert table.splitlines()[0].split() == ["native", "deepspeed", "deepspeed/native"]

    assert main(["validate", "--db", db, "--by-engine", "--format", "json"]) == 0
    v = json.loads(capsys.readouterr().out)
    assert v["layouts"][0]["native_runs"] == v["layouts"][0]["deepspeed_runs"] == 1
    assert {s["engine"] for s in v["stats"]} == {"native", "deepspeed", "(all)"}
