"""The FP8 and new-GPU published runs (planner/data/calibration_runs_fp8.csv), predicted with
nothing fitted to them: leave-one-source-out by construction (analysis/fp8_loso.py; the tables
of docs/costmodel.md "FP8"). Targets from issue 52: <= 12 % mean error on the FP8 family,
<= 15 % on each new GPU with 3 rows or more; the ones not met are xfail with the figure."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))
from fp8_loso import FP8_RUNS, family_errors, predicted_runs, speedups

NEW_GPUS = ("dgx-h200", "dgx-b200", "gb200-nvl72", "mi300x", "mi325x", "mi355x")


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    return predicted_runs()


def test_every_row_states_its_source_quote_precision_and_confidence():
    runs = pd.read_csv(FP8_RUNS)
    base = pd.read_csv(FP8_RUNS.with_name("calibration_runs_sharded.csv"), nrows=0)
    assert list(runs.columns[:len(base.columns)]) == list(base.columns)
    assert {"dtype", "fp8_recipe", "derived"} <= set(runs.columns)
    assert runs["dtype"].isin(["bf16", "fp8"]).all()
    assert runs.loc[runs["dtype"] == "fp8", "fp8_recipe"].notna().all()
    assert runs["confidence"].isin(["high", "medium", "low"]).all()
    # Every row quotes its source (the exact words in single quotes) in its notes.
    assert runs["notes"].str.contains("'").all()


def test_every_row_is_predicted(table):
    assert table["predicted"].notna().all()
    assert set(table["system"]) <= {"grand-teton-h100", "dgx-h100", *NEW_GPUS}


def test_a_source_a_system_was_fitted_to_is_predicted_without_it():
    """TorchTitan's bf16 row fixed grand-teton-h100's matmul knob, so its FP8 rows are predicted
    with the DGX H100's knobs carried over (the drift guard's rule), the FP8 knob moving with
    matmul; a source nothing was fitted to keeps the catalog's."""
    from fp8_loso import systems_left_out

    from frontier_llm.catalog import load_system

    moved = systems_left_out("TorchTitan")["grand-teton-h100"]
    catalog, donor = load_system("grand-teton-h100"), load_system("dgx-h100")
    # The DGX H100's GEMM size law and collective rate, not the catalog's own (its matmul share
    # of MAMF happens to equal the Grand Teton fit, 0.67: the same chip).
    assert moved.matmul_half_hidden == donor.matmul_half_hidden != catalog.matmul_half_hidden
    assert moved.eff("collective") == donor.eff("collective")
    assert moved.eff("matmul_fp8") / moved.eff("matmul") == pytest.approx(
        catalog.eff("matmul_fp8") / catalog.eff("matmul"))
    assert systems_left_out("MLPerf-Training-v5.1-Dell") == {}


def test_the_fp8_speedup_on_h100_is_within_2_percent(table):
    """Where the bf16 baseline's error cancels (same layout, same source), the fp8 speed-up the
    model predicts is the measured one: 1.250 and 1.248 measured, 1.251 predicted."""
    s = speedups(table)
    h100 = s[s["gpu"].str.contains("H100")]
    assert len(h100) == 2
    assert h100["error"].abs().max() <= 0.02, h100


def test_fp8_nvidia_family_error(table):
    """FP8 x NVIDIA, leave-one-source-out: 39 confident rows from 14 sources (torchao's docs,
    torchtitan's commit and TorchTitan's 2024-12 benchmark on Grand Teton H100, its Table 2
    with cp 1-8; MLPerf Training v4.1 GPT-3 175B: NVIDIA on H100 and B200, Oracle on H100; v5.0
    Llama 3.1 405B with context parallelism 2: NVIDIA on 256 and 512 GB200 and on 512-8,192
    H100, IBM+CoreWeave on 512-2,496 GB200, Nebius on 512 and 1,024 H200; v5.1 Llama 3.1 8B:
    Dell and University of Florida on B200, Cisco on H100, HPE on 64 H200, Oracle and Verda on
    64 B200, the last three with cp 2), against the issue's 12 %. TorchTitan's rows are
    predicted with the Grand Teton knob its bf16 row was not fitted to (analysis/fp8_loso.py
    systems_left_out). 11.88 % since the native engine prices PyTorch's context_parallel ring
    (its gather hidden behind the first partial attention, its fp32 merge traffic:
    docs/costmodel.md "Context parallelism"; 12.02 % before): met, by a thin margin, with the
    TorchTitan cp 4 / cp 8 rows still 46 % and 54 % fast (below)."""
    fam = family_errors(table).set_index("family")
    nv = fam.loc["fp8 x NVIDIA"]
    assert nv["rows"] >= 39 and nv["sources"] >= 14, fam
    assert nv["mape"] <= 0.12, fam


