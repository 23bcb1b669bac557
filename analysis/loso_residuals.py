"""Write the cost model's out-of-sample step-time residuals on the calibration rows, the data the
planner's intervals are built from (frontier_llm/planner/intervals.py, docs/planner.md
"Planning an allocation").

Two kinds of residual per row of calibration_runs.csv, each ``log(predicted / measured step
time)`` (a throughput figure is turned into its step time: the ratio inverts):

- ``loo``: the row's own system refitted without the row (the knobs and grids of
  docs/costmodel.md §6, one round of fit_efficiency.py's coordinate search) — the error on an
  unseen run of a system that has calibration rows;
- ``transfer``: the row predicted with the knobs fitted to another system (A100 rows with the
  DGX H100's, H100 and 500 W H100 rows with the DGX A100's ... see TRANSFER) — the error on a
  system whose knobs were carried over from another, as Frontier's and LUMI's are.

    python analysis/loo_residuals.py          # minutes: 22 refits; writes the CSV below
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import pandas as pd
from fit_efficiency import RUNS_CSV, fit, with_eff

from frontier_llm.catalog import load_system
from frontier_llm.planner.calibration import load_runs, row_system, validate_runs

OUT = (
    Path(__file__).resolve().parents[1]
    / "frontier_llm"
    / "planner"
    / "data"
    / "calibration_residuals.csv"
)
# Per system with rows: the knobs fitted to them, the ones held at a value, and where the search
# starts (docs/costmodel.md §6).
FITS = {
    "dgx-a100": (("matmul", "collective", "matmul_half_hidden"), {"memory": 0.8}, {}),
    "dgx-h100": (("matmul", "collective", "matmul_half_hidden", "tp_overlap"), {"memory": 0.8}, {}),
    "grand-teton-h100": (("matmul",), {}, {"matmul": 0.73}),
}
# Whose fitted knobs stand in for a system's own in the transfer residual.
TRANSFER = {"dgx-a100": "dgx-h100", "dgx-h100": "dgx-a100", "grand-teton-h100": "dgx-h100"}
TRANSFERRED = ("matmul", "collective", "matmul_half_hidden", "tp_overlap")


def step_log_residual(row: pd.Series) -> float:
    """log(predicted / measured step time) from a validate_runs row."""
    ratio = row["predicted"] / row["measured"]
    return math.log(ratio) if row["metric"] == "iteration_time_s" else -math.log(ratio)


def transfer_prediction(held: pd.DataFrame, name: str) -> pd.Series:
    """``held`` (one calibration row of system ``name``) predicted with the fitted knobs of
    TRANSFER[name] in place of its system's own (validate_runs' row)."""
    donor = load_system(TRANSFER[name])
    carried = {
        k: getattr(donor, k) if k == "matmul_half_hidden" else donor.eff(k, 0.0)
        for k in TRANSFERRED
    }
    return validate_runs(held, {name: with_eff(load_system(name), carried)}).iloc[0]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--csv", default=str(RUNS_CSV))
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    runs = load_runs(args.csv)
    systems = [row_system(r).name for _, r in runs.iterrows()]
    out = []
    for i in range(len(runs)):
        name = systems[i]
        base = load_system(name)
        knobs, fixed, start = FITS[name]
        base = with_eff(base, fixed)
        values = {
            k: getattr(base, k) if k == "matmul_half_hidden" else base.eff(k, 0.0) for k in knobs
        }
        values.update(start)
        same = [j for j in range(len(runs)) if systems[j] == name and j != i]
        t0 = time.perf_counter()
        fitted = fit(runs.iloc[same], base, knobs, values, rounds=1)
        held = runs.iloc[[i]]
        loo = validate_runs(held, {name: with_eff(base, fitted)}).iloc[0]
        transfer = transfer_prediction(held, name)
        out.append(
            {
                "row": i,
                "source": held.iloc[0]["source"].split()[0],
                "model": held.iloc[0]["model"],
                "system": name,
                "engine": loo["engine"],
                "gpus": int(held.iloc[0]["num_gpus"]),
                "metric": loo["metric"],
                "measured": loo["measured"],
                "loo_predicted": loo["predicted"],
                "loo_log_residual": round(step_log_residual(loo), 6),
                "transfer_from": TRANSFER[name],
                "transfer_predicted": transfer["predicted"],
                "transfer_log_residual": round(step_log_residual(transfer), 6),
                "memory_log_residual": (
                    round(math.log(1 + loo["memory_error"]), 6)
                    if "memory_error" in loo and pd.notna(loo["memory_error"])
                    else None
                ),
            }
        )
        print(
            f"row {i:2d} {name:<17} {out[-1]['model']:<24} loo "
            f"{out[-1]['loo_log_residual']:+.3f} transfer {out[-1]['transfer_log_residual']:+.3f}"
            f" ({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
    pd.DataFrame(out).to_csv(args.out, index=False)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
