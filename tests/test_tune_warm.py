"""The model's part in a study's start: one knob list derived from Layout, run settings priced by
tune.runcost (bucket start-ups), and a warm start over distinct layouts (real planner, real
Optuna in-memory storage; no jobs)."""

from __future__ import annotations

import dataclasses
import math

import optuna
import pytest

from frontier_llm.catalog import load_model, load_system
from frontier_llm.costmodel import comm
from frontier_llm.costmodel.params import stage_params_per_rank
from frontier_llm.errors import SpecError
from frontier_llm.specs.layout import Layout, layout_types
from frontier_llm.specs.space import NOT_SEARCHED
from frontier_llm.specs.space import space_knobs as search_knobs
from frontier_llm.tune import optuna_study as osx
from frontier_llm.tune.runcost import MB, bucket_seconds, buckets, gradient_bytes, run_seconds
from frontier_llm.tune.spec import StudySpace, load_study
from tests.test_tune_spec import write


def test_study_space_fields_are_the_layout_knobs():
    """No second list: StudySpace's fields are Layout's fields less what the sweep fixes, then
    the zero shorthand and run settings."""
    assert list(search_knobs()) == [n for n in layout_types() if n not in NOT_SEARCHED]
    assert [f.name for f in dataclasses.fields(StudySpace)] == [*search_knobs(), "zero", "run"]
    # Values are checked by the knob's type: a vocabulary's words, whole numbers, true/false.
    with pytest.raises(SpecError, match="recompute must be one of none, selective, full, "
                                        r"selective-op \(got 'some'\)"):
        StudySpace(recompute=["some"])
    with pytest.raises(SpecError, match="micro_batch values must be at least 1"):
        StudySpace(micro_batch=[0])
    with pytest.raises(SpecError, match="sequence_parallel must be a non-empty list of "
                                        "true/false"):
        StudySpace(sequence_parallel=[1])


def test_bucket_start_ups():
    """n buckets pay the all-reduce's start-ups n times (its bytes once); no DP, no cost."""
    model, system = load_model("tiny-gpt-8l"), load_system("cpu-local")
    lay = Layout(tp=1, pp=2, dp=2, micro_batch=1, global_batch=8, dtype="fp32")
    grad = float(max(stage_params_per_rank(model, 1, 2, s) for s in (0, 1))) * 4
    assert gradient_bytes(model, lay) == grad
    n = math.ceil(grad / (0.25 * MB))
    assert n == buckets(model, lay, 0.25) and n > 2
    startup = 2 * (lay.dp - 1) * system.link("node").latency
    assert startup == pytest.approx(float(comm.all_reduce(system, 2, 1, 0.0)))
    assert bucket_seconds(model, system, lay, 0.25) == pytest.approx((n - 1) * startup)
    assert bucket_seconds(model, system, lay, 64) == 0.0  # one bucket holds every gradient
    assert run_seconds(model, system, lay, {}) == 0.0
    no_dp = Layout(tp=2, pp=2, dp=1, micro_batch=1, global_batch=8, dtype="fp32")
    assert bucket_seconds(model, system, no_dp, 0.25) == 0.0


def test_warm_start_takes_distinct_layouts_and_prices_buckets(tmp_path):
    s = load_study(write(tmp_path, **{"      bucket_mb: [1, 64]": "      bucket_mb: [0.01, 64]"}))
    c = s.candidates
    # A small bucket is predicted slower for a DP layout: the model tells the settings apart.
    dp4 = {"tp": 1, "pp": 1, "micro_batch": 1, "sharding": "zero0"}
    small, big = c.lookup({**dp4, "run.bucket_mb": 0.01}), c.lookup({**dp4, "run.bucket_mb": 64})
    assert small.prediction["run_settings_s"] > 0 and "run_settings_s" not in big.prediction
    assert small.prediction["tokens_per_s"] < big.prediction["tokens_per_s"]
    warm = c.warm_start_points(4)
    layouts = [tuple(p[k] for k in ("tp", "pp", "micro_batch", "sharding")) for p in warm]
    assert len(set(layouts)) == 4  # four layouts, not one layout's four run settings
    ranked_layouts = list(dict.fromkeys(
        tuple(x.params[k] for k in ("tp", "pp", "micro_batch", "sharding")) for x in c.ranked()))
    assert layouts == ranked_layouts[:4]
    for p in warm:  # each with the bucket predicted best where the model sees one
        lay = c.lookup({**p, "run.bucket_mb": 64}).layout
        assert p.get("run.bucket_mb") == (64 if lay.dp > 1 else None)


def test_a_run_setting_the_model_cannot_tell_apart_is_left_to_the_sampler(tmp_path):
    """Layouts whose gradients fit one bucket of either size, or that have no data parallelism:
    the bucket changes nothing the model sees, so the warm start fixes the layout only and the
    sampler draws the bucket."""
    s = load_study(write(tmp_path, **{"    tp: [1, 2, 4]": "    tp: [2, 4]",
                                      "    pp: [1, 2]": "    pp: [1, 2]\n    micro_batch: [1]",
                                      "    micro_batch: [1, 2]\n": ""}))
    c = s.candidates
    warm = c.warm_start_points(2)
    assert all("run.bucket_mb" not in p for p in warm)
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage(), direction="maximize")
    assert osx.warm_start(study, c, 2) == 2
    assert osx.warm_start(study, c, 2) == 0  # once per study
    p = osx.ask_next(study, c, sampler="tpe", seed=0, objectives=("throughput_per_gpu",),
                     in_flight=set())
    assert p is not None and p.number == 0
    assert {k: p.candidate.params[k] for k in warm[0]} == warm[0]
    assert p.candidate.params["run.bucket_mb"] in (1, 64)
    alike = {c.lookup({**warm[0], "run.bucket_mb": b}).prediction["tokens_per_s"] for b in (1, 64)}
    assert len(alike) == 1


def test_engine_is_a_knob_the_planner_searches(tmp_path):
    """engine comes with Layout's fields and the planner searches it (issue 10): one value is a
    fixed knob, two are a choice."""
    one = load_study(write(tmp_path,
                           **{"    zero: [0, 1]": "    zero: [0, 1]\n    engine: [native]"}))
    assert one.candidates.fixed["engine"] == "native" and "engine" not in one.candidates.choices
    two = load_study(write(tmp_path, name="two.yaml", **{
        "    zero: [0, 1]": "    zero: [0, 1]\n    engine: [native, deepspeed]"}))
    assert two.candidates.choices["engine"] == ["native", "deepspeed"]
