"""Issue 29 item 5: a real trainer swept end to end here. The user's DeepSpeed script
(examples/deepspeed_gpt/train.py, which imports no frontier_llm) runs in every job of a sweep
with ``workload: deepspeed`` on the real one-node SLURM, 2 CPU ranks over gloo per layout; the
jobs turn what DeepSpeed printed into traces, ``flm sweep status --collect`` stores them in a
real SQLite database, and ``flm results`` / ``flm validate`` read them back with the planner's
prediction beside them."""

from __future__ import annotations

import importlib.metadata
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from ds_cache import extension_dir
from slurm_fixtures import flm, slurm_conf, start_cluster, stop_cluster, sweep_status, wait_for

from frontier_llm.bench.trace import read_trace, trace_path

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "examples" / "deepspeed_gpt" / "train.py"
ITERS = 30  # steps_per_print is 10 (flm export): three throughput lines, the first warm-up

# tiny-gpt's shape (catalog/models/tiny-gpt.yaml), given to the script as a user would: the
# ds_config holds no model shape.
SWEEP = """\
name: ds-e2e
model: tiny-gpt
system: cpu-local
template: local
gpus_per_node: 4
dtype: fp32
steps: {iters}
warmup: 0
global_batch: 8
workload: deepspeed
workload_command: [{python}, {train}, --num-layers, "4", --hidden-size, "64",
                   --num-attention-heads, "4", --seq-length, "32", --vocab-size, "256",
                   --train-iters, "{iters}"]
resources:
  time: "00:05:00"
layouts:
  - {{dp: 2, micro_batch: 2, zero: 1, engine: deepspeed, name: dp2-zero1}}
  - {{dp: 2, micro_batch: 4, zero: 0, engine: deepspeed, name: dp2-zero0}}
"""


@pytest.fixture(scope="module")
def slurm_cluster():
    """A cluster of this module's own whose job ids start at a random number. A job's rendezvous
    port is 20000 + its job id % 12768 (the job script's MASTER_PORT), and every test cluster's
    ids start at 1: another session's SLURM tests on this host held job 2's port 20002 while
    ours ran (EADDRINUSE at gloo's rendezvous, seen here). Ids from a random start keep the
    ports of concurrent clusters apart."""
    first = random.randrange(1000, 12000)
    env = {**os.environ, "FLM_SLURM_EXTRA_CONF": f"FirstJobId={first}"}
    cluster = start_cluster("flm-slurm-trainer-", env)
    try:
        with slurm_conf(cluster):
            yield cluster
    finally:
        stop_cluster(cluster.directory)


@pytest.fixture(scope="module")
def ds_env() -> dict[str, str]:
    """The jobs' environment (sbatch exports the submitter's): DeepSpeed's C++ op in the tests'
    cache (tests/ds_cache.py), this Python first on PATH (the job's python3 runs
    the log-to-trace step and must import frontier_llm)."""
    cache = extension_dir()
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return dict(os.environ, TORCH_EXTENSIONS_DIR=cache, PATH=path, OMP_NUM_THREADS="1",
                PYTHONPATH=os.pathsep.join(filter(None, [str(REPO),
                                                         os.environ.get("PYTHONPATH")])))


def test_a_deepspeed_sweep_runs_is_collected_and_reported(slurm_cluster, tmp_path, ds_env):
    db = f"sqlite:///{tmp_path}/flm.db"
    out = tmp_path / "run"
    spec = tmp_path / "ds-e2e.yaml"
    spec.write_text(SWEEP.format(iters=ITERS, python=sys.executable, train=TRAIN))
    env = {**ds_env, "SLURM_CONF": str(slurm_cluster.conf)}
    submitted = flm("sweep", "submit", spec, "--out", out, "--db", db, env=env)
    assert "submitted 2 jobs" in submitted.stdout

    status = flm("sweep", "status", "ds-e2e", "--db", db, "--format", "json", "--wait",
                 "--timeout", 120, "--max-interval", 1, "--collect", env=env)
    rows = {r["job_key"]: r for r in json.loads(status.stdout)}
    assert {k: r["state"] for k, r in rows.items()} == {"dp2-zero1": "COMPLETED",
                                                        "dp2-zero0": "COMPLETED"}, rows
    assert "collected 2 trace files" in status.stderr and "2 new" in status.stderr

    version = importlib.metadata.version("deepspeed")
    for key, zero, micro in (("dp2-zero1", 1, 2), ("dp2-zero0", 0, 4)):
        run_id = rows[key]["run_id"]
        trainer_log = (out / "traces" / f"{run_id}.trainer.log").read_text()
        # What DeepSpeed itself printed: its version, and its throughput line at every 10th step.
        assert f"DeepSpeed info: version={version}" in trainer_log
        assert trainer_log.count("CurrSamplesPerSec=") == ITERS // 10
        trace = read_trace(trace_path(out / "traces", run_id))
        assert trace["status"] == "completed", trace.get("error")
        assert trace["labels"]["trainer"] == "deepspeed"
        assert trace["labels"]["job_key"] == key and trace["labels"]["sweep"] == "ds-e2e"
        assert trace["environment"]["versions"]["trainer"] == f"deepspeed {version}"
        layout = trace["layout"]
        assert (layout["dp"], layout["tp"], layout["pp"], layout["micro_batch"]) == \
            (2, 1, 1, micro)
        assert layout["global_batch"] == 8 and layout["zero_stage"] == zero
        measured = [s for s in trace["steps"] if not s.get("warmup")]
        assert [s["step"] for s in trace["steps"]] == [10, 20, 30]
        assert len(measured) == 2 and all(s["time_s"] > 0 for s in measured)
        assert trace["summary"]["step_time_s"] > 0
        assert trace["prediction"]["step_time_s"] > 0

    results = json.loads(flm("results", "--db", db, "--sweep", "ds-e2e", "--format", "json",
                             env=env).stdout)
    assert len(results) == 2 and {r["status"] for r in results} == {"completed"}
    assert all(r["step_time_s"] > 0 for r in results), results

    validate = json.loads(flm("validate", "--db", db, "--sweep", "ds-e2e", "--format", "json",
                              env=env).stdout)
    runs = validate["runs"]
    assert len(runs) == 2, validate
    assert all(r["predicted_step_time_s"] > 0 and r["measured_step_time_s"] > 0 for r in runs)


