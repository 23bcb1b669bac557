"""Intervals built on leave-one-source-out residuals (frontier_llm/planner/intervals.py).

The residuals are planner/data/calibration_residuals.csv, written by
analysis/loso_residuals.py from both calibration tables; these tests hold each source out of
the intervals in turn and check its rows against the interval built without it (the issue's
target: the 80 % interval holds 70-90 % of the held-out sources' rows).
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from frontier_llm.catalog import load_system
from frontier_llm.planner import intervals
from frontier_llm.planner.calibration import load_calibration, row_system, validate_runs

ANALYSIS = Path(__file__).resolve().parents[1] / "analysis"


def test_family_is_engine_sharding_and_vendor():
    assert intervals.family("megatron", "zero1", "amd") == "megatron@amd"
    assert intervals.vendor(load_system("frontier")) == "amd"
    assert intervals.vendor(load_system("lumi-g")) == "amd"
    assert intervals.vendor(load_system("dgx-a100")) == "nvidia"
    assert intervals.vendor(load_system("grand-teton-h100")) == "nvidia"


def test_family_is_engine_and_whether_parameters_are_sharded():
    assert intervals.family("megatron", "zero1") == "megatron"
    assert intervals.family("native", "zero3") == "native+sharded"
    assert intervals.family("native", "p=partial:8,g=partial:8,o=partial:8") == "native+sharded"
    assert intervals.family("deepspeed", "p=replicate,g=full,o=full") == "deepspeed"
    assert intervals.family("deepspeed", None) == "deepspeed"


def test_loso_coverage_of_the_80_percent_interval():
    """Each usable row of both tables against the interval built without its source: between
    70 and 90 % inside (the median half-width is printed: run with -s)."""
    table = intervals.loso_coverage(0.8)
    coverage = table["covered"].mean()
    median = float(np.median(table["half_width"]))
    print(f"\nLOSO coverage at 80 %: {coverage:.1%} of {len(table)} rows from "
          f"{table['source'].nunique()} sources; median half-width x{math.exp(median):.3f}")
    # The corpus as this test last saw it: 147 usable rows of 33 sources (more as tables join it).
    assert len(table) >= 147 and table["source"].nunique() >= 33
    assert 0.70 <= coverage <= 0.90


def test_a_source_is_never_in_its_own_interval():
    """The interval of a held-out row rests on the other sources only: its coverage width is
    the width built from the residuals without its source, and that source's own residuals,
    however large, do not move it."""
    res = intervals.load_residuals()
    table = intervals.loso_coverage(0.8, res)
    for source in ("MaxText", "Korthikanti2022"):
        held = table[table["source"] == source]
        others = res[res["source"] != source]
        rebuilt = [intervals.family_width(others, r.family, r.system, r.gpus, 0.8).q
                   for r in held.itertuples()]
        assert np.allclose(held["half_width"], rebuilt)
        inflated = res.copy()
        inflated.loc[inflated["source"] == source, "loso_log_residual"] *= 10
        again = intervals.loso_coverage(0.8, inflated)
        assert np.allclose(again[again["source"] == source]["half_width"], rebuilt)


def test_beyond_the_family_the_interval_widens_and_says_so():
    res = intervals.load_residuals()
    pool = intervals.residual_quantile(intervals.usable(res)["loso_log_residual"], 0.8)
    # Beyond a family's systems, or without one, the floor is the H100's own rows (every
    # engine's; intervals.reference_pool), which are enough for the quantile.
    h100, _ = intervals.reference_pool(intervals.usable(res), load_system("dgx-h100").gpu, 0.8)
    inside = intervals.step_width(load_system("dgx-h100"), "megatron", 0.8, res,
                                  sharding="zero1", gpus=1024)
    assert "beyond" not in inside.basis and "leave-one-source-out" in inside.basis
    # DeepSpeed's ZeRO-1 rows on NVIDIA GPUs ran on A100s only: an H100 is beyond them.
    other = intervals.step_width(load_system("dgx-h100"), "deepspeed", 0.8, res,
                                 sharding="zero1", gpus=384)
    assert "system dgx-h100" in other.basis and other.q >= h100
    bigger = intervals.step_width(load_system("dgx-h100"), "megatron", 0.8, res,
                                  sharding="zero1", gpus=30000)
    assert "scale" in bigger.basis and bigger.q >= pool
    none = intervals.step_width(load_system("dgx-h100"), "native", 0.8, res, sharding="zero0",
                                gpus=8)
    assert "no calibration row of this family" in none.basis and none.q == h100
    assert "H100-SXM5 80GB quantile of" in none.basis


def test_a_frontier_interval_rests_on_the_mi250x_rows():
    """Frontier has no row of its own with a stated layout; its MI250X GCDs are LUMI-G's, so a
    DeepSpeed layout on Frontier takes the AMD family's residuals (LUMI-G's rows), not the
    NVIDIA rows' nor the all-family widening, and the basis names the rows' sources."""
    res = intervals.load_residuals()
    w = intervals.step_width(load_system("frontier"), "deepspeed", 0.8, res, sharding="zero1",
                             gpus=512)
    assert w.basis.startswith("deepspeed@amd") and "beyond" not in w.basis
    assert "spyysalo/lumi-llm-scaling" in w.basis and "on lumi-g" in w.basis
    amd = intervals.usable(res)
    amd = amd[amd["family"] == "deepspeed@amd"]["loso_log_residual"]
    assert w.q == intervals.residual_quantile(amd, 0.8)


def test_an_mi250x_family_short_of_rows_rests_on_the_mi250x_rows_not_nvidias():
    """A Frontier or LUMI-G layout whose family has too few MI250X rows (Megatron-LM: one) or
    none (native, DeepSpeed ZeRO-3), or whose family ran on another GPU only (FSDP: MI300X),
    falls back on the quantile of the MI250X GCD's rows, every engine's (intervals.
    reference_pool), not on the all-family pool of mostly NVIDIA rows; the basis says so."""
    res = intervals.load_residuals()
    use = intervals.usable(res)
    mi250x = intervals.gpu_rows(use, "AMD MI250X GCD")
    assert set(mi250x["system"]) == {"lumi-g"} and len(mi250x) >= 14
    q = intervals.residual_quantile(mi250x["loso_log_residual"], 0.8)
    assert q != intervals.residual_quantile(use["loso_log_residual"], 0.8)
    name = f"the AMD MI250X GCD quantile of {len(mi250x)} rows"
    for system in ("frontier", "lumi-g"):
        none = intervals.step_width(load_system(system), "native", 0.8, res, sharding="zero0",
                                    gpus=64)
        assert none.q == q and name in none.basis and "all-family" not in none.basis
        short = intervals.step_width(load_system(system), "megatron", 0.8, res,
                                     sharding="zero1", gpus=64)
        worst = float(np.max(np.abs(use[use["family"] == "megatron@amd"]["loso_log_residual"])))
        assert short.q == max(q, worst) == worst
        assert f"too few for 80%: their largest error, wider than {name}" in short.basis
        other_gpu = intervals.step_width(load_system(system), "native", 0.8, res,
                                         sharding="zero3", gpus=8)
        assert other_gpu.q >= q and name in other_gpu.basis
    # Beyond the rows' scale the all-family quantile still bounds it from below.
    far = intervals.step_width(load_system("frontier"), "native", 0.8, res, sharding="zero3",
                               gpus=4096)
    assert "all-family" in far.basis


def test_the_basis_says_whether_a_fallback_widened_the_interval():
    """Frontier's bases said "widened to at least" a fallback the width already exceeded
    (gpt-1t under Megatron-LM at 3,072 GCDs: the one megatron@amd row's error, ×1.39, is wider
    than the MI250X and all-family quantiles): each clause now says which it was."""
    res = intervals.load_residuals()
    frontier = load_system("frontier")
    megatron = intervals.step_width(frontier, "megatron", 0.8, res, sharding="zero1",
                                    gpus=3072)
    assert "widened" not in megatron.basis
    assert "beyond them in scale (3072 GPUs > 2 x 64): already wider than the all-family " \
           "quantile" in megatron.basis
    fsdp = intervals.step_width(frontier, "native", 0.8, res, sharding="zero3", gpus=64)
    assert "widened" not in fsdp.basis
    assert "(the family ran on mi300x, mi325x): already wider than the AMD MI250X" in fsdp.basis
    # Where a fallback does set the width, the basis says so (searched over the catalog: which
    # pair widens moves with the corpus), and where it does not, the family's own quantile stands.
    use = intervals.usable(res)
    widened = 0
    for system in ("dgx-h100", "dgx-a100", "dgx-b200", "grand-teton-h100", "lumi-g", "mi325x"):
        for engine in ("native", "megatron", "deepspeed"):
            w = intervals.step_width(load_system(system), engine, 0.8, res, sharding="zero1",
                                     gpus=64)
            family = w.basis.split(":")[0]
            rows = use[use["family"] == family]["loso_log_residual"]
            if len(rows) < 5:
                continue
            own = intervals.residual_quantile(rows, 0.8)
            if "widened to the" in w.basis:
                widened += 1
                assert w.q > own, w.basis
            elif "beyond them" not in w.basis:
                assert w.q == pytest.approx(own), w.basis
    assert widened, "no catalog pair is widened by a fallback: the wording is untested"
    # Equal to the fallback: said as such, not as widened.
    assert intervals._at_least(0.2, 0.2, "x") == (0.2, "already as wide as x")
    assert intervals._at_least(0.1, 0.2, "x") == (0.2, "widened to x")


def test_low_confidence_rows_carry_no_weight():
    res = intervals.load_residuals()
    low = res["confidence"].astype(str).str.split().str[0] == "low"
    # henkdr's DP 8 row, Korthikanti's text figure, the Crusher log (at least)
    assert low.sum() >= 3
    crusher = res["source"] == "sajal-vt/Megatron-DeepSpeed-ORNL"
    assert (low & crusher).sum() == 1 and res[crusher]["loso_log_residual"].notna().all()
    assert not intervals.usable(res).index.isin(res.index[low]).any()


def test_add_intervals_gives_the_margin_and_the_basis():
    frame = pd.DataFrame({"engine": ["native", "megatron"], "sharding": ["zero3", "zero1"],
                          "gpus": [64, 64], "step_time_s": [2.0, 2.0],
                          "tokens_per_s": [1e5, 1e5], "peak_memory_bytes": [40e9, 79e9]})
    out = intervals.add_intervals(frame, load_system("dgx-h100"), 0.8)
    assert list(out["memory_margin"].round(4)) == [0.5, 0.0125]
    assert list(out["memory_verdict"]) == ["fits", "tight"]
    assert out["interval_basis"].str.startswith(("native+sharded", "megatron")).all()
    assert (out["step_time_s_high"] > 2.0).all() and (out["step_time_s_low"] < 2.0).all()


@pytest.mark.xfail(strict=True, reason=(
    "not met: leave-one-source-out step-time error (mean |predicted/measured - 1|) is within "
    "10 % in every family of 3 rows or more but native+sharded+fp8@nvidia, 11.1 % on 16 rows "
    "(TorchTitan's Llama 3.1 8B cp 4 / cp 8 rows 40 % and 47 % fast with PyTorch's compiled "
    "ring priced on the 32 heads their torchtitan's repeat_kv gives it, the other 14 rows "
    "8.3 %; "
    "megatron+fp8@amd is 2.8 % since Megatron's attention runs at its kernel's measured "
    "rate): docs/costmodel.md 'The corpus'"))
def test_loso_step_time_error_per_family_at_most_ten_percent():
    res = intervals.usable(intervals.load_residuals())
    over = {}
    for fam, rows in res.groupby("family"):
        err = np.abs(np.exp(rows["loso_log_residual"]) - 1).mean()
        if len(rows) >= 3 and err > 0.10:
            over[fam] = round(float(err), 3)
    assert not over, over


def test_moe_loso_step_time_error_at_most_fifteen_percent():
    """Issue 53: the Mixture-of-Experts rows (every family whose engine label says ``moe``:
    Megatron-LM's MoE README, two Mixtral 8x7B rows on 64 H100; the DeepSeek-V3 report on 2048
    H800; a Primus log of Mixtral 8x7B on 64 MI325X) are predicted with the catalog's knobs,
    fitted to no MoE source, so their error is leave-one-source-out as it stands: the mean
    within 15 % (the issue's target; today 9.9 %, the largest 21.1 %, the MI325X row, predicted
    fast), and the 80 % interval built without each row's source covering at
    least two rows in three. Before the
    router imbalance took what the balance holds even and DualPipe its mirrored stages
    (costmodel/moe.py) the two families stood at 113 % and 28 %."""
    stored = intervals.load_residuals()
    res = intervals.usable(stored)
    moe_rows = res[res["family"].str.contains("moe")]
    err = np.abs(np.exp(moe_rows["loso_log_residual"].to_numpy(float)) - 1)
    assert len(moe_rows) >= 3 and moe_rows["source"].nunique() >= 2
    assert err.mean() <= 0.15, err
    cov = intervals.loso_coverage(0.8, stored)
    covered = cov[cov["family"].str.contains("moe")]["covered"]
    assert len(covered) == len(moe_rows) and covered.mean() >= 2 / 3


def test_no_refit_puts_matmul_above_the_gpus_best_gemm():
    """Without Korthikanti et al.'s rows, dgx-a100 is refitted on Narayanan et al.'s three
    ZeRO-3 rows: one model shape at TP 1, so one GEMM size, which cannot tell the GEMM size law
    from the rate; the law is the H100's (analysis/loso_residuals.py) and ``matmul`` alone is
    refitted, below the A100's maximum achievable matmul efficiency (86.9 %,
    analysis/fit_efficiency.MAMF). Korthikanti's TP-8 GEMMs are then priced at their narrow
    sides (costmodel/gemm.py): the stored residuals are those of that refit, their mean error
    under 6 % (17 % when the law was in the model's width and refitted on those three rows)."""
    fit_efficiency, loso_residuals = _analysis("fit_efficiency", "loso_residuals")
    runs = load_calibration()
    systems, how = loso_residuals.systems_without(runs, "Korthikanti2022")
    a100 = systems["dgx-a100"]
    assert how == "dgx-a100 refitted on 3 rows (one GEMM size: dgx-h100's size law)"
    assert a100.matmul_half_hidden == load_system("dgx-h100").matmul_half_hidden
    assert 0.80 <= a100.eff("matmul") <= fit_efficiency.matmul_ceiling(a100) < 0.87
    stored = intervals.load_residuals()
    stored = stored[(stored["source"] == "Korthikanti2022")
                    & (stored["file"] == "calibration_runs.csv")]["loso_log_residual"].to_numpy()
    now = [r["loso_log_residual"] for r in loso_residuals.residual_rows(runs, "Korthikanti2022")
           if r["file"] == "calibration_runs.csv"]
    assert now == pytest.approx(list(stored), abs=1e-4)
    assert np.abs(np.exp(stored) - 1).mean() < 0.06


def test_stored_residuals_match_the_cost_model():
    """The residuals the intervals read were computed with this cost model: the rows of the
    sources nothing was fitted to (the sharded table's, predicted with the catalog's knobs)
    recomputed now match the stored ones. A cost model change that moves them means: rerun
    analysis/loso_residuals.py."""
    (loso_residuals,) = _analysis("loso_residuals")
    runs = load_calibration()
    stored = intervals.load_residuals()
    assert len(stored) == len(runs) >= 126
    sharded = runs["file"] == "calibration_runs_sharded.csv"
    now = validate_runs(runs[sharded])
    for (_, row), (_, pred) in zip(stored[sharded.to_numpy()].iterrows(), now.iterrows(),
                                   strict=True):
        if pd.isna(row["loso_log_residual"]):
            assert pd.isna(pred["predicted"])
            continue
        residual = loso_residuals.step_log_residual(pred)
        assert residual == pytest.approx(row["loso_log_residual"], abs=1e-4), row["model"]


def test_a_system_is_fitted_only_where_knobs_were_fitted_to_its_rows():
    """LUMI-G has rows in the sharded table, but nothing is fitted to that table: its knobs
    are carried over (``transferred``); the first table's systems are ``fitted``."""
    assert intervals.system_class(load_system("lumi-g")) == "transferred"
    # MaxText's A3 rows are in the sharded table: gcp-a3-high carries the DGX H100's knobs.
    assert intervals.system_class(load_system("gcp-a3-high")) == "transferred"
    assert intervals.system_class(load_system("grand-teton-h100")) == "fitted"
    assert intervals.system_class(load_system("dgx-h100")) == "fitted"


def _analysis(*names: str) -> list:
    """Modules of analysis/ (scripts, not a package), imported by name."""
    import importlib

    sys.path.insert(0, str(ANALYSIS))
    try:
        return [importlib.import_module(n) for n in names]
    finally:
        sys.path.remove(str(ANALYSIS))


def test_the_plan_says_which_rows_a_frontier_prediction_rests_on():
    """Frontier has no usable row of its own; its line names the MI250X rows (LUMI-G's, by
    source) its intervals rest on."""
    from frontier_llm.planner.allocation import rests_on

    line = rests_on(load_system("frontier"))
    assert "no published run of its own" in line
    assert re.search(r"intervals rest on the AMD MI250X GCD's \d+ published runs", line)
    assert "on lumi-g" in line and "spyysalo/lumi-llm-scaling" in line
    assert "deepspeed@amd 13, megatron@amd 1" in line
    assert "intervals rest on the" not in rests_on(load_system("dgx-a100"))


def test_the_mi250x_matmul_is_what_its_own_rows_fit():
    """Frontier's and LUMI-G's matmul (0.49) is anchored on Dash et al.'s figure; refitted on
    the MI250X's own usable rows of every table (analysis/fit_efficiency.py --corpus), one round
    of the coordinate search keeps it, so those rows stay out of sample and the anchor is what
    they measure."""
    (fit_efficiency,) = _analysis("fit_efficiency")
    rows = fit_efficiency.corpus_rows()
    mi250x = rows[[row_system(r).gpu == "AMD MI250X GCD" for _, r in rows.iterrows()]]
    assert len(mi250x) >= 14 and {row_system(r).name for _, r in mi250x.iterrows()} == {"lumi-g"}
    base = load_system("lumi-g")
    assert base.eff("matmul") == load_system("frontier").eff("matmul") == 0.49
    fitted = fit_efficiency.fit(mi250x, base, ["matmul"], {"matmul": 0.49}, rounds=1)
    assert fitted["matmul"] == pytest.approx(0.49)


def test_an_fp8_layout_rests_on_the_fp8_rows_of_its_engine():
    """FP8 rows form their own families (+fp8): an fp8 layout's interval names them, a bf16
    layout's does not, and the two widths come from different rows."""
    frame = pd.DataFrame({"engine": ["megatron", "megatron"], "sharding": ["zero1", "zero1"],
                          "dtype": ["fp8", "bf16"], "step_time_s": [2.0, 2.0],
                          "tokens_per_s": [1e5, 1e5], "peak_memory_bytes": [40e9, 40e9]})
    out = intervals.add_intervals(frame, load_system("dgx-h100"), 0.8)
    assert out["interval_basis"].iloc[0].startswith("megatron+fp8@nvidia")
    assert not out["interval_basis"].iloc[1].startswith("megatron+fp8")
    assert out["step_time_s_high"].iloc[0] != out["step_time_s_high"].iloc[1]


def test_a_layout_row_beyond_its_family_scale_is_widened_as_a_curve_point(capsys):
    """flm plan's and flm predict's rows carry a layout, not a ``gpus`` column: the scale rule
    must read the layout's world. It did not, so a 512-GPU FSDP layout kept its family's own
    width while the same point of a ``--curve`` was widened."""
    system = load_system("dgx-h100")
    row = pd.DataFrame([{"engine": "native", "sharding": "zero3", "tp": 1, "cp": 1, "pp": 1,
                         "dp": 512, "step_time_s": 2.0, "tokens_per_s": 1.0,
                         "peak_memory_bytes": 1e9}])
    q = math.log(intervals.add_intervals(row, system)["step_time_s_high"].iloc[0] / 2.0)
    at_scale = intervals.step_width(system, "native", sharding="zero3", gpus=512)
    within = intervals.step_width(system, "native", sharding="zero3", gpus=8)
    assert at_scale.q > within.q  # the rule acts at 512 GPUs on this family
    assert q == pytest.approx(at_scale.q, rel=1e-12)

    from frontier_llm.cli import main
    assert main(["predict", "--model", "llama3-8b", "--system", "dgx-h100", "--gpus", "512",
                 "--engine", "native", "--tp", "1", "--pp", "1", "--dp", "512",
                 "--micro-batch", "1", "--global-batch", "512", "--zero", "3",
                 "--format", "json"]) == 0
    import json
    out = json.loads(capsys.readouterr().out)
    assert "beyond them in scale (512 GPUs" in out["interval_basis"]
    assert math.log(out["step_time_s_high"] / out["step_time_s"]) == pytest.approx(at_scale.q)
