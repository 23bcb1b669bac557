"""Leave-one-source-out error of the cost model on the FP8 and new-GPU runs
(frontier_llm/planner/data/calibration_runs_fp8.csv), per family (precision x vendor) and per
GPU, and the bf16 -> fp8 speed-up it predicts beside the measured one: the tables of
docs/costmodel.md, "FP8".

Nothing is fitted to this file: the FP8 matmul knobs come from published achievable-matmul
measurements (the system files' ``matmul_fp8`` sources), the bf16 knobs from the other tables.
So each source's rows are predicted without any of its rows, and the error below is already
leave-one-source-out. Rows whose ``confidence`` is ``low`` are shown but left out of the
family and GPU errors (as planner/intervals.py leaves them out).

    python analysis/fp8_loso.py            # prints the three Markdown tables
"""

from __future__ import annotations

import pandas as pd

from frontier_llm.planner.calibration import DATA, load_runs, source_key, validate_runs
from frontier_llm.report.tables import markdown

FP8_RUNS = DATA / "calibration_runs_fp8.csv"
AMD_WORDS = ("mi300", "mi325", "mi355", "mi250", "amd")


def vendor(gpu: str) -> str:
    return "AMD" if any(w in gpu.lower() for w in AMD_WORDS) else "NVIDIA"


def predicted_runs(path=FP8_RUNS) -> pd.DataFrame:
    """Every row of the file predicted, with its precision, recipe, vendor and confidence."""
    runs = load_runs(path)
    table = validate_runs(runs)
    table["dtype"] = runs["dtype"].fillna("bf16").to_numpy()
    table["fp8_recipe"] = runs["fp8_recipe"].fillna("").to_numpy()
    table["confidence"] = runs["confidence"].to_numpy()
    table["vendor"] = [vendor(g) for g in runs["gpu_type"]]
    table["family"] = table["dtype"] + " x " + table["vendor"]
    table["source"] = runs["source"].map(source_key).to_numpy()
    return table


def family_errors(table: pd.DataFrame, by: str = "family") -> pd.DataFrame:
    """Mean and largest absolute error per group, confident rows only."""
    used = table[table["confidence"] != "low"]
    out = used.groupby(by)["error"].agg(
        rows="size", mape=lambda e: e.abs().mean(), max=lambda e: e.abs().max(),
        bias="mean")
    return out.reset_index()


def speedups(table: pd.DataFrame) -> pd.DataFrame:
    """Each fp8 row beside the bf16 row of the same source and GPU: measured and predicted
    speed-up (tokens/s ratio)."""
    rows = []
    for (src, gpu), group in table.groupby(["source", "gpu"]):
        base = group[group["dtype"] == "bf16"]
        if base.empty:
            continue
        b = base.iloc[0]
        for _, r in group[group["dtype"] == "fp8"].iterrows():
            rows.append({"source": src, "gpu": gpu, "recipe": r["fp8_recipe"],
                         "measured": r["measured"] / b["measured"],
                         "predicted": r["predicted"] / b["predicted"]})
    out = pd.DataFrame(rows)
    out["error"] = out["predicted"] / out["measured"] - 1
    return out


def main() -> None:
    table = predicted_runs()
    cols = ["source", "gpu", "system", "dtype", "fp8_recipe", "confidence", "measured",
            "predicted", "error"]
    print(markdown(table[cols].round({"measured": 1, "predicted": 1, "error": 3})))
    print()
    print(markdown(family_errors(table).round(3)))
    print()
    print(markdown(family_errors(table, "system").round(3)))
    print()
    print(markdown(speedups(table).round(3)))


if __name__ == "__main__":
    main()