def test_a_trainer_job_ended_by_slurm_keeps_the_steps_it_printed(slurm_cluster, tmp_path,
                                                                  ds_env):
    # scancel ends a job as its time limit does (SIGTERM to every process of it, SIGKILL
    # KillWait later), without waiting a minute for one: the trace must still be written, from
    # the lines printed before, as a timeout (the scheduler's state says cancelled).
    db = f"sqlite:///{tmp_path}/flm.db"
    out = tmp_path / "run"
    spec = tmp_path / "ds-stop.yaml"
    text = SWEEP.format(iters=100_000, python=sys.executable, train=TRAIN)
    text = text.replace("name: ds-e2e", "name: ds-stop").split("  - {dp: 2, micro_batch: 4")[0]
    spec.write_text(text)
    env = {**ds_env, "SLURM_CONF": str(slurm_cluster.conf)}
    flm("sweep", "submit", spec, "--out", out, "--db", db, env=env)
    row = sweep_status("ds-stop", db, env=env)["dp2-zero1"]
    log = out / "traces" / f"{row['run_id']}.trainer.log"
    wait_for(lambda: log.exists() and log.read_text().count("CurrSamplesPerSec=") >= 2, 60,
             "two throughput lines from the trainer")
    subprocess.run(["scancel", row["scheduler_job_id"]], check=True, env=env, timeout=30)

    status = flm("sweep", "status", "ds-stop", "--db", db, "--format", "json", "--wait",
                 "--timeout", 60, "--max-interval", 1, "--collect", env=env)
    (row,) = json.loads(status.stdout)
    assert row["state"] == "CANCELLED", row
    trace = read_trace(trace_path(out / "traces", row["run_id"]))
    assert trace["status"] == "timeout"
    assert "stopped by SIGTERM" in trace["error"]
    assert len(trace["steps"]) >= 2 and trace["summary"]["step_time_s"] > 0


def test_flm_tune_runs_trainer_trials_and_exports_the_winner(slurm_cluster, tmp_path, ds_env):
    # A study whose trials are the user's DeepSpeed script (issue 29 item 2: flm tune works
    # unchanged): two trials on the real SLURM, measured from DeepSpeed's own lines, and the
    # winner exported back to a ds_config with flm export --from-best.
    db = f"sqlite:///{tmp_path}/flm.db"
    study = SWEEP.format(iters=ITERS, python=sys.executable, train=TRAIN)
    study = study.replace("name: ds-e2e", "name: ds-tune").replace("template: local",
                                                                  "template: local\ngpus: [2]")
    study = study.split("layouts:")[0] + (
        "study:\n  space: {tp: [1], pp: [1], micro_batch: [2, 4], zero: [0, 1], "
        "engine: [deepspeed]}\n  objective: throughput_per_gpu\n  budget: {trials: 2}\n"
        "  sampler: random\n  seed: 0\n  in_flight: 2\n")
    spec = tmp_path / "study.yaml"
    spec.write_text(study)
    env = {**ds_env, "SLURM_CONF": str(slurm_cluster.conf)}
    flm("tune", "run", spec, "--db", db, "--out", tmp_path / "runs", "--poll", 1,
        "--timeout", 120, env=env)
    status = json.loads(flm("tune", "status", "ds-tune", "--db", db, "--format", "json",
                            env=env).stdout)
    assert status["by_outcome"].get("measured") == 2, status
    best = status["best"]
    assert best["measured"]["step_time_s"] > 0 and best["layout"]["engine"] == "deepspeed"
    # The trial's own folder (runs/t000N) holds the trace its job wrote from DeepSpeed's log.
    trial_dir = tmp_path / "runs" / best["sweep"].split(".")[-1]
    trace = read_trace(trace_path(trial_dir / "traces", best["run_id"]))
    assert trace["labels"]["trainer"] == "deepspeed" and trace["status"] == "completed"
    winner = tmp_path / "best.yaml"
    winner.write_text(flm("tune", "best", "ds-tune", "--db", db, "--format", "yaml",
                          env=env).stdout)
    config = json.loads(flm("export", "--to", "deepspeed", "--model", "tiny-gpt", "--system",
                            "cpu-local", "--from-best", winner, env=env).stdout)
    assert config["train_micro_batch_size_per_gpu"] == best["layout"]["micro_batch"]
    assert config["zero_optimization"]["stage"] == (
        0 if best["layout"]["sharding"]["optim"] == "replicate" else 1)
