"""Leave-one-source-out error of the cost model on the FP8 and new-GPU runs
(frontier_llm/planner/data/calibration_runs_fp8.csv), per family (precision x vendor) and per
GPU, and the bf16 -> fp8 speed-up it predicts beside the measured one: the tables of
docs/costmodel.md, "FP8".

Nothing is fitted to this file: the FP8 matmul knobs come from published achievable-matmul
measurements (the system files' ``matmul_fp8`` sources), the bf16 knobs from the other tables.
So each source's rows are predicted without any of its rows, and the error below is already
leave-one-source-out. Rows whose ``confidence`` is ``low`` are shown but left out of the
family and GPU errors (as planner/intervals.py leaves them out).

The last table inverts the model instead: for each confident row, the matmul knob that would
make its prediction equal the measurement (``matmul`` for a bf16 row; ``matmul_fp8`` for an fp8
row, once with ``matmul`` as carried and once with it at its own source's bf16 row's implied
value, so that the bf16 baseline's error is taken out). A row implies a knob; it does not fit
one: a knob fitted to one source has no other source to be judged on (leave-one-source-out).

    python analysis/fp8_loso.py            # prints the four Markdown tables
"""

from __future__ import annotations

import dataclasses
import math

import pandas as pd

from frontier_llm.catalog import load_system
from frontier_llm.planner.calibration import DATA, load_runs, source_key, validate_runs
from frontier_llm.report.tables import markdown
from frontier_llm.specs.system import Efficiency

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


def _error_with(row: pd.DataFrame, knobs: dict[str, float]) -> float:
    """The row's error with the system's efficiency knobs replaced by ``knobs``."""
    name = validate_runs(row)["system"].iloc[0]
    system = load_system(name)
    eff = dict(system.efficiency)
    eff.update({k: Efficiency(v, "implied by a published run") for k, v in knobs.items()})
    probe = dataclasses.replace(system, efficiency=eff)
    return float(validate_runs(row, {name: probe})["error"].iloc[0])


def _solve(row: pd.DataFrame, key: str, held: dict[str, float]) -> float:
    """The ``key`` knob at which the row is predicted exactly (bisection: a larger matmul
    fraction only ever predicts a faster step); NaN where no fraction in (0, 1] reaches it."""
    lo, hi = 0.02, 1.0
    if _error_with(row, {**held, key: hi}) < 0 or _error_with(row, {**held, key: lo}) > 0:
        return float("nan")
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if _error_with(row, {**held, key: mid}) > 0 else (mid, hi)
    return (lo + hi) / 2


def implied_knobs(path=FP8_RUNS) -> pd.DataFrame:
    """Per confident row, the matmul knob its measurement implies beside the one carried."""
    runs = load_runs(path)
    runs = runs[runs["confidence"] != "low"]
    out, bf16_implied = [], {}
    for dtype in ("bf16", "fp8"):
        for i in range(len(runs)):
            row = runs.iloc[[i]]
            r = row.iloc[0]
            if str(r["dtype"]) != dtype:
                continue
            system = load_system(validate_runs(row)["system"].iloc[0])
            key = "matmul" if dtype == "bf16" else "matmul_fp8"
            pair = (source_key(r["source"]), r["gpu_type"])
            implied = _solve(row, key, {})
            if dtype == "bf16":
                bf16_implied[pair] = implied
            base = bf16_implied.get(pair, float("nan"))
            out.append({
                "source": pair[0], "gpu": pair[1], "system": system.name, "dtype": dtype,
                "recipe": r["fp8_recipe"] if dtype == "fp8" else "", "knob": key,
                "carried": system.efficiency[key].value, "implied": implied,
                "implied_with_bf16_baseline": (
                    _solve(row, key, {"matmul": base})
                    if dtype == "fp8" and not math.isnan(base) else float("nan")),
            })
    return pd.DataFrame(out)


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
    print()
    print(markdown(implied_knobs().round(3)))


if __name__ == "__main__":
    main()
