"""Expert parallelism through sweeps, the store, results, reports and a study, with no code of
their own: the tiny MoE swept on the real one-node SLURM (flm bench's MoE block over gloo ranks
in every job), collected, shown with its ep; and a study that lists ep in its space."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from slurm_fixtures import flm
from sweep_texts import local_study

from frontier_llm.bench.trace import read_trace, trace_path
from frontier_llm.jobs.sweepspec import load_sweep
from frontier_llm.specs.layout import layout_argv
from frontier_llm.store import open_store
from frontier_llm.store.queries import runs_frame
from frontier_llm.tune.spec import load_study

SWEEP = Path(__file__).resolve().parents[1] / "sweeps" / "tiny-moe.yaml"


@pytest.mark.slurm
@pytest.mark.slow
def test_the_tiny_moe_sweep_runs_is_collected_and_reported(slurm_cluster, tmp_path):
    db = f"sqlite:///{tmp_path}/flm.db"
    out = tmp_path / "run"
    assert "submitted 3 jobs" in flm("sweep", "submit", SWEEP, "--out", out, "--db", db).stdout
    status = flm("sweep", "status", "tiny-moe", "--db", db, "--format", "json", "--wait",
                 "--timeout", 300, "--max-interval", 2, "--collect")
    rows = {r["job_key"]: r for r in json.loads(status.stdout)}
    assert {r["state"] for r in rows.values()} == {"COMPLETED"}, rows
    assert "3 new, 0 updated, 0 unchanged, 0 quarantined" in status.stderr
    for job in load_sweep(SWEEP).jobs:
        trace = read_trace(trace_path(out / "traces", rows[job.key]["run_id"]))
        assert trace["layout"].get("ep", 1) == job.layout.ep
        # Each rank's ep index, from the owner's coordinates; the experts' load per block.
        assert sorted({m["ep_rank"] for m in trace["memory"]}) == list(range(job.layout.ep))
        assert len(trace["moe"]["tokens_per_expert"]) == 2  # tiny-moe's two MoE blocks

    store = open_store(db)
    try:
        runs = runs_frame(store)
    finally:
        store.close()
    assert sorted(runs["ep"].tolist()) == [1, 2, 2]
    assert (runs["status"] == "completed").all() and (runs["predicted_step_time_s"] > 0).all()
    header = flm("results", "--db", db).stdout.splitlines()[0].split()
    assert "ep" in header, header
    report = tmp_path / "rep"
    flm("report", "layouts", "--db", db, "--sweep", "tiny-moe", "--out", report)
    csv = next(report.glob("*.csv")).read_text()
    assert "tp1 pp1 dp2 ep2 mb2 gb4" in csv and "tp1 pp1 dp4 ep2 mb1 gb4" in csv, csv


STUDY = local_study("moe-study", "tiny-moe", ["tp: [1]", "pp: [1]", "ep: [1, 2, 4]"])


def test_a_study_searches_ep_and_its_trial_runs_it(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(STUDY)
    study = load_study(path)
    c = study.candidates
    assert c.choices["ep"] == [1, 2, 4]
    ep4 = c.lookup({"ep": 4})
    assert ep4.layout is not None and (ep4.layout.dp, ep4.layout.ep) == (4, 4)
    trial = study.trial_sweep(1, ep4.layout_entry())
    job = trial.jobs[0]
    assert job.layout.ep == 4 and job.world_size == 4
    argv = layout_argv(job.layout)
    assert argv[argv.index("--ep") + 1] == "4"
