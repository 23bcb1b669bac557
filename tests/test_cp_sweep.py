"""A context-parallel layout end to end on this machine: a sweep lists it, the local executor
runs ``flm bench --cp 2`` (real gloo ranks), ``flm sweep status --collect`` stores its trace,
and ``flm results`` and ``flm report layouts`` show it with its prediction beside it."""

from __future__ import annotations

import json

import pytest
from sweep_texts import local_sweep

from frontier_llm.cli import main
from frontier_llm.store import open_store
from frontier_llm.store.queries import runs_frame

pytestmark = [pytest.mark.slow]


def test_a_cp_layout_is_swept_collected_and_reported(tmp_path, capsys):
    spec = tmp_path / "cp.yaml"
    spec.write_text(local_sweep("cp-tiny", ["{cp: 2, dp: 1, micro_batch: 4, name: cp2}",
                                            "{cp: 1, dp: 2, micro_batch: 2, name: dp2}"]))
    db = f"sqlite:///{tmp_path}/flm.db"
    assert main(["sweep", "submit", str(spec), "--out", str(tmp_path / "run"), "--db", db,
                 "--max-in-flight", "1"]) == 0
    assert "submitted 2 jobs" in capsys.readouterr().out
    assert main(["sweep", "status", "cp-tiny", "--db", db, "--format", "json", "--wait",
                 "--timeout", "120", "--collect"]) == 0
    rows = {r["job_key"]: r for r in json.loads(capsys.readouterr().out)}
    assert {k: r["state"] for k, r in rows.items()} == {"cp2": "COMPLETED", "dp2": "COMPLETED"}

    runs = runs_frame(open_store(db))
    cp2 = runs[runs["cp"] == 2]
    assert len(cp2) == 1 and len(runs) == 2
    row = cp2.iloc[0]
    assert (row["tp"], row["pp"], row["dp"]) == (1, 1, 1) and row["world_size"] == 2
    assert row["status"] == "completed" and row["step_time_s"] > 0
    assert row["predicted_step_time_s"] > 0  # the cost model priced the cp layout

    assert main(["results", "--db", db]) == 0
    header = capsys.readouterr().out.splitlines()[0].split()
    assert "cp" in header, header
    out = tmp_path / "rep"
    assert main(["report", "layouts", "--db", db, "--sweep", "cp-tiny", "--out", str(out)]) == 0
    capsys.readouterr()
    csv = next(out.glob("*.csv")).read_text()
    assert "tp1 cp2 pp1 dp1 mb4 gb4" in csv, csv
