"""The context-parallel degree through the layout's consumers, with no code of their own for it:
a study searches it and its trial runs it, ``flm plan --cp`` restricts to it, a report frame
counts its ranks, the label names it (real planner, real Optuna-facing candidates, real sweep
expansion; nothing is trained here)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from sweep_texts import local_study

from frontier_llm.cli import main
from frontier_llm.errors import SpecError
from frontier_llm.report.frames import add_seq_len
from frontier_llm.specs.forms import label, row_label
from frontier_llm.specs.layout import Layout, layout_argv
from frontier_llm.specs.model import ModelSpec
from frontier_llm.tune.spec import load_study

STUDY = local_study("cp-study", "tiny-gpt", ["tp: [1, 2]", "cp: [1, 2]", "pp: [1]"])


def test_a_study_searches_cp_and_its_trial_runs_it(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(STUDY)
    study = load_study(path)
    c = study.candidates
    assert c.choices["cp"] == [1, 2]
    cp2 = [x for x in c.all() if x.layout is not None and x.layout.cp == 2]
    assert {x.layout.dp for x in cp2} == {2, 1}  # tp1 cp2 dp2 and tp2 cp2 dp1 on 4 ranks
    # A proposal of tp 2 x cp 2 is the layout with dp 1, on the study's 4 ranks.
    both = c.lookup({"tp": 2, "cp": 2})
    assert both.layout is not None and (both.layout.dp, both.layout.world_size) == (1, 4)
    trial = study.trial_sweep(1, cp2[0].layout_entry())
    job = trial.jobs[0]
    assert job.layout.cp == 2 and job.world_size == 4
    argv = layout_argv(job.layout)
    assert argv[argv.index("--cp") + 1] == "2"


def test_flm_plan_restricts_to_cp(capsys):
    assert main(["plan", "--model", "tiny-gpt", "--system", "cpu-local", "--gpus", "8",
                 "--global-batch", "8", "--cp", "2", "--format", "csv", "--all"]) == 0
    frame = pd.read_csv(__import__("io").StringIO(capsys.readouterr().out))
    assert len(frame) and set(frame["cp"]) == {2}
    assert (frame["tp"] * frame["cp"] * frame["pp"] * frame["dp"] == 8).all()


def test_layout_refuses_cp_in_one_line():
    model = ModelSpec(name="m", layers=2, hidden=64, heads=4, seq_len=6, vocab=128)
    with pytest.raises(SpecError, match=r"seq_len \(6\) is not divisible by 2 x cp \(4\)"):
        Layout(cp=2).check_model(model)
    with pytest.raises(SpecError, match="engine deepspeed runs cp = 1 only"):
        Layout(cp=2, engine="deepspeed")
    with pytest.raises(SpecError, match=r"tp x cp x pp x dp = 1 x 2 x 1 x 1 = 2 does not match"):
        Layout(cp=2).check_world(4)
    with pytest.raises(SpecError, match=r"partial group \(4\) does not divide dp x cp"):
        Layout(cp=2, dp=1, sharding="p=partial:4,g=full,o=full")


def test_frames_and_labels_count_cp_ranks():
    layout = Layout(tp=2, cp=4, pp=2, dp=2, global_batch=4)
    assert label(layout) == "tp2 cp4 pp2 dp2 mb1 gb4"
    assert label(Layout(tp=2, dp=2, global_batch=2)) == "tp2 pp1 dp2 mb1 gb2"
    runs = pd.DataFrame([{"model": "m", "tp": 2, "cp": 4, "pp": 2, "dp": 2, "global_batch": 4,
                          "tokens_per_s": 400.0, "step_time_s": 1.0, "seq_len": 100}])
    assert int(add_seq_len(runs)["world_size"].iloc[0]) == 32
    # A frame from before the knob has no cp column: its rows split no sequence.
    old = runs.drop(columns="cp")
    assert int(add_seq_len(old)["world_size"].iloc[0]) == 8
    assert row_label(old.iloc[0]) == "tp2 pp2 dp2 mb1 gb4"


def test_a_sweep_file_lists_cp(tmp_path: Path):
    from frontier_llm.jobs.sweepspec import load_sweep

    text = ("name: cp\nsystem: cpu-local\nmodel: tiny-gpt\ngpus: [8]\nglobal_batch: 8\n"
            "dtype: fp32\nspace:\n  tp: [2]\n  pp: [1]\n  cp: [2, 4]\n  micro_batch: [1]\n"
            "  fits_only: false\n")
    path = tmp_path / "s.yaml"
    path.write_text(text)
    sweep = load_sweep(path)
    assert {(j.layout.cp, j.layout.dp) for j in sweep.jobs} == {(2, 2), (4, 1)}
    keys = sorted(j.key for j in sweep.jobs)
    assert "-cp2-" in keys[0] and "-cp4-" in keys[1], keys
