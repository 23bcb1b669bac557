"""Engines side by side: traces of both engines in a real store (SQLite, and PostgreSQL where
the postgres marker runs), pivoted by `flm results --by-engine` / `flm validate --by-engine`."""

from __future__ import annotations

import io
import json
import statistics

import pandas as pd
import pytest
from store_fixtures import make_trace

from frontier_llm.bench.trace import write_trace
from frontier_llm.cli import main
from frontier_llm.report.errors import errors_table
from frontier_llm.store import open_store
from frontier_llm.store.engine_compare import compare_runs, compare_validation
from frontier_llm.store.ingest import collect
from frontier_llm.store.queries import final_losses, runs_frame, validated_runs

DP2 = dict(dp=2, zero=1, global_batch=4)  # on both engines
PP2 = dict(pp=2, zero=1, global_batch=4)  # native only (deepspeed's run failed)
TP2 = dict(tp=2, zero=0, global_batch=4)  # deepspeed only


def _trace(run_id: str, engine: str, layout: dict, step_s: float, mem: int, predicted_s: float,
           **kw) -> dict:
    t = make_trace(run_id, engine=engine, labels={"sweep": "eng"}, **layout, **kw)
    t["summary"]["step_time_s"] = step_s
    t["summary"]["tokens_per_s"] = 4 * 64 / step_s  # global batch x tiny-gpt's seq_len
    t["summary"]["peak_memory_bytes"] = mem
    t["prediction"]["step_time_s"] = predicted_s
    t["prediction"]["peak_memory_bytes"] = mem
    return t


TRACES = [
    _trace("dp2-native", "native", DP2, 1.0, 1000, 1.1),
    _trace("dp2-ds-a", "deepspeed", DP2, 1.2, 1200, 1.2),
    _trace("dp2-ds-b", "deepspeed", DP2, 1.6, 1400, 1.2),
    _trace("pp2-native", "native", PP2, 0.5, 800, 0.4),
    _trace("pp2-ds", "deepspeed", PP2, 9.0, 900, 0.4, status="failed"),
    _trace("tp2-ds", "deepspeed", TP2, 0.8, 600, 1.0),
]


@pytest.fixture
def store(tmp_path, db_url):
    for t in TRACES:
        write_trace(tmp_path / "t", t)
    s = open_store(db_url)
    assert collect(s, [tmp_path / "t"]).inserted == len(TRACES)
    yield s
    s.close()


def _last_loss(run_id: str) -> float:
    return next(t for t in TRACES if t["run_id"] == run_id)["steps"][-1]["loss"]


def _runs(store) -> pd.DataFrame:
    return runs_frame(store).merge(final_losses(store), on="run_id", how="left")


def test_one_row_per_layout_with_both_engines_side_by_side(store):
    wide = compare_runs(_runs(store)).set_index(["tp", "pp", "dp"])
    assert sorted(wide.index) == [(1, 1, 2), (1, 2, 1), (2, 1, 1)]
    both = wide.loc[(1, 1, 2)]
    assert (both["native_runs"], both["deepspeed_runs"]) == (1, 2)
    assert both["native_step_time_s"] == 1.0
    assert both["deepspeed_step_time_s"] == pytest.approx(1.4)  # median of 1.2 and 1.6
    assert both["native_tokens_per_s_per_gpu"] == pytest.approx(256 / 1.0 / 2)
    assert both["deepspeed_tokens_per_s_per_gpu"] == pytest.approx(
        statistics.median([256 / 1.2 / 2, 256 / 1.6 / 2]))
    assert both["deepspeed_peak_memory_bytes"] == 1300
    assert both["step_time_deepspeed_over_native"] == pytest.approx(1.4)
    assert both["peak_memory_deepspeed_over_native"] == pytest.approx(1.3)
    assert both["tokens_per_s_per_gpu_deepspeed_over_native"] == pytest.approx(
        both["deepspeed_tokens_per_s_per_gpu"] / both["native_tokens_per_s_per_gpu"])
    assert both["native_final_loss"] == pytest.approx(_last_loss("dp2-native"))
    assert both["deepspeed_final_loss"] == pytest.approx(
        statistics.median([_last_loss("dp2-ds-a"), _last_loss("dp2-ds-b")]))
    # The failed deepspeed run of pp2 counts for nothing: blanks, not errors.
    native_only = wide.loc[(1, 2, 1)]
    assert native_only["deepspeed_runs"] == 0 and native_only["native_step_time_s"] == 0.5
    assert pd.isna(native_only["deepspeed_step_time_s"])
    assert pd.isna(native_only["deepspeed_peak_memory_bytes"])
    assert pd.isna(native_only["step_time_deepspeed_over_native"])
    ds_only = wide.loc[(2, 1, 1)]
    assert ds_only["native_runs"] == 0 and ds_only["deepspeed_step_time_s"] == 0.8
    assert pd.isna(ds_only["native_step_time_s"])


def test_a_store_of_one_engine_keeps_the_columns(tmp_path):
    write_trace(tmp_path / "t", _trace("only", "native", DP2, 1.0, 1000, 1.1))
    s = open_store(f"sqlite:///{tmp_path / 'one.db'}")
    collect(s, [tmp_path / "t"])
    wide = compare_runs(_runs(s))
    s.close()
    assert len(wide) == 1 and wide["deepspeed_runs"].item() == 0
    assert pd.isna(wide["step_time_deepspeed_over_native"].item())


