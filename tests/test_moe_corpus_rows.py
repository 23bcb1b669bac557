"""The MoE corpus rows that need more than the table's columns: DeepSeek-V3's report row on the
H800 system (frontier_llm/catalog/systems/dgx-h800.yaml) with its catalog architecture, and the
catalog-model column's check against the columns a row states (planner/calibration.py)."""

from __future__ import annotations

import pandas as pd
import pytest

from frontier_llm.catalog import load_system
from frontier_llm.errors import UserError
from frontier_llm.planner.calibration import (
    load_calibration,
    row_model,
    row_space,
    row_system,
    validate_runs,
)


def _moe_rows() -> pd.DataFrame:
    corpus = load_calibration()
    return corpus[corpus["file"] == "calibration_runs_moe.csv"]


def test_h800_is_the_h100_die_with_its_nvlink_cut():
    h800, h100 = load_system("dgx-h800"), load_system("dgx-h100")
    assert h800.peak_flops == h100.peak_flops
    assert h800.memory_bytes == h100.memory_bytes
    # 400 GB/s bidirectional per GPU (H800 datasheet) against the H100's 900.
    assert h800.links["node"].bandwidth == pytest.approx(200e9)
    assert h800.links["node"].bandwidth < h100.links["node"].bandwidth
    assert h800.links["network"].bandwidth == h100.links["network"].bandwidth
    # The efficiency knobs are the DGX H100's, stated as an assumption.
    assert {k: e.value for k, e in h800.efficiency.items()} == \
        {k: e.value for k, e in h100.efficiency.items()}
    assert h800.matmul_half_hidden == h100.matmul_half_hidden


def test_deepseek_v3_report_row_is_the_catalog_model_on_h800():
    rows = _moe_rows()
    row = rows[rows["source_key"] == "DeepSeek-V3-report-2024"].iloc[0]
    assert row_system(row).name == "dgx-h800"
    m = row_model(row)
    # The catalog's architecture, which the columns alone cannot carry.
    assert m.kv_lora_rank == 512 and m.dense_layers == 3 and m.mtp_layers == 1
    assert m.ffn_hidden == 18432 and m.router_balance == "aux-free"
    space = row_space(row)
    assert space.pp == (16,) and space.ep == (64,) and space.fp8_recipe == ("blockwise",)
    out = validate_runs(rows[rows["source_key"] == "DeepSeek-V3-report-2024"]).iloc[0]
    assert out["system"] == "dgx-h800" and out["predicted"] > 0
    assert "pp16" in out["layout"] and "ep64" in out["layout"]


def test_catalog_model_must_agree_with_the_stated_columns():
    rows = _moe_rows()
    row = rows[rows["source_key"] == "DeepSeek-V3-report-2024"].iloc[0].copy()
    row["hidden"] = 4096
    with pytest.raises(UserError, match="hidden 4096 vs 7168"):
        row_model(row)
    row = rows[rows["source_key"] == "DeepSeek-V3-report-2024"].iloc[0].copy()
    row["router_balance"] = "forced"
    assert row_model(row).router_balance == "forced"


def test_both_mixtral_readme_rows_share_one_source_and_layout():
    rows = _moe_rows()
    mixtral = rows[rows["source_key"] == "MegatronLM-MoE-README-2024"]
    assert sorted(mixtral["tflops_per_gpu"].astype(float)) == [438.0, 468.0]
    assert mixtral[["tp", "pp", "ep", "micro_batch", "global_batch"]].nunique().eq(1).all()
