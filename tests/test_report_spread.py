"""Scaling efficiency from noisy runs: a point whose spread (its repeats, or the measured steps
inside a single run) reaches its distance from ideal is marked, not printed as a result (the
quickstart printed 177 % weak- and 128 % strong-scaling efficiency from single noisy runs).
Real traces through a real SQLite store for the store's part."""

from __future__ import annotations

import pandas as pd
import pytest
from store_fixtures import make_trace

from frontier_llm.bench.trace import write_trace
from frontier_llm.cli import main
from frontier_llm.report import scaling_table
from frontier_llm.report.sources import measured_runs
from frontier_llm.store import open_store
from frontier_llm.store.ingest import collect


def _run(n, gb, t, lo=None, hi=None, run_id=None):
    return {"run_id": run_id or f"r{n}-{t}", "sweep_name": "s", "status": "completed",
            "engine": "native", "model": "tiny-gpt", "system": "cpu-local", "tp": 1, "pp": 1,
            "dp": n, "micro_batch": 1, "global_batch": gb, "world_size": n, "step_time_s": t,
            "tokens_per_s": gb * 32 / t, "predicted_step_time_s": t, "steps_min_s": lo,
            "steps_max_s": hi, "schedule": "1f1b", "virtual_stages": 1,
            "sequence_parallel": False, "recompute": "none", "flash_attention": True,
            "dtype": "fp32", "sharding": "zero0"}


def test_a_super_linear_efficiency_inside_its_spread_is_marked():
    # Weak scaling, one run a point: 1.0 s at 1 rank, 0.565 s at 2 ranks = 177 %. The steps
    # inside the base run range 0.4-1.6 s (half-range 60 %), the other's 0.5-0.63 (11.5 %):
    # spread 177 x 0.715 = 127 points >= the 77-point effect.
    noisy = scaling_table(pd.DataFrame([_run(1, 2, 1.0, 0.4, 1.6),
                                        _run(2, 4, 0.565, 0.5, 0.63)])).set_index("gpus")
    assert noisy.loc[2, "measured_efficiency_pct"] == pytest.approx(177, abs=0.1)
    assert noisy.loc[1, "step_time_spread_pct"] == pytest.approx(60)
    assert noisy.loc[2, "measured_efficiency_spread_pct"] == pytest.approx(
        177.0 * (0.60 + 0.13 / 2 / 0.565), rel=1e-3)
    assert bool(noisy.loc[2, "efficiency_within_noise"])
    assert noisy.loc[2, "efficiency_mark"].startswith("spread ±127 ≥ effect +77")
    assert not noisy.loc[1, "efficiency_within_noise"]  # the base is 100 % by definition
    # The same efficiency from steady runs (1 % each) is a result.
    steady = scaling_table(pd.DataFrame([_run(1, 2, 1.0, 0.99, 1.01),
                                         _run(2, 4, 0.565, 0.56, 0.57)])).set_index("gpus")
    assert not steady.loc[2, "efficiency_within_noise"] and steady.loc[2, "efficiency_mark"] == ""


def test_repeats_give_the_spread_when_the_steps_are_unknown():
    # Strong scaling: 4 s at 1 rank (two repeats, 3-5 s: half-range 25 %), 1.56 s at 2 (128 %).
    t = scaling_table(pd.DataFrame([_run(1, 8, 3.0, run_id="a"), _run(1, 8, 5.0, run_id="b"),
                                    _run(2, 8, 1.5625)])).set_index("gpus")
    assert t.loc[1, "step_time_spread_pct"] == pytest.approx(25)
    assert pd.isna(t.loc[2, "step_time_spread_pct"])  # one run, no steps: unknown
    assert not t.loc[2, "efficiency_within_noise"]  # unknown is not marked
    t = scaling_table(pd.DataFrame([_run(1, 8, 3.0, run_id="a"), _run(1, 8, 5.0, run_id="b"),
                                    _run(2, 8, 1.5625, 1.2, 1.9)])).set_index("gpus")
    assert t.loc[2, "measured_efficiency_pct"] == pytest.approx(128)
    assert bool(t.loc[2, "efficiency_within_noise"])


def test_the_steps_of_stored_runs_give_each_run_its_spread(tmp_path, capsys):
    traces = [make_trace("a", dp=1, labels={"sweep": "s"}),
              make_trace("b", dp=2, labels={"sweep": "s"})]
    for tr in traces:
        write_trace(tmp_path / "t", tr)
    url = f"sqlite:///{tmp_path / 'flm.db'}"
    store = open_store(url)
    collect(store, [tmp_path / "t"])
    store.close()
    runs = measured_runs(url, "s").set_index("run_id")
    for tr in traces:
        steps = [s["time_s"] for s in tr["steps"] if not s["warmup"]]
        assert runs.loc[tr["run_id"], "steps_min_s"] == min(steps)
        assert runs.loc[tr["run_id"], "steps_max_s"] == max(steps)
    assert main(["report", "scaling", "--sweep", "s", "--db", url, "--out",
                 str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    table = pd.read_csv(tmp_path / "r" / "s-scaling.csv").set_index("gpus")
    assert table["step_time_spread_pct"].notna().all()
    if table.loc[2, "efficiency_within_noise"]:
        assert "not a result" in out and "not a result" in \
            (tmp_path / "r" / "s-scaling.md").read_text()
    else:
        assert "not a result" not in out
