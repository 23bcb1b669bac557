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
    """FP8 x NVIDIA, leave-one-source-out: 44 confident rows from 14 sources (torchao's docs,
    torchtitan's commit and TorchTitan's 2024-12 benchmark on Grand Teton H100: its Table 2
    with cp 1-8, its 405B Tables 5 and 6, tp 8 x pp 8, Table 6 with cp 1-8; MLPerf Training
    v4.1 GPT-3 175B: NVIDIA on H100 and B200, Oracle on H100; v5.0 Llama 3.1 405B with context
    parallelism 2: NVIDIA on 256 and 512 GB200 and on 512-8,192 H100, IBM+CoreWeave on
    512-2,496 GB200, Nebius on 512 and 1,024 H200; v5.1 Llama 3.1 8B: Dell and University of
    Florida on B200, Cisco on H100, HPE on 64 H200, Oracle and Verda on 64 B200, the last three
    with cp 2), against the issue's 12 %: 9.5 % (12.02 % before the MLPerf rows stated what
    their configs set: bf16 gradient reduction on every NVIDIA / NeMo row, FP8 parameters on
    the 11,616-GPU GPT-3 row, NVIDIA's GB200 rows and HPE's H200 row, 11.89 %; the interleaved
    rows' overlapped pipeline sends, overlap_p2p_comm, 10.27 %; PyTorch's context_parallel ring
    priced for TorchTitan's cp rows, 10.1 %; 9.8 % on 39 rows before the 405B rows of Tables 5
    and 6 came in, 1 % slow to 18 % fast). TorchTitan's 8B cp 4 / cp 8 rows (40 % and 47 % fast)
    carry much of what is left. TorchTitan's rows are predicted with the Grand Teton knob its
    bf16 row was not fitted to (analysis/fp8_loso.py systems_left_out)."""
    fam = family_errors(table).set_index("family")
    nv = fam.loc["fp8 x NVIDIA"]
    assert nv["rows"] >= 44 and nv["sources"] >= 14, fam
    assert nv["mape"] <= 0.12, fam


def test_fp8_nvidia_rows_and_the_two_long_context_misses(table):
    """The family has its 44 rows (TorchTitan's Table 5 1F1B and four Table 6 rows among them),
    and the two TorchTitan Llama 3.1 8B cp 4 / cp 8 rows are its largest misses (over 40 % fast
    each): without them the family is 7.9 %. The same file's 405B cp 4 / cp 8 runs (Table 6:
    tp 8, pp 8, the same ring) are 5 % and 18 % fast."""
    fam = family_errors(table).set_index("family")
    assert fam.loc["fp8 x NVIDIA", "rows"] == 44
    nv = table[(table["vendor"] == "NVIDIA") & (table["dtype"] == "fp8")
               & (table["confidence"] != "low")]
    long_cp = nv["layout"].str.contains("tp1 cp4|tp1 cp8")
    assert long_cp.sum() == 2 and (nv.loc[long_cp, "error"] > 0.4).all()
    assert (nv.loc[~long_cp, "error"].abs() < 0.4).all()
    assert nv.loc[~long_cp, "error"].abs().mean() <= 0.09
    table6 = nv["layout"].str.contains("tp8 cp[48] pp8", regex=True)
    assert table6.sum() == 2 and nv.loc[table6, "error"].abs().max() < 0.2


def test_fp8_amd_family_error(table):
    """FP8 x AMD, 7 rows of seven sources on three chips, within 12 % (11.8 %): the four MI355X
    MLPerf rows within 3.4 %, the two 8-node MI325X runs 6 % slow and 4 % fast (Megatron's
    attention at AITER's measured MI300X rate, the matmul knobs from AMD's MAF table); the
    MI300X torchao row alone is 66 % fast (its bf16 twin 39 %: torchtitan on ROCm, whose SDPA
    kernel has no published backward rate), so without it the family is 2.8 %. It was 14.2 %
    with CDNA3's attention at the GEMM rate and the MI325X's FP8 knob assumed."""
    fam = family_errors(table).set_index("family")
    assert fam.loc["fp8 x AMD", "mape"] <= 0.12, fam


def test_new_gpus_with_three_confident_rows(table):
    """The per-GPU target applies to GPUs with >= 3 confident rows: the DGX B200 (6 MLPerf rows,
    five sources: 8.6 %; Oracle's and Verda's 64-GPU cp-2 runs 20 % fast), the GB200 NVL72 (7
    MLPerf v5.0 Llama 3.1 405B rows, cp 2, NVIDIA and IBM+CoreWeave: 4.3 %), the H200 (Nebius's
    two 405B rows and HPE's 8B row, all with cp 2: 5.0 %) and the MI355X (4 rows, four
    submitters of AMD's one recipe) and the MI325X (3 rows, two sources: AMD's
    performance-results page, an FP8 8B and a bf16 70B run on 64 GPUs, and a Primus log of
    Llama 2 7B FP8 on 64 GPUs) are within 15 %; the MI300X has 2 (torchao's), and
    torchao's 'power limited' B200 rows are low confidence. The counts are asserted so that a
    row added later makes the target bite."""
    per = family_errors(table, "system").set_index("system")
    eligible = per[(per["rows"] >= 3) & per.index.isin(NEW_GPUS)]
    assert list(eligible.index) == ["dgx-b200", "dgx-h200", "gb200-nvl72", "mi325x", "mi355x"], per
    assert (eligible["sources"] >= 2).all(), eligible
    assert (eligible["mape"] <= 0.15).all(), eligible
    assert per.loc["mi300x", "rows"] == 2 and per.loc["mi355x", "rows"] == 4
    assert per.loc["mi325x", "rows"] == 3 and per.loc["mi325x", "sources"] == 2
    assert per.loc["dgx-b200", "rows"] == 6


