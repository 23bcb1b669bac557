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


# -- the planner's MoE layouts, rendered only where flm bench runs them ---------------------------
TOP_SPACE = ("space:\n  ep: [1, 2, 4]\n  cp: [1, 2]\n  recompute: [none, selective-op, full]\n"
             "  zero: [0, 1, 2, 3]\n  engine: [native, deepspeed]\n  top: 12\n")


def test_an_moe_sweep_of_the_planners_top_layouts_renders_only_what_bench_runs(tmp_path):
    """`flm sweep render` of the planner's fastest tiny-moe layouts on four CPU ranks: every
    rendered job passes the check flm bench makes at its start (bench/engines.py ``check``,
    with the job's world size), the layouts bench used to refuse (ep 2 with ZeRO/FSDP2
    sharding and recompute, cp 2) are among them, and what no engine runs (MoE on the
    DeepSpeed engine: its rules keep ep 1, specs/engine_rules.py) is left out under that
    reason before bench is asked."""
    from frontier_llm.bench.engines import check
    from frontier_llm.catalog import load_model
    from frontier_llm.specs.layout import Layout

    path = tmp_path / "top.yaml"
    path.write_text("name: moe-top\nmodel: tiny-moe\nsystem: cpu-local\ntemplate: local\n"
                    "executor: slurm\ngpus_per_node: 4\ngpus: [4]\nglobal_batch: 4\n"
                    "dtype: fp32\n" + TOP_SPACE)
    out = tmp_path / "out"
    flm("sweep", "render", path, "--out", out)
    manifest = json.loads((out / "manifest.json").read_text())
    model = load_model("tiny-moe")
    layouts = [Layout.from_dict(job["layout"]) for job in manifest["jobs"]]
    assert len(layouts) == 12
    for job, layout in zip(manifest["jobs"], layouts, strict=True):
        check(model, layout, job["world_size"])  # raises on a layout bench refuses
    assert any(x.ep == 2 and x.sharding.describe() != "zero0" for x in layouts)
    assert any(x.ep == 2 and str(x.recompute) == "selective-op" for x in layouts)
    assert manifest["skipped"].get("engine deepspeed runs ep = 1 only", 0) > 0, \
        manifest["skipped"]
    assert not any(x.engine == "deepspeed" and x.ep > 1 for x in layouts)


def test_a_catalog_moe_sweep_keeps_the_planners_order_among_what_bench_runs(tmp_path):
    """Mixtral 8x7B on 64 Frontier GCDs, native and Megatron layouts: the sweep holds the
    planner's 40 fastest layouts that flm bench runs (engine native, cp 2 included), in the
    planner's order; the Megatron ones are counted out under bench's reason."""
    from frontier_llm.bench.engines import check

    path = tmp_path / "mixtral.yaml"
    path.write_text("name: mixtral-top\nmodel: mixtral-8x7b\nsystem: frontier\ngpus: [64]\n"
                    "global_batch: 256\ndtype: bf16\nspace:\n  ep: [1, 2, 4, 8]\n  cp: [1, 2]\n"
                    "  engine: [native, megatron]\n  top: 40\n")
    sweep = load_sweep(path)
    assert len(sweep.jobs) == 40
    for job in sweep.jobs:
        check(job.model, job.layout, job.world_size)
    assert {j.layout.cp for j in sweep.jobs} == {1, 2}
    assert max(j.layout.ep for j in sweep.jobs) == 8
    # As the planner ranks them: those that surely fit first, then fastest first.
    keys = [(j.prediction["memory_tight"], -j.prediction["tokens_per_s"]) for j in sweep.jobs]
    assert keys == sorted(keys)
    assert sweep.skipped["flm bench refuses it: flm bench runs the engines native, deepspeed; "
                         "engine megatron is for planning only"] > 0


def test_a_listed_moe_layout_bench_refuses_is_refused_when_the_sweep_loads(tmp_path):
    """A listed layout flm bench would refuse at its start fails the sweep at load (render,
    submit), naming the layout and bench's reason: cp with a capacity factor, whose drops
    would be per cp rank."""
    from frontier_llm.errors import SpecError

    model = tmp_path / "capped.yaml"
    model.write_text("name: capped-moe\nlayers: 2\nhidden: 64\nheads: 4\nkv_heads: 2\n"
                     "seq_len: 32\nvocab: 256\nffn_hidden: 128\nnum_experts: 4\ntop_k: 2\n"
                     "capacity_factor: 1.0\n")
    path = tmp_path / "listed.yaml"
    path.write_text(f"name: listed\nmodel: {model}\nsystem: cpu-local\ntemplate: local\n"
                    "executor: slurm\ngpus_per_node: 4\ndtype: fp32\nglobal_batch: 4\n"
                    "layouts:\n  - {dp: 2, ep: 2}\n  - {dp: 2, cp: 2, ep: 2}\n")
    with pytest.raises(SpecError, match=r"flm bench refuses this layout: cp 2 with "
                                        r"capacity_factor 1.0"):
        load_sweep(path)
    path.write_text(path.read_text().replace("  - {dp: 2, cp: 2, ep: 2}\n", ""))
    assert [j.layout.ep for j in load_sweep(path).jobs] == [2]


def test_a_study_of_an_moe_model_offers_only_layouts_bench_runs(tmp_path):
    """A study's trials run flm bench: its candidates leave out what bench refuses at its start
    (MoE on the DeepSpeed engine), under bench's reason, so no trial sweep fails to load."""
    path = tmp_path / "s.yaml"
    path.write_text(local_study("moe-engines", "tiny-moe",
                                ["tp: [1]", "pp: [1]", "ep: [1, 2]",
                                 "engine: [native, deepspeed]"]))
    c = load_study(path).candidates
    refused = c.lookup({"ep": 1, "engine": "deepspeed"})  # the planner allows it at ep 1
    assert refused.layout is None and refused.reason.startswith("flm bench refuses it: ")
    assert "DeepSpeed-MoE is not wired in" in refused.reason
    assert {str(x.layout.engine) for x in c.all() if x.layout is not None} == {"native"}
    assert c.lookup({"ep": 2, "engine": "native"}).layout is not None