def test_validation_errors_per_engine_and_statistics_per_system_and_engine(store):
    validated = validated_runs(runs_frame(store))
    wide = compare_validation(validated).set_index(["tp", "pp", "dp"])
    both = wide.loc[(1, 1, 2)]
    assert both["native_step_time_error_pct"] == pytest.approx(10.0)
    # deepspeed: 1.2 vs 1.2 (0 %) and 1.2 vs 1.6 (-25 %): the mean signed error
    assert both["deepspeed_step_time_error_pct"] == pytest.approx(-12.5)
    assert both["deepspeed_predicted_step_time_s"] == pytest.approx(1.2)
    assert pd.isna(wide.loc[(1, 2, 1), "deepspeed_step_time_error_pct"])
    stats = errors_table(validated).set_index(["system", "engine"])
    assert list(stats.index) == [("cpu-local", "deepspeed"), ("cpu-local", "native"),
                                 ("(all)", "(all)")]
    assert stats.loc[("cpu-local", "deepspeed"), "runs"] == 3
    assert stats.loc[("cpu-local", "deepspeed"), "step_time_mape_pct"] == pytest.approx(
        (0 + 25 + 25) / 3)  # tp2: 1.0 vs 0.8 = +25 %
    assert stats.loc[("cpu-local", "native"), "step_time_max_ape_pct"] == pytest.approx(20.0)


def test_cli_by_engine_in_every_format(store, db_url, capsys):
    assert main(["results", "--db", db_url, "--by-engine", "--format", "csv"]) == 0
    df = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert len(df) == 3 and {"native_step_time_s", "deepspeed_step_time_s",
                             "step_time_deepspeed_over_native"} <= set(df.columns)
    assert main(["results", "--db", db_url, "--by-engine", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    row = next(r for r in rows if r["dp"] == 2)
    assert row["step_time_deepspeed_over_native"] == pytest.approx(1.4)
    assert next(r for r in rows if r["pp"] == 2)["deepspeed_step_time_s"] is None
    assert main(["results", "--db", db_url, "--by-engine", "--sweep", "eng"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["native", "deepspeed", "deepspeed/native"]
    assert table[1].split()[-3:] == ["step_time", "tok/s/gpu", "peak_mem"]
    assert "nan" not in "\n".join(table).lower() and "<NA>" not in "\n".join(table)
    assert len(table) == 2 + 3

    assert main(["validate", "--db", db_url, "--by-engine", "--format", "json"]) == 0
    v = json.loads(capsys.readouterr().out)
    assert len(v["layouts"]) == 3
    assert {(s["system"], s["engine"]) for s in v["stats"]} == {
        ("cpu-local", "native"), ("cpu-local", "deepspeed"), ("(all)", "(all)")}
    assert main(["validate", "--db", db_url, "--by-engine", "--stats-only",
                 "--format", "csv"]) == 0
    stats = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert list(stats.columns[:3]) == ["system", "engine", "runs"]
    assert main(["validate", "--db", db_url, "--by-engine"]) == 0
    text = capsys.readouterr().out
    assert "predicted vs measured per engine" in text and "step_err_%" in text
    assert "error statistics per system and engine" in text


def test_a_sharding_without_zero_stage_is_one_layout(tmp_path):
    """Partial shardings have no ZeRO stage (NULL in the store): each is its own row, never
    merged with another NULL-stage sharding or with the ZeRO-1 layout of the same shape
    (HSDP under the native engine, hpZ under DeepSpeed)."""
    from frontier_llm.catalog import load_model
    from frontier_llm.specs.identity import layout_hash
    from frontier_llm.specs.layout import Layout

    hsdp, hpz = "p=partial:2,g=partial:2,o=partial:2", "p=partial:2,g=full,o=full"
    for run_id, engine, sharding in (("hsdp-native", "native", hsdp),
                                     ("hpz-ds", "deepspeed", hpz)):
        t = make_trace(run_id, dp=4, engine=engine)
        layout = Layout.from_dict({**t["layout"], "sharding": sharding})
        t["layout"], t["layout_hash"] = layout.to_dict(), layout_hash(
            load_model("tiny-gpt"), "cpu-local", layout)
        write_trace(tmp_path / "t", t)
    write_trace(tmp_path / "t", make_trace("z1-native", dp=4, zero=1))
    s = open_store(f"sqlite:///{tmp_path / 'hpz.db'}")
    collect(s, [tmp_path / "t"])
    wide = compare_runs(_runs(s)).set_index("sharding")
    s.close()
    assert sorted(wide.index) == sorted([hpz, hsdp, "zero1"])
    assert (wide.loc[hsdp, "native_runs"], wide.loc[hsdp, "deepspeed_runs"]) == (1, 0)
    assert (wide.loc[hpz, "native_runs"], wide.loc[hpz, "deepspeed_runs"]) == (0, 1)
    assert pd.isna(wide.loc[hsdp, "zero_stage"]) and pd.isna(wide.loc[hpz, "zero_stage"])
    assert wide.loc["zero1", "zero_stage"] == 1 and wide.loc["zero1", "deepspeed_runs"] == 0
