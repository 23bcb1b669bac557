"""The ask/tell driver over real jobs (local processes), real Optuna storage in the results
database (SQLite and PostgreSQL), real concurrent ``flm tune step`` processes.

Jobs here run a shell command in place of flm bench (``command:`` of the sweep file) where the
test is about the driver, not the measurement: the job's exit code is real and is classified by
the same code as any job (exit 3 = flm bench's out-of-memory status)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from sqlalchemy import select
from sweep_texts import STUDY_HEADER

from frontier_llm.store import open_store
from frontier_llm.store.schema import flm_jobs, flm_sweeps
from frontier_llm.tune import optuna_study as osx
from frontier_llm.tune.driver import Tuner
from frontier_llm.tune.spec import load_study

REPO = Path(__file__).resolve().parents[1]

STUDY = STUDY_HEADER + """\
command: [sh, -c, "{script}"]
study:
  space:
    tp: [1, 2, 4]
    pp: [1, 2]
    micro_batch: [1, 2]
    zero: [0, 1]
  budget: {{trials: {trials}}}
  sampler: {sampler}
  seed: 1
  in_flight: {in_flight}
  warm_start: {warm}
"""


def study_file(tmp_path: Path, *, name: str = "drv", model: str = "tiny-gpt",
               script: str = "sleep 0.2", trials: int = 6, sampler: str = "tpe",
               in_flight: int = 2, warm: int = 2) -> Path:
    p = tmp_path / f"{name}.yaml"
    p.write_text(STUDY.format(name=name, model=model, script=script, trials=trials,
                              sampler=sampler, in_flight=in_flight, warm=warm))
    return p


def drive(path: Path, url: str, out: Path, timeout_s: float = 240) -> Tuner:
    store = open_store(url)
    tuner = Tuner(load_study(path), store, url, out=out)
    deadline = time.monotonic() + timeout_s
    while not tuner.step().finished:
        assert time.monotonic() < deadline, "study did not finish"
        time.sleep(0.3)
    store.close()
    return tuner


def job_rows(url: str, study: str) -> list[dict]:
    store = open_store(url)
    with store.read() as conn:
        rows = conn.execute(select(flm_sweeps.c.name, flm_jobs.c.attempts, flm_jobs.c.state)
                            .join(flm_jobs, flm_jobs.c.sweep_id == flm_sweeps.c.id)
                            .where(flm_sweeps.c.name.like(f"{study}.t%"))).mappings().all()
    store.close()
    return [dict(r) for r in rows]


STEPPER = textwrap.dedent("""
    import sys, time
    from frontier_llm.cli import main
    import contextlib, io
    deadline = time.monotonic() + 240
    steps = 0
    while time.monotonic() < deadline:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            code = main(["tune", "step", sys.argv[1], "--db", sys.argv[2], "--out", sys.argv[3]])
        steps += 1
        assert code == 0, code
        if "finished:" in buf.getvalue():
            break
    print("steps", steps)
""")


def test_concurrent_steps_never_submit_a_trial_twice(tmp_path, db_url):
    """Two processes run `flm tune step` in a loop at the same time on one study: the budget
    (8 jobs) is spent exactly, each trial's job is submitted once, every trial is told."""
    path = study_file(tmp_path, name="conc", trials=8, in_flight=3, sampler="random")
    out = tmp_path / "runs"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", STEPPER, str(path), db_url, str(out)],
                              env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [p.communicate(timeout=300) for p in procs]
    for p, (o, e) in zip(procs, results, strict=True):
        assert p.returncode == 0, e
        assert int(o.split()[-1]) >= 2  # each process stepped while the other did
    rows = job_rows(db_url, "conc")
    assert len(rows) == 8, rows
    assert all(r["attempts"] == 1 for r in rows)
    assert len({r["name"] for r in rows}) == 8
    # One log file per job: nothing was started twice.
    assert sorted(len(list(d.glob("logs/*/*.out"))) for d in out.glob("t*")) == [1] * 8
    trials = optuna.load_study(study_name="conc", storage=db_url).trials
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    with_jobs = [t for t in trials if osx.A_SWEEP in t.user_attrs]
    assert sorted(t.user_attrs[osx.A_SWEEP] for t in with_jobs) == sorted(r["name"]
                                                                          for r in rows)


