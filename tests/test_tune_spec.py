"""The study: section: parsing, file:line errors, the model's verdict on the space, and bad input
refused by the CLI with one line and exit 2 before anything is submitted (real SQLite, real
Optuna storage)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from sweep_texts import STUDY_HEADER

from frontier_llm.errors import SpecError
from frontier_llm.tune.space import NO_FIT
from frontier_llm.tune.spec import load_study

REPO = Path(__file__).resolve().parents[1]

STUDY = STUDY_HEADER.format(name="t-study", model="tiny-gpt") + """\
command: ["true"]
study:
  space:
    tp: [1, 2, 4]
    pp: [1, 2]
    micro_batch: [1, 2]
    zero: [0, 1]
    run:
      bucket_mb: [1, 64]
  objective: throughput_per_gpu
  budget: {trials: 4}
  sampler: tpe
  seed: 3
  in_flight: 2
  warm_start: 2
resources:
  time: "00:05:00"
"""


def write(tmp_path: Path, text: str = STUDY, name: str = "s.yaml", **replace: str) -> Path:
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    p = tmp_path / name
    p.write_text(text)
    return p


def flm(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "frontier_llm.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_study_loads_with_space_and_model_verdicts(tmp_path):
    s = load_study(write(tmp_path))
    assert s.name == "t-study" and s.gpus == 4 and s.global_batch == 8
    assert s.objectives == ("throughput_per_gpu",) and s.directions == ["maximize"]
    c = s.candidates
    assert set(c.choices) == {"tp", "pp", "micro_batch", "sharding", "run.bucket_mb"}
    assert c.choices["sharding"] == ["zero0", "zero1"]
    # tp 4 x pp 2 is not a layout of 4 ranks: a rule, with the rule's words.
    bad = c.lookup({"tp": 4, "pp": 2, "micro_batch": 1, "sharding": "zero0",
                    "run.bucket_mb": 1})
    assert bad.layout is None and "does not divide the 4 ranks" in bad.reason
    good = c.ranked(1)[0]
    assert good.fits and good.prediction["throughput_per_gpu"] > 0
    # The trial's sweep keeps the study file's line numbers and carries the run setting.
    sweep = s.trial_sweep(7, good.layout_entry())
    assert sweep.name == "t-study.t0007" and sweep.jobs[0].key == "t0007"
    assert "--bucket-mb" in sweep.jobs[0].bench_args
    assert s.trial_text(7, good.layout_entry()).count("\n") > STUDY.count("\n")


def test_memory_limit_makes_layouts_infeasible(tmp_path):
    """A model too big for the memory: the points are kept, flagged as predicted not to fit."""
    big = write(tmp_path, **{"model: tiny-gpt": "model: gpt3-6.7b"})
    with pytest.raises(SpecError, match=r"s\.yaml:\d+: the space holds no layout .* predicted "
                                        r"to fit"):
        load_study(big)
    s = load_study(write(tmp_path, name="ok.yaml"))
    assert all(c.reason != NO_FIT for c in s.candidates.feasible())


@pytest.mark.parametrize("old,new,line,words", [
    ("sampler: tpe", "sampler: bayes", 23, "sampler must be one of tpe, gp, nsgaii, random, grid"),
    ("budget: {trials: 4}", "budget: {trials: 0}", 22, "budget trials must be at least 1"),
    ("budget: {trials: 4}", "budget: {node_hours: 0}", 22, "node_hours must be above 0"),
    ("budget: {trials: 4}", "budget: {}", 22, "budget needs trials and/or node_hours"),
    ("    tp: [1, 2, 4]", "    tpp: [1, 2, 4]", 15, "unknown field 'tpp' for StudySpace (did you "
                                                       "mean 'tp'?)"),
    ("      bucket_mb: [1, 64]", "      bucket: [1, 64]", 20, "unknown run setting 'bucket'"),
    ("  objective: throughput_per_gpu", "  objective: [throughput_per_gpu, joules]", 21,
     "unknown objective 'joules'"),
    ("    tp: [1, 2, 4]", "    tp: [3]", 14, "no tp value divides the 4 ranks"),
    ("    micro_batch: [1, 2]", "    micro_batch: [16]", 14, "valid and predicted to fit "
     "(global_batch not divisible by micro_batch x dp: "),
    ("  in_flight: 2", "  in_flight: 0", 25, "in_flight must be at least 1"),
])
def test_bad_study_names_file_and_line(tmp_path, old, new, line, words):
    path = write(tmp_path, **{old: new})
    with pytest.raises(SpecError) as err:
        load_study(path)
    assert str(err.value).startswith(f"{path}:{line}: "), str(err.value)
    assert words in str(err.value)


def test_sweep_part_errors_keep_their_lines(tmp_path):
    path = write(tmp_path, **{'  time: "00:05:00"': '  time: "soon"'})
    with pytest.raises(SpecError, match=rf"^{path}:\d+: time must be a SLURM time limit"):
        load_study(path)
    path = write(tmp_path, name="top.yaml", **{"gpus: [4]": "gpus: [4]\nspace: auto"})
    with pytest.raises(SpecError, match=r"top\.yaml:7: a study's space goes under"):
        load_study(path)


def test_cli_refuses_bad_input_with_one_line_and_submits_nothing(tmp_path):
    db = tmp_path / "flm.db"
    for old, new in [("sampler: tpe", "sampler: bayes"), ("budget: {trials: 4}",
                                                          "budget: {trials: 0}"),
                     ("    tp: [1, 2, 4]", "    tp: [3]")]:
        path = write(tmp_path, **{old: new})
        res = flm(["tune", "step", str(path), "--db", str(db)], tmp_path)
        assert res.returncode == 2, res.stderr
        assert res.stderr.count("\n") == 1 and res.stderr.startswith("flm: error: ")
        assert not (tmp_path / "runs").exists()
    assert not db.exists() or optuna.get_all_study_summaries(f"sqlite:///{db}") == []


def test_existing_study_with_another_space_is_refused(tmp_path):
    from frontier_llm.store import open_store
    from frontier_llm.tune.driver import Tuner

    db = tmp_path / "flm.db"
    url = f"sqlite:///{db}"
    store = open_store(url)
    tuner = Tuner(load_study(write(tmp_path)), store, url)
    study = tuner.open()
    assert len(study.trials) == 2  # the warm start: the two layouts predicted fastest
    store.close()
    changed = write(tmp_path, name="changed.yaml", **{"    pp: [1, 2]": "    pp: [1, 2, 4]"})
    res = flm(["tune", "step", str(changed), "--db", str(db)], tmp_path)
    assert res.returncode == 2
    assert res.stderr.strip() == (f"flm: error: study t-study exists in {url} with a different "
                                  "space; give the changed study a new name (study: name: ...)")
    assert not (tmp_path / "runs").exists()
    assert all(t.state == optuna.trial.TrialState.WAITING
               for t in optuna.load_study(study_name="t-study", storage=url).trials)


def test_shipped_studies_load():
    shipped = sorted((REPO / "sweeps" / "studies").glob("*.yaml"))
    assert shipped
    for path in shipped:
        study = load_study(path)
        assert study.candidates.feasible()


@pytest.mark.parametrize(("space", "shardings"), [
    ("    sharding: [zero1, 'p=full,g=full,o=full']\n", {"zero1", "zero3"}),
    ("", {"zero0"}),  # left out: the layout's default
])
def test_sharding_named_or_left_out(tmp_path, space, shardings):
    """A space may name shardings (a ZeRO preset or the p=..,g=..,o=.. form) instead of ZeRO
    stages, or leave them out; before, both ended in an AttributeError."""
    s = load_study(write(tmp_path, **{"    zero: [0, 1]\n": space}))
    assert {c.layout.sharding.describe() for c in s.candidates.feasible()} == shardings