def test_fp8_nvidia_rows_and_the_two_long_context_misses(table):
    """The family has its 39 rows, and its two worst are the TorchTitan cp 4 / cp 8 rows (from
    64K to 128K tokens the measured rate falls 2.37x, more than the 2x that doubling the
    attention per token can cost; the model 1.75x): without them it is well within 12 %."""
    fam = family_errors(table).set_index("family")
    assert fam.loc["fp8 x NVIDIA", "rows"] == 39
    nv = table[(table["vendor"] == "NVIDIA") & (table["dtype"] == "fp8")
               & (table["confidence"] != "low")]
    long_cp = nv["layout"].str.contains("cp4|cp8")
    assert long_cp.sum() == 2 and (nv.loc[long_cp, "error"] > 0.4).all()
    assert nv.loc[~long_cp, "error"].abs().mean() <= 0.12


@pytest.mark.xfail(strict=True, reason=(
    "not met: FP8 x AMD (4 rows, two chips, four sources) is 30 % off: the MI300X torchao row "
    "is 57 % fast (its bf16 twin 32 % fast: the MAMF-transferred bf16 knob, and an FP8 knob "
    "assumed from the H100's ratio that the row puts at 0.21-0.24); the three MI355X MLPerf "
    "Llama 3.1 8B rows (AMD's TransformerEngine code, run by AMD, GigaComputing and Dell) are "
    "20-25 % slow (they imply FP8 matmul fractions of 0.76-0.86 against the 0.53 assumed, and "
    "the bf16 knob under them is unjudged: no bf16 MI355X row). No published FP8 "
    "achievable-matmul measurement of either chip was found to replace the assumed knobs "
    "(stas00/ml-engineering@744d01e MAMF table: MI355X bf16 only)"))
def test_fp8_amd_family_error(table):
    fam = family_errors(table).set_index("family")
    assert fam.loc["fp8 x AMD", "mape"] <= 0.12, fam


def test_new_gpus_with_three_confident_rows(table):
    """The per-GPU target applies to GPUs with >= 3 confident rows: the DGX B200 (6 MLPerf rows,
    five sources: 8.4 %; Oracle's and Verda's 64-GPU cp-2 runs 17 % fast), the GB200 NVL72 (7
    MLPerf v5.0 Llama 3.1 405B rows, cp 2, NVIDIA and IBM+CoreWeave: 13.6 %) and the H200
    (Nebius's two 405B rows and HPE's 8B row, all with cp 2: 7.5 %) are within 15 %; the MI355X
    (3 rows) is not (see the xfail below); the MI300X has 2, and torchao's 'power limited' B200
    rows are low confidence. The counts are asserted so that a row added later makes the target
    bite."""
    per = family_errors(table, "system").set_index("system")
    eligible = per[(per["rows"] >= 3) & per.index.isin(NEW_GPUS)]
    assert list(eligible.index) == ["dgx-b200", "dgx-h200", "gb200-nvl72", "mi355x"], per
    met = eligible.drop(index="mi355x")
    assert (met["sources"] >= 2).all(), met
    assert (met["mape"] <= 0.15).all(), met
    assert per.loc["mi300x", "rows"] == 2 and per.loc["mi355x", "rows"] == 3
    assert per.loc["dgx-b200", "rows"] == 6


@pytest.mark.xfail(strict=True, reason=(
    "not met: MI355X, 3 MLPerf v5.1 Llama 3.1 8B FP8 rows of three submitters (AMD, "
    "GigaComputing, Dell, all AMD's code), 21 % off, every one slow: the FP8 matmul knob is "
    "ASSUMED (0.53 = the bf16 MAMF transfer x the H100's FP8/bf16 ratio); the rows imply "
    "0.76-0.86 and no published MI355X FP8 achievable-matmul measurement was found to source a "
    "refit (fitting it to these rows would judge it on the rows it was fitted to)"))
def test_mi355x_error(table):
    per = family_errors(table, "system").set_index("system")
    assert per.loc["mi355x", "mape"] <= 0.15, per