def test_model_in_the_loop_and_job_outcomes(tmp_path):
    """gpt3-350m on 4 CPU ranks of 4 GB: layouts without enough TP or ZeRO do not fit. Those are
    told as infeasible with the prediction and never run; the warm start is the model's top 2;
    jobs that exit 3 (flm bench's OOM status) are constraint violations with their class."""
    url = f"sqlite:///{tmp_path / 'flm.db'}"
    path = study_file(tmp_path, name="oom", model="gpt3-350m", script="exit 3", trials=4,
                      sampler="random")
    sf = load_study(path)
    top = [c.params for c in sf.candidates.ranked(2)]
    assert any(not c.fits for c in sf.candidates.all())
    drive(path, url, tmp_path / "runs")
    trials = optuna.load_study(study_name="oom", storage=url).trials
    assert [dict(t.params) for t in trials[:2]] == top
    predicted = [t for t in trials if t.user_attrs.get(osx.A_OUTCOME) == "predicted_oom"]
    assert predicted, "the sampler never proposed a layout the model rejects"
    for t in predicted:
        assert osx.A_SWEEP not in t.user_attrs
        assert t.user_attrs[osx.A_PREDICTION]["fits"] is False
        assert t.system_attrs["constraints:fits"] > 0
        assert not sf.candidates.lookup(t.params).fits
    jobs = [t for t in trials if osx.A_SWEEP in t.user_attrs]
    assert len(jobs) == 4 and len(job_rows(url, "oom")) == 4
    for t in jobs:
        assert sf.candidates.lookup(t.params).fits
        assert t.user_attrs[osx.A_CLASSIFICATION] == "OOM"
        assert t.user_attrs[osx.A_OUTCOME] == "oom"
        assert t.state == TrialState.COMPLETE and t.system_attrs["constraints:fits"] == 1.0
        assert t.user_attrs["flm_job_row"] is not None


def test_failed_jobs_are_failed_trials_with_their_reason(tmp_path):
    url = f"sqlite:///{tmp_path / 'flm.db'}"
    path = study_file(tmp_path, name="fail", script="echo 'RuntimeError: boom' >&2; exit 1",
                      trials=2, warm=0)
    drive(path, url, tmp_path / "runs")
    jobs = [t for t in optuna.load_study(study_name="fail", storage=url).trials
            if osx.A_SWEEP in t.user_attrs]
    assert len(jobs) == 2
    for t in jobs:
        assert t.state == TrialState.FAIL
        assert t.user_attrs[osx.A_CLASSIFICATION] == "FAILED"
        assert "RuntimeError: boom" in t.user_attrs[osx.A_REASON]


def _proposals(sf, seed: int, n: int, reload_each: bool) -> list[dict]:
    """Ask n proposals that need a measurement, telling each its predicted throughput (the
    objective does not matter here, only the sequence of proposals)."""
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(storage=storage, direction="maximize", study_name="s")
    osx.warm_start(study, sf.candidates, 1)
    out = []
    for _ in range(n):
        if reload_each:  # a fresh process per step, as `flm tune step` from cron
            study = optuna.load_study(study_name="s", storage=storage)
        p = osx.ask_next(study, sf.candidates, sampler="tpe", seed=seed,
                         objectives=("throughput_per_gpu",), in_flight=set())
        assert p is not None
        out.append(dict(p.candidate.params))
        study._storage.set_trial_user_attr(p.trial_id, osx.A_KEY, p.candidate.key)
        study._storage.set_trial_user_attr(p.trial_id, osx.A_OUTCOME, "measured")
        osx.constrain(study, p.trial_id, 0.0)
        study.tell(p.number, [p.candidate.prediction["throughput_per_gpu"]])
    return out


