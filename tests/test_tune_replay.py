"""The replay table (real flm bench measurements, tests/data/tune_replay.csv) matches its study's
space, says how it was made, and drives flm tune's proposal code to the best layout."""

from __future__ import annotations

from pathlib import Path

from frontier_llm.tune.replay import load_table, search, trials_to_reach, values_by_key
from frontier_llm.tune.spec import load_study

REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / "tests" / "data" / "tune_replay.csv"


def test_table_covers_the_study_and_records_its_making():
    head = [line for line in TABLE.read_text().splitlines() if line.startswith("#")]
    for what in ("# command: python benchmarks/make_tune_replay.py", "# date: ", "# host: ",
                 "# versions: "):
        assert any(line.startswith(what) for line in head), what
    cands = load_study(REPO / "benchmarks" / "tune_replay_study.yaml").candidates
    values = values_by_key(load_table(TABLE))
    assert set(values) == {c.key for c in cands.feasible()}
    assert sum(v is not None for v in values.values()) >= 0.9 * len(values)


def test_replay_search_finds_the_best_and_never_measures_twice():
    cands = load_study(REPO / "benchmarks" / "tune_replay_study.yaml").candidates
    values = values_by_key(load_table(TABLE))
    best = max(v for v in values.values() if v is not None)
    n = len(cands.feasible())
    seq = search(cands, values, sampler="random", seed=0, warm_start=0, budget=n)
    assert len(seq) == n and trials_to_reach(seq, best) is not None
    seq = search(cands, values, sampler="tpe", seed=0, warm_start=3, budget=10)
    # The warm start: the model's three fastest distinct layouts, each with the bucket size it
    # predicts best for it (the bucket's start-ups, tune.runcost), measured first.
    warm = cands.warm_start_points(3)
    assert len({(p["tp"], p["pp"], p["micro_batch"], p["sharding"]) for p in warm}) == 3
    assert seq[:3] == [values[cands.lookup(p).key] for p in warm]