def test_rows_state_context_parallelism_and_are_predicted_with_it(table):
    """The cp column (planner/calibration.py row_cp): MLPerf's Llama 3.1 405B runs split each
    sequence over 2 GPUs ('export CONTEXT_PARALLEL=2'), so tp x cp x pp x dp = GPUs and the
    predicted layout keeps the stated cp and dp; a row with the cell empty is pinned to cp 1."""
    from frontier_llm.planner.calibration import row_batches, row_cp, row_space

    runs = pd.read_csv(FP8_RUNS)
    stated = runs[runs["cp"].notna()]
    assert len(stated) >= 15 and (stated["cp"] == 2).sum() >= 15
    for i, row in stated.iterrows():
        cp = row_cp(row)
        assert row["tp"] * row["pp"] * cp * row["dp"] == row["num_gpus"], row["source"]
        assert row_space(row).cp == (cp,)
        assert f"cp{cp}" in table.loc[i, "layout"] if cp > 1 else "cp" not in table.loc[i, "layout"]
        assert f"dp{int(row['dp'])} " in table.loc[i, "layout"]
    plain = runs[runs["cp"].isna()].iloc[0]
    assert row_cp(plain) == 1 and row_space(plain).cp == (1,)
    # Without a stated dp, the data-parallel degree is what tp x cp x pp leaves.
    guessed = stated.iloc[0].drop(["dp", "global_batch"])
    guessed["engine"] = "TorchTitan FSDP2"
    assert row_batches(guessed) == tuple(
        m * int(guessed["num_gpus"]) // (int(guessed["tp"]) * int(guessed["pp"]) * 2)
        for m in (1,))


def test_each_measurement_counts_once():
    """Nebius's v5.1 Llama 3.1 405B H200 logs give the v5.0 step times to the fourth decimal
    (the same runs resubmitted): one row each. No two rows share GPU count and step time."""
    runs = pd.read_csv(FP8_RUNS)
    timed = runs[runs["iteration_time_s"].notna()]
    assert not timed.duplicated(["num_gpus", "iteration_time_s"]).any()
    nebius = runs[runs["source"].str.contains("Nebius")]
    assert len(nebius) == 2 and nebius["source"].str.contains("v5.0").all()


def test_the_implied_knobs_reproduce_their_rows_and_mi300x_is_below_the_carried():
    """Inverting the model per row (analysis/fp8_loso.py, last table): at the implied knob the
    row's error is ~0, and the MI300X bf16 row implies a matmul fraction well below the 0.49
    carried from the MAMF transfer (issue 52 quotes about 0.34 from two Megatron runs; the torchao
    row gives 0.365). Not fitted: one source cannot be judged leave-one-source-out."""
    from fp8_loso import _error_with, implied_knobs

    knobs = implied_knobs()
    # IBM+CoreWeave's 2,048- and 2,496-GPU GB200 rows are predicted too slow at any matmul
    # fraction: the model's step there is set by exposed data-parallel and pipeline traffic
    # (flm's rank order puts the pipeline, not the data-parallel groups, across racks; the
    # runs' TP_PP_DP_MAPPING does the opposite), so no matmul knob reproduces them.
    unsolved = knobs[knobs["implied"].isna()]
    assert set(unsolved["system"]) <= {"gb200-nvl72"} and len(unsolved) <= 2, unsolved
    assert knobs["implied"].dropna().between(0.02, 1.0).all(), knobs
    runs = pd.read_csv(FP8_RUNS)
    mi = knobs[(knobs["system"] == "mi300x") & (knobs["dtype"] == "bf16")].iloc[0]
    row = runs[runs["gpu_type"].str.contains("MI300X") & (runs["dtype"] == "bf16")]
    assert abs(_error_with(row, {"matmul": mi["implied"]})) < 0.005
    assert 0.30 < mi["implied"] < 0.45 < mi["carried"]


def test_rows_state_fp8_parameters_and_the_gradient_dtype_in_their_own_columns():
    """FP8 parameters and a bf16 gradient buffer are priced only where a row's columns state
    them (notes quoting FP8_PARAMS / fp8_param_gather; the run's code passing
    grad_reduce_in_fp32=False); a row stating neither keeps Megatron-LM's defaults."""
    from frontier_llm.planner.calibration import DATA, load_runs, row_fp8_params, row_reduce_fp32
    runs = load_runs(DATA / "calibration_runs_fp8.csv")
    for _, row in runs.iterrows():
        quoted = any(k in str(row["notes"]) for k in ("FP8_PARAMS", "FP8_PARAM_GATHER",
                                                      "fp8_param_gather=True"))
        assert row_fp8_params(row) == quoted, row["source"]
    bf16 = runs[runs["grad_reduce_dtype"].astype(str) == "bf16"]
    assert len(bf16) and all(row_reduce_fp32(r) is False for _, r in bf16.iterrows())
    # The MLPerf v5.0 405B rows (their NeMo pretrain.py, docs/costmodel.md) and the rows whose
    # notes quote their own code's grad_reduce_in_fp32=False (Cisco's v5.1 8B).
    assert all("llama31_405b" in str(r["engine"]) or "grad_reduce_in_fp32=False" in r["notes"]
               for _, r in bf16.iterrows())
    assert (bf16["source"].str.contains("Cisco")).sum() == 2
    plain = pd.Series({"engine": "Megatron-LM", "notes": "", "source": "x"})
    assert row_fp8_params(plain) is False and row_reduce_fp32(plain) is None