def test_same_seed_same_proposals(tmp_path):
    sf = load_study(study_file(tmp_path))
    a = _proposals(sf, 7, 14, reload_each=False)
    assert a == _proposals(sf, 7, 14, reload_each=False)
    assert a == _proposals(sf, 7, 14, reload_each=True)
    assert a != _proposals(sf, 8, 14, reload_each=False)
    assert len({str(p) for p in a}) == len(a)  # nothing measured twice


@pytest.mark.parametrize("sampler", ["gp", "nsgaii", "random", "grid"])
def test_every_sampler_proposes(tmp_path, sampler):
    sf = load_study(study_file(tmp_path, sampler=sampler))
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(storage=storage, direction="maximize")
    seen = set()
    for _ in range(4):
        p = osx.ask_next(study, sf.candidates, sampler=sampler, seed=0,
                         objectives=("throughput_per_gpu",), in_flight=set())
        assert p is not None and p.candidate.fits and p.candidate.key not in seen
        seen.add(p.candidate.key)
        study._storage.set_trial_user_attr(p.trial_id, osx.A_OUTCOME, "measured")
        study._storage.set_trial_user_attr(p.trial_id, osx.A_KEY, p.candidate.key)
        osx.constrain(study, p.trial_id, 0.0)
        study.tell(p.number, [p.candidate.prediction["throughput_per_gpu"]])


def test_two_objectives_and_node_hours_budget(tmp_path):
    """[throughput_per_gpu, peak_memory] with NSGA-II; a node-hours budget stops the study
    (each trial is told two values; the budget is read back from the job rows)."""
    url = f"sqlite:///{tmp_path / 'flm.db'}"
    text = STUDY.format(name="two", model="tiny-gpt", script="sleep 1", trials=50,
                        sampler="nsgaii", in_flight=1, warm=1)
    text = text.replace("  budget: {trials: 50}", "  budget: {node_hours: 0.0004}\n"
                        "  objective: [throughput_per_gpu, peak_memory]")
    path = tmp_path / "two.yaml"
    path.write_text(text)
    tuner = drive(path, url, tmp_path / "runs")
    study = optuna.load_study(study_name="two", storage=url)
    assert [d.name for d in study.directions] == ["MAXIMIZE", "MINIMIZE"]
    jobs = [t for t in study.trials if osx.A_SWEEP in t.user_attrs]
    # 0.0004 node-hours = 1.44 s: a job of at least 1 s each, so 2 jobs or a few more.
    assert 1 <= len(jobs) < 10
    assert sum(t.user_attrs["flm_node_hours"] for t in jobs) >= 0.0004
    assert all(len(t.values) == 2 for t in study.trials if t.state == TrialState.COMPLETE)
    assert tuner.sf.objectives == ("throughput_per_gpu", "peak_memory")


def test_step_resumes_what_a_killed_driver_left(tmp_path):
    """The states a SIGKILL can leave between two database writes, made with Optuna's own calls:
    a trial asked but never submitted is submitted by the next step (once); a trial killed
    inside ask, with half its parameters drawn, is failed as interrupted."""
    url = f"sqlite:///{tmp_path / 'flm.db'}"
    path = study_file(tmp_path, name="res", trials=2, in_flight=2, warm=0)
    store = open_store(url)
    tuner = Tuner(load_study(path), store, url, out=tmp_path / "runs")
    study = tuner.open()
    asked = study.ask(tuner.sf.candidates.distributions)
    while not tuner.sf.candidates.lookup(asked.params).fits:  # the first that needs a job
        study.tell(asked, [0.0])
        asked = study.ask(tuner.sf.candidates.distributions)
    half = study._storage.create_new_trial(study._study_id)
    study._storage.set_trial_param(half, "tp", 0, tuner.sf.candidates.distributions["tp"])
    report = tuner.step()
    assert report.adopted == 1
    trials = {t.number: t for t in optuna.load_study(study_name="res", storage=url).trials}
    assert trials[asked.number].user_attrs[osx.A_SWEEP] == f"res.t{asked.number:04d}"
    interrupted = [t for t in trials.values() if t.user_attrs.get(osx.A_OUTCOME) ==
                   "interrupted"]
    assert len(interrupted) == 1 and interrupted[0].state == TrialState.FAIL
    store.close()
    drive(path, url, tmp_path / "runs")
    rows = job_rows(url, "res")
    assert len(rows) == 2 and all(r["attempts"] == 1 for r in rows)