def test_mi325x_error(table):
    """MI325X, 3 rows of two sources (AMD's performance-results page: 8-node Llama 3.1 8B FP8 and
    70B bf16 FSDP2 runs; a Primus log's 8-node Llama 2 7B FP8 run), within 15 % (6.9 %: 6 % and
    11 % slow, 4 % fast) on knobs transferred from AMD's measured MAF table (bf16 843, FP8 1519
    TFLOP/s) and, for the two Megatron runs, attention at AITER's measured MI300X rate. It was
    17.7 %, all three slow, while the bf16 knob came from an older hipBLASLt (ROCm 6.2.4, 784.9),
    the FP8 one was ASSUMED from the H100's FP8/bf16 ratio and attention ran at the GEMM rate."""
    per = family_errors(table, "system").set_index("system")
    assert per.loc["mi325x", "mape"] <= 0.15, per


def test_mi355x_error(table):
    """MI355X, 4 MLPerf v5.1 Llama 3.1 8B FP8 rows of four submitters (AMD, GigaComputing,
    Dell, Supermicro, all AMD's one reference recipe: TransformerEngine delayed scaling, bf16
    CK fused attention v3, FP8 parameters, bf16 gradient buffers), within 5 % (1.6 %; 13.6 %,
    every row slow, before the attention core ran at AITER's measured kernel rate,
    costmodel/attention_kernels.py) with the FP8 knob from AMD's measured hipBLASLt FP8 GEMM
    (ROCm blog cdna4-gemm-kernels, Table 5: 3130.21 of 5,033.2 TFLOP/s at 8192^3, the MAMF bf16
    share, so matmul_fp8 = matmul = 0.600): nothing is fitted to the rows."""
    per = family_errors(table, "system").set_index("system")
    mi = per.loc["mi355x"]
    assert mi["rows"] == 4 and mi["sources"] == 4, per
    assert mi["mape"] <= 0.05, per
    rows = table[table["system"] == "mi355x"]
    assert (rows["error"].abs() < 0.05).all(), rows


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
    from frontier_llm.planner.calibration import (
        DATA,
        load_runs,
        row_fp8_params,
        row_p2p_overlap,
        row_reduce_fp32,
    )
    runs = load_runs(DATA / "calibration_runs_fp8.csv")
    for _, row in runs.iterrows():
        quoted = any(k in str(row["notes"]) for k in ("FP8_PARAMS", "FP8_PARAM_GATHER",
                                                      "fp8_param_gather=True"))
        assert row_fp8_params(row) == quoted, row["source"]
    bf16 = runs[runs["grad_reduce_dtype"].astype(str) == "bf16"]
    assert len(bf16) and all(row_reduce_fp32(r) is False for _, r in bf16.iterrows())
    # Every MLPerf row's code reduces gradients in bf16: NeMo's pretrain.py (v5.0 Llama 3.1
    # 405B, v5.1 Llama 3.1 8B) and AMD's llama31_8b train.py pass grad_reduce_in_fp32=False;
    # the v4.1 GPT-3 recipes' distributed_fused_adam sets grad_sync_dtype bf16. The others
    # (torchao / torchtitan) state nothing and keep their engine's rule.
    mlperf = runs["source"].str.startswith("MLPerf")
    assert set(bf16.index) == set(runs[mlperf].index)
    assert all(("grad_reduce_in_fp32=False" in str(r["notes"])
                or "grad_sync_dtype: bf16" in str(r["notes"])) for _, r in bf16.iterrows())
    assert (bf16["gpu_type"].str.contains("MI355X")).sum() == 4
    # The interleaved rows (v4.1 GPT-3, v5.0 Llama 3.1 405B) quote overlap_p2p_comm on; the
    # others have no interleaved schedule for it to act on.
    inter = runs["notes"].astype(str).str.contains("INTERLEAVED_PIPELINE=[0-9]", regex=True)
    assert inter.sum() == 20
    assert all(row_p2p_overlap(r) == bool(i) for (_, r), i in zip(runs.iterrows(), inter,
                                                                   strict=True))
    plain = pd.Series({"engine": "Megatron-LM", "notes": "", "source": "x"})
    assert row_fp8_params(plain) is False and row_reduce_fp32(plain) is None
    assert row_p2p_overlap(plain) is False


