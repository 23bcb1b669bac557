"""The report stage on small frames: scaling maths (weak, strong, repeats, failed and missing
points, refusals), tables, every figure rendered and opened, the analysis scripts, and the
command's refusals of bad input (on databases built from synthetic traces, which is what these
refusals need; tests/test_report_bench.py runs the same commands on real bench runs)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from report_fixtures import check_pdf, check_png
from store_fixtures import make_trace
from sweep_texts import local_sweep

from frontier_llm.bench.trace import write_trace
from frontier_llm.cli import main
from frontier_llm.errors import UserError
from frontier_llm.jobs.sweepspec import load_sweep
from frontier_llm.report import (
    errors_table,
    figures,
    layouts_table,
    paper,
    scaling_table,
    style,
    sweep_frame,
)
from frontier_llm.report.frames import MISSING, with_measurements
from frontier_llm.report.paper import REPO
from frontier_llm.report.tables import markdown
from frontier_llm.store import open_store
from frontier_llm.store.ingest import collect

SEQ = 32


def run(n, gb, t, status="completed", run_id=None, **kw):
    """One row in the shape of runs_frame: tiny-gpt, dp = n, step time t."""
    row = {"run_id": run_id or f"r{n}-{gb}-{t}", "sweep_name": "s", "job_key": f"k{n}",
           "status": status, "engine": "native", "model": "tiny-gpt", "system": "cpu-local",
           "tp": 1, "pp": 1, "dp": n, "micro_batch": 1, "global_batch": gb, "schedule": "1f1b",
           "virtual_stages": 1, "sequence_parallel": False, "recompute": "none",
           "flash_attention": True, "dtype": "fp32", "sharding": "zero0", "world_size": n,
           "step_time_s": t if status == "completed" else np.nan,
           "tokens_per_s": gb * SEQ / t if status == "completed" else np.nan,
           "peak_memory_bytes": 1_000_000 * n, "predicted_step_time_s": t * 0.9,
           "predicted_peak_memory_bytes": 900_000 * n}
    row.update(kw)
    return row


def test_weak_scaling_is_per_gpu_throughput_over_the_smallest_runs():
    # Work per GPU fixed (gb = 2 n); step time 1.0, 1.25, 2.0 s: efficiency 100, 80, 50 %.
    df = pd.DataFrame([run(1, 2, 1.0), run(2, 4, 1.25), run(4, 8, 2.0)])
    t = scaling_table(df).set_index("gpus")
    assert set(t["mode"]) == {"weak"}
    assert t["measured_efficiency_pct"].tolist() == pytest.approx([100, 80, 50])
    assert t.loc[2, "tokens_per_s_per_gpu"] == pytest.approx(4 * SEQ / 1.25 / 2)
    assert "predicted_efficiency_pct" not in t  # measured only unless asked


def test_strong_scaling_is_t_base_n_base_over_t_n_n_with_repeats_and_failures():
    df = pd.DataFrame([run(1, 8, 4.0), run(2, 8, 2.5), run(2, 8, 2.0, run_id="again"),
                       run(2, 8, 3.0, run_id="third"), run(4, 8, 1.25),
                       run(4, 8, 0, status="failed", run_id="crash",
                           predicted_step_time_s=1.125)])
    t = scaling_table(df, source="both").set_index("gpus")
    assert set(t["mode"]) == {"strong"}
    # Median of the three repeats at 2 GPUs is 2.5 s; spread 2.0 .. 3.0 s.
    assert t.loc[2, "step_time_s"] == 2.5
    assert (t.loc[2, "step_time_min_s"], t.loc[2, "step_time_max_s"]) == (2.0, 3.0)
    assert t.loc[2, "measured_efficiency_pct"] == pytest.approx(4.0 * 1 / (2.5 * 2) * 100)
    assert t.loc[2, "measured_efficiency_max_pct"] == pytest.approx(4.0 / (2.0 * 2) * 100)
    assert t.loc[4, "measured_efficiency_pct"] == pytest.approx(80.0)
    # The failed run is counted, not dropped, and does not enter the median.
    assert t.loc[4, "status"] == "1 completed, 1 failed" and t.loc[4, "not_completed"] == 1
    assert t.loc[4, "predicted_efficiency_pct"] == pytest.approx(80.0)  # 0.9 x both


def test_missing_point_of_a_sweep_file_is_shown(tmp_path):
    spec = load_sweep(REPO / "sweeps" / "frontier-175b-strong.yaml")
    expected = sweep_frame(spec)
    keys = list(expected["job_key"])
    runs = pd.DataFrame([
        run(2, 2048, 600.0, job_key=keys[0], run_id="a", model="gpt-175b", system="frontier",
            tp=4, pp=16, world_size=128, seq_len=2048),
        run(4, 2048, 320.0, job_key=keys[1], run_id="b", model="gpt-175b", system="frontier",
            tp=4, pp=16, world_size=256, seq_len=2048)])
    frame = with_measurements(expected, runs)
    assert (frame["status"] == MISSING).sum() == len(keys) - 2
    t = scaling_table(frame, source="both").set_index("gpus")
    assert t.loc[512, "runs"] == 0 and t.loc[512, "status"] == "1 missing"
    assert math.isnan(t.loc[512, "measured_efficiency_pct"])
    assert t.loc[512, "predicted_efficiency_pct"] > 0  # the model still has the point
    # Predictions come from today's cost model for the same layouts, base = measured base.
    assert t.loc[128, "predicted_efficiency_pct"] == pytest.approx(100.0)


@pytest.mark.parametrize("rows, message", [
    ([run(1, 2, 0, status="failed"), run(2, 4, 0, status="oom")], "no completed run"),
    ([run(1, 2, 1.0), run(1, 2, 1.1, run_id="x")], "single point"),
    ([run(1, 2, 1.0), run(2, 8, 1.0), run(4, 12, 1.0)], "cannot tell weak from strong"),
])
def test_what_holds_no_scaling_is_refused(rows, message):
    with pytest.raises(UserError, match=message):
        scaling_table(pd.DataFrame(rows))


def test_markdown_table():
    text = markdown(pd.DataFrame({"a": ["x|y", "z"], "b": [1234.5, np.nan], "c": [0.01234, 2]}))
    assert text.splitlines()[:2] == ["| a | b | c |", "|---|---:|---:|"]
    assert "| x\\|y | 1,234 | 0.0123 |" in text and "| z | – | 2.0 |" in text


def test_every_figure_renders_and_reads(tmp_path):
    df = pd.DataFrame([run(1, 8, 4.0), run(2, 8, 2.5), run(2, 8, 3.0, run_id="b"),
                       run(4, 8, 0, status="failed", run_id="crash"), run(8, 8, 0.7)])
    scaling = scaling_table(df, source="both")
    layouts = layouts_table(df)
    v = pd.DataFrame({"system": ["cpu-local", "frontier"], "engine": ["native", "native"],
                      "measured_step_time_s": [1.0, 2.0], "predicted_step_time_s": [1.1, 1.5],
                      "step_time_error_pct": [10.0, -25.0],
                      "measured_peak_memory_bytes": [1e9, 2e9],
                      "predicted_peak_memory_bytes": [1.1e9, 2e9],
                      "memory_error_pct": [10.0, 0.0]})
    errs = errors_table(v).set_index(["system", "engine"])
    assert errs.loc[("(all)", "(all)"), "step_time_mape_pct"] == pytest.approx(17.5)
    assert errs.loc[("(all)", "(all)"), "step_time_bias_pct"] == pytest.approx(-7.5)
    drawn = {
        "scaling": figures.plot_scaling(scaling),
        "layouts": figures.plot_layouts(layouts),
        "errors": figures.plot_errors(v),
    }  # the knob and memory figures: test_redraw_all_writes_every_figure_of_the_study
    for name, fig in drawn.items():
        png, pdf = style.save(fig, tmp_path, name)
        check_png(png)
        check_pdf(pdf)


def test_the_layouts_figure_on_a_log_axis_keeps_every_bar_readable(tmp_path):
    """A model 10x off (uncalibrated system) and a layout 10x slower than the others: on the
    log axis every bar, the shortest measured one included, starts left of its end and the
    axis spans measured and predicted; the linear default is unchanged."""
    df = pd.DataFrame([run(4, 8, 1.0), run(4, 8, 10.0, run_id="slow", tp=2, dp=2)])
    table = layouts_table(df)
    table["predicted_tokens_per_s_per_gpu"] = table["tokens_per_s_per_gpu"] * 10
    fig = figures.plot_layouts(table, log=True)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and fig.axes[1].get_xscale() == "linear"
    lo, hi = ax.get_xlim()
    values = pd.concat([table["tokens_per_s_per_gpu_min"],
                        table["predicted_tokens_per_s_per_gpu"]])
    assert 0 < lo < values.min() / 2 and hi > values.max()
    assert "log scale" in ax.get_xlabel()
    check_png(style.save(fig, tmp_path, "log")[0])
    assert figures.plot_layouts(table).axes[0].get_xscale() == "linear"


@pytest.mark.slow
def test_redraw_all_writes_every_figure_of_the_study(tmp_path, capsys):
    """The documented command: every figure from the cost model alone (no database)."""
    assert paper.main(None, ["--out", str(tmp_path)]) == 0
    knobs = pd.read_csv(tmp_path / "throughput_22b.csv")
    for knob, g in knobs.groupby("knob"):
        assert g["value"].tolist() == sorted(g["value"]) and g["held"].nunique() == 1, knob
    assert set(knobs["knob"]) == {"tp", "pp", "micro_batch"}
    memory = pd.read_csv(tmp_path / "memory_22b.csv")
    parts = memory[[c for c in memory if c.endswith("_gb") and "peak" not in c
                    and "device" not in c]].sum(axis=1)
    assert np.allclose(parts, memory["predicted_peak_gb"], rtol=0.02)  # the parts add up
    for name in ("throughput_22b", "memory_22b", "weak_scaling", "strong_scaling",
                 "calibration"):
        check_png(tmp_path / f"{name}.png")
        check_pdf(tmp_path / f"{name}.pdf")
        assert (tmp_path / f"{name}.md").read_text().count("\n|") >= 3
    strong = pd.read_csv(tmp_path / "strong_scaling.csv").set_index(["model", "gpus"])
    # The model's strong-scaling efficiency at the paper's largest counts (89 % and 87 %
    # published): within ten points, a regression guard on the cost model, not a fit.
    assert 79 < strong.loc[("gpt-175b", 1024), "predicted_efficiency_pct"] < 99
    assert 77 < strong.loc[("gpt-1t", 3072), "predicted_efficiency_pct"] < 97


# --- the command's refusals -----------------------------------------------------------------

def _db(tmp_path, traces) -> str:
    for t in traces:
        write_trace(tmp_path / "t", t)
    url = f"sqlite:///{tmp_path / 'flm.db'}"
    store = open_store(url)
    collect(store, [tmp_path / "t"])
    store.close()
    return url


@pytest.mark.parametrize("traces, sweep, message", [
    ([make_trace("a", labels={"sweep": "other"})], "wanted",
     "no runs of sweep 'wanted' in sqlite:///"),
    ([make_trace("a", status="failed", labels={"sweep": "s"}),
      make_trace("b", dp=2, status="oom", labels={"sweep": "s"})], "s",
     "no completed run to report (1 failed, 1 oom)"),
    ([make_trace("a", labels={"sweep": "s"}), make_trace("b", seed=1, labels={"sweep": "s"})],
     "s", "a single point per series: no scaling to compute"),
])
def test_bad_input_one_line_exit_2_nothing_written(tmp_path, capsys, traces, sweep, message):
    url = _db(tmp_path, traces)
    out = tmp_path / "report"
    assert main(["report", "scaling", "--sweep", sweep, "--db", url, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def test_missing_database_is_not_created(tmp_path, capsys):
    db = tmp_path / "none.db"
    assert main(["report", "errors", "--db", f"sqlite:///{db}", "--out", str(tmp_path / "r")]) \
        == 2
    assert "no database at" in capsys.readouterr().err and not db.exists()


def test_help_explains(capsys):
    with pytest.raises(SystemExit):
        main(["report", "scaling", "--help"])
    text = capsys.readouterr().out
    assert "--predicted" in text and "weak" in text and "exit 2" not in text


SWEEP = local_sweep("tiny-strong-recorded", [f"{{dp: {d}, micro_batch: 1, name: dp{d}}}"
                                              for d in (1, 2, 4)])


def test_sweep_by_name_shows_jobs_without_runs(tmp_path, capsys):
    """A sweep recorded by flm sweep (render + the job table, as `flm sweep submit` writes them):
    the report by name knows every job, so a job that timed out without a trace and a job never
    run keep their places."""
    from frontier_llm.jobs.state import SweepJobs
    from frontier_llm.jobs.sweepdir import render_sweep

    path = tmp_path / "sweep.yaml"
    path.write_text(SWEEP)
    sweep = load_sweep(path)
    url = _db(tmp_path, [make_trace(k, dp=dp, global_batch=4, labels={
        "sweep": sweep.name, "job_key": k}) for k, dp in (("dp1", 1), ("dp2", 2))])
    store = open_store(url)
    state = SweepJobs.open(store, render_sweep(sweep, tmp_path / "run"), sweep.text)
    state.record([{"k": "dp4", "state": "TIMEOUT"}])
    store.close()
    out = tmp_path / "r"
    assert main(["report", "scaling", "--sweep", sweep.name, "--db", url, "--predicted",
                 "--out", str(out)]) == 0
    t = pd.read_csv(out / f"{sweep.name}-scaling.csv").set_index("gpus")
    assert t.index.tolist() == [1, 2, 4]
    assert t.loc[4, "status"] == "1 timeout" and t.loc[4, "not_completed"] == 1
    assert math.isnan(t.loc[4, "measured_efficiency_pct"])
    assert t.loc[4, "predicted_efficiency_pct"] > 0
    check_png(out / f"{sweep.name}-scaling.png")


def test_layouts_of_one_world_size(tmp_path, capsys):
    """--gpus keeps the layouts on that many GPUs, in files of their own beside the full
    report's (the cost model's predictions of tiny-cpu: layouts on 1, 2 and 4 GPUs)."""
    sweep = str(REPO / "sweeps" / "tiny-cpu.yaml")
    assert main(["report", "layouts", "--sweep", sweep, "--model-only", "--gpus", "2",
                 "--out", str(tmp_path)]) == 0
    assert "2 layouts, 0 completed runs" in capsys.readouterr().out
    table = pd.read_csv(tmp_path / "tiny-cpu-layouts-2gpus.csv")
    assert sorted(table["layout"]) == ["tp1 pp1 dp2 mb2 gb4 fp32", "tp1 pp2 dp1 mb1 gb4 fp32"]
    assert set(table["gpus"]) == {2}
    assert not (tmp_path / "tiny-cpu-layouts.csv").exists()


def test_a_series_of_one_point_is_one_point_with_no_efficiency(tmp_path, capsys):
    """A recipe run at one GPU count has nothing to scale against: its step time is drawn and
    said, its efficiency is left empty (not a vacuous 100 %), beside a real series."""
    df = pd.DataFrame([run(1, 8, 4.0), run(2, 8, 2.5), run(2, 8, 3.0, tp=2)])
    table = scaling_table(df)
    lone = table[table["series"].str.contains("tp2")]
    assert len(lone) == 1 and lone["measured_efficiency_pct"].isna().all()
    assert table.loc[~table.index.isin(lone.index), "measured_efficiency_pct"].notna().all()
    sweep = str(REPO / "sweeps" / "tiny-cpu.yaml")
    assert main(["report", "scaling", "--sweep", sweep, "--model-only",
                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "tiny-gpt tp2 pp1 mb1 fp32: one point (4 GPUs), no scaling efficiency; step " \
           "time predicted" in out
    assert "100.0 %" not in out