def test_a_told_trial_that_wins_carries_its_layout_into_tune_best(tmp_path):
    """A sweep's completed run told to the study (Tuner.tell_sweep_runs, as the quickstart does)
    can be the best trial: ``flm tune best`` must give its layout and flm bench line, not
    ``layout: {}`` and a 1-GPU default, and ``flm export --from-best`` must not write that.
    The run is a real 4-rank flm bench of the study's first feasible layout, collected with
    flm collect under the sweep's label."""
    import yaml

    from frontier_llm.child import flm
    from frontier_llm.cli import main
    from frontier_llm.specs.forms import bench_command
    from frontier_llm.tune import report

    url = f"sqlite:///{tmp_path / 'flm.db'}"
    spec = load_study(study_file(tmp_path, name="told", trials=1))
    cand = next(iter(spec.candidates.feasible()))
    traces = tmp_path / "traces"
    argv = [*flm(["bench"]), "--model", "tiny-gpt", "--dtype", "fp32", "--steps", "2",
            "--warmup", "1", *bench_command(cand.layout, dict(cand.run)).split(),
            "--trace-dir", str(traces), "--label", "sweep=measured-before"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert main(["collect", str(traces), "--db", url, "--quiet"]) == 0
    store = open_store(url)
    tuner = Tuner(spec, store, url, out=tmp_path / "out")
    assert tuner.tell_sweep_runs("measured-before") == 1
    store.close()
    study = optuna.load_study(study_name="told", storage=url)
    doc = report.best_document(study)
    assert doc["layout"]["tp"] == cand.layout.tp and doc["layout"]["dp"] == cand.layout.dp
    assert doc["layout"]["micro_batch"] == cand.layout.micro_batch
    assert f"--dp {cand.layout.dp}" in doc["flm_bench"]
    best = tmp_path / "best.yaml"
    best.write_text(yaml.safe_dump(doc))
    out = tmp_path / "job.yaml"
    assert main(["export", "--to", "megatron-deepspeed", "--model", "tiny-gpt",
                 "--from-best", str(best), "--out", str(out)]) == 0


def test_tune_best_refuses_a_winner_without_a_layout(tmp_path):
    """A study told before trials carried their layout (an older flm): its winner has none, and
    flm tune best says so instead of printing ``layout: {}`` and a 1-GPU command line."""
    from frontier_llm.errors import UserError
    from frontier_llm.tune import report

    study = optuna.create_study(study_name="old", direction="maximize")
    t = optuna.trial.create_trial(value=5.0, user_attrs={osx.A_OUTCOME: "measured"})
    study.add_trial(t)
    with pytest.raises(UserError, match="no layout"):
        report.best_document(study)


def test_export_from_best_refuses_an_empty_layout(tmp_path, capsys):
    """What an older flm tune best wrote for a told winner (``layout: {}``) is refused, not
    exported as a 1-GPU, batch-1 config."""
    from frontier_llm.cli import main

    best = tmp_path / "best.yaml"
    best.write_text("study: s\nlayout: {}\nbench_args: {}\n")
    code = main(["export", "--to", "megatron-deepspeed", "--model", "tiny-gpt",
                 "--from-best", str(best), "--out", str(tmp_path / "x")])
    assert code != 0 and not (tmp_path / "x").exists()
    assert "layout is empty" in capsys.readouterr().err