def test_a_loso_refit_of_the_fp8_knob_is_shown_not_adopted():
    """analysis/fp8_loso.py refit_loso, the diagnostic docs/costmodel.md "FP8" quotes: with
    Megatron's attention at AITER's measured kernel rate, fitting the MI355X's matmul_fp8 on the
    other three submitters' rows lands on the chip's measured FP8 GEMM share (0.59-0.61 against
    the 0.600 carried; it was 0.77-0.80 while attention was priced at the GEMM rate), and
    predicts the held-out one no better than the carried knob: nothing is left for a fit to
    absorb. On the H200, whose two sources run different models (405B and 8B), the same refit
    predicts the held-out source worse than the measured-GEMM knob does."""
    from fp8_loso import refit_loso

    from frontier_llm.catalog import load_system

    r = refit_loso(systems=("mi355x", "dgx-h200")).set_index(["system", "held_out"])
    mi = r.loc["mi355x"]
    assert len(mi) == 4 and (mi["rows"] == 1).all()
    assert (mi["mape_carried"] < 0.05).all(), mi
    assert ((mi["fitted"] - load_system("mi355x").eff("matmul_fp8")).abs() <= 0.02).all(), mi
    h200 = r.loc["dgx-h200"]
    worse = (h200["mape_refit"] * h200["rows"]).sum() / h200["rows"].sum()
    carried = (h200["mape_carried"] * h200["rows"]).sum() / h200["rows"].sum()
    assert worse > carried + 0.05, h200


def test_torchtitan_cp_rows_state_the_repeated_kv_heads():
    """The fp8 table's ``cp_heads`` column (the K/V heads SDPA receives): every row whose source
    states a torchtitan before ff0829c dropped ``repeat_kv`` (9dec370, the benchmark file's;
    7a04053, 2c8b5947, 6fc499f6 of the torchao rows) states all its query heads, which the
    flash kernel saves and, on TorchTitan's Table 2 and Table 6 cp rows, the ring exchanges;
    every other row states none (the model's kv heads). Without the column the cp rows are
    predicted faster."""
    from frontier_llm.errors import UserError
    from frontier_llm.planner.calibration import (
        CALIBRATION_FILES,
        load_runs,
        predict_row,
        row_cp,
        row_cp_heads,
    )

    stated = cp_rows = 0
    for path in CALIBRATION_FILES:
        for _, row in load_runs(path).iterrows():
            heads = row_cp_heads(row)
            if heads is None:
                continue
            stated += 1
            cp_rows += row_cp(row) > 1
            text = f"{row['source']} {row['notes']} {row['derived']}"
            assert any(c in text for c in ("9dec370", "7a04053", "2c8b5947", "6fc499f6")), text
            assert heads == int(row["heads"])
            assert "repeat_kv" in row["derived"] and "ff0829c" in row["derived"]
    assert (stated, cp_rows) == (41, 6)
    fp8 = load_runs(next(p for p in CALIBRATION_FILES if str(p).endswith("_fp8.csv")))
    row = fp8[(fp8["cp"] == 8) & fp8["source"].str.contains("Table 2")].iloc[0]
    assert row_cp_heads(row) == 32
    with_heads = predict_row(row)
    without = predict_row(row.copy().drop(labels=["cp_heads"]))
    assert with_heads["predicted"] < without["predicted"]  # tokens/s: a slower step
    bad = row.copy()
    bad["cp_heads"] = 2.5
    with pytest.raises(UserError, match="cp_heads"):
        row_cp_heads(bad)


def test_torchtitan_pipelined_rows_hold_a_gathered_stage_and_fp32_gradients():
    """TorchTitan's six 405B rows (Table 5's two schedules, Table 6's cp 1-8; 512 Grand Teton
    H100s, tp 8 x pp 8): their torchtitan keeps a pipelined stage's parameters gathered
    (9dec370 apply_fsdp: "For PP, do not reshard after forward"), torch's PipelineStage
    accumulates the stage's unsharded gradients over the micro-batches, and torchtitan's FSDP2
    policy holds them in fp32 (mixed_precision_reduce "float32"). Priced so, each measured peak
    is within 10 % (2.10: 47-56 % under, the corpus's worst memory rows)."""
    from frontier_llm.planner.calibration import (
        DATA,
        load_runs,
        row_reduce_fp32,
        row_space,
        validate_runs,
    )

    runs = load_runs(DATA / "calibration_runs_fp8.csv")
    rows = runs[runs["source"].str.contains("TorchTitan") & (runs["pp"] > 1)]
    assert len(rows) == 6
    for _, row in rows.iterrows():
        assert row_space(row).reshard_after_forward == (False,)
        assert row_reduce_fp32(row) is True
    got = validate_runs(rows)
    assert got["memory_error"].abs().max() < 0.10, got[["layout", "memory_error"]]
    assert (got["memory_verdict"] != "exceeds").all()
