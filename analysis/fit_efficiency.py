"""Fit a system's efficiency knobs to the published runs on it (calibration_runs.csv).

Coordinate search over a grid per knob, minimising the mean absolute percentage error of the
calibration protocol (frontier_llm.planner.calibration). The rows are those the protocol maps to
``--system`` (or, with ``--gpu``, those whose gpu_type contains it). Prints the fitted values to
paste into the system's YAML with this script named as their source, and the per-row table.

    python analysis/fit_efficiency.py --system dgx-a100 \
        --knobs matmul,collective,matmul_half_hidden --fix memory=0.8
    python analysis/fit_efficiency.py ... --leave-one-out --rounds 1   # out-of-sample errors,
                                                                       # by engine family
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd

from frontier_llm.catalog import load_system
from frontier_llm.planner.calibration import (
    error_summary,
    load_calibration,
    load_runs,
    row_system,
    validate_runs,
)
from frontier_llm.specs.system import Efficiency

COLUMNS = ["model", "gpus", "engine", "metric", "measured", "predicted", "error", "layout"]
RUNS_CSV = Path(__file__).resolve().parents[1] / "tests" / "data" / "calibration_runs.csv"
GRIDS = {
    "matmul": np.round(np.arange(0.50, 0.901, 0.01), 2),
    "collective": np.round(np.arange(0.30, 1.001, 0.05), 2),
    "memory": np.round(np.arange(0.30, 1.001, 0.1), 2),
    "tp_overlap": np.round(np.arange(0.0, 1.001, 0.1), 2),
    "layer_overhead_s": np.round(np.arange(0.0, 301e-6, 20e-6), 6),
    "matmul_half_hidden": np.arange(0.0, 2001.0, 100.0),
}


FIELDS = ("layer_overhead_s", "matmul_half_hidden")  # SystemSpec fields, not efficiencies

# The highest matmul efficiency a GPU reaches at any shape: its maximum achievable matmul FLOP/s
# (MAMF, BF16, best of a brute-force shape search) over its dense peak, from S. Bekman's table
# (stas00/ml-engineering@744d01e1, compute/accelerator/README.md, "Maximum Achievable Matmul
# FLOPS comparison table"): A100 SXM 271.2 of 312 TFLOP/s, H100 SXM 794.5 of 989 ("H200 is the
# same"). A fitted ``matmul`` above it is unphysical: the fit then stands in for something
# else the rows do (a GPU whose name matches none has no ceiling but the grid's).
MAMF = {"A100-SXM": 271.2 / 312, "H100": 794.5 / 989, "H200": 794.5 / 989}


def matmul_ceiling(system) -> float:
    """The matmul efficiency ``system``'s GPU reaches at best (:data:`MAMF`), else 1."""
    return next((v for k, v in MAMF.items() if k in system.gpu), 1.0)


def grid(knob: str, system) -> np.ndarray:
    """The values searched for ``knob`` on ``system``: matmul not above its GPU's ceiling."""
    if knob == "matmul":
        return GRIDS[knob][GRIDS[knob] <= matmul_ceiling(system) + 1e-9]
    return GRIDS[knob]


def with_eff(system, values):
    eff = dict(system.efficiency)
    fields = {}
    for k, v in values.items():
        if k in GRIDS and k in FIELDS:
            fields[k] = float(v)
        else:
            eff[k] = Efficiency(float(v), "fit")
    return dataclasses.replace(system, efficiency=eff, **fields)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--system", required=True)
    ap.add_argument("--gpu", help="substring of gpu_type selecting the rows (default: the rows "
                                  "the protocol maps to --system)")
    ap.add_argument("--csv", default=str(RUNS_CSV),
                    help="published runs (default: the repository's copy of "
                         "../shared/data/calibration_runs.csv)")
    ap.add_argument("--corpus", action="store_true",
                    help="fit to the rows of every planner/data/calibration_runs*.csv the "
                         "protocol maps to --system, less those of confidence low or with an "
                         "unused reason (LUMI-G's MI250X rows are in the published and sharded "
                         "tables), instead of --csv")
    ap.add_argument("--knobs", default=",".join(GRIDS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--fix", nargs="*", default=[], metavar="KNOB=VALUE",
                    help="knobs held at a physical value instead of fitted")
    ap.add_argument("--start", nargs="*", default=[], metavar="KNOB=VALUE",
                    help="start the search from these values instead of the system's (a system "
                         "with one row: its leave-one-out prediction is then this prior's)")
    ap.add_argument("--leave-one-out", action="store_true",
                    help="refit without each row and predict it (out-of-sample errors), "
                         "starting from the system's current values")
    args = ap.parse_args()
    runs = corpus_rows() if args.corpus else load_runs(args.csv)
    if args.gpu:
        runs = runs[runs["gpu_type"].str.contains(args.gpu, case=False)]
    else:
        runs = runs[[row_system(r).name == args.system for _, r in runs.iterrows()]]
    base = load_system(args.system)
    knobs = args.knobs.split(",")
    values = {k: getattr(base, k) if k in FIELDS else
              base.eff(k, 1.0 if k in ("matmul", "collective", "memory") else 0.0)
              for k in knobs}
    for start in args.start:
        k, v = start.split("=")
        values[k] = float(v)
    for fixed in args.fix:
        k, v = fixed.split("=")
        base = with_eff(base, {k: v})

    if args.leave_one_out:
        leave_one_out(runs, base, knobs, values, args.rounds)
        return
    values = fit(runs, base, knobs, values, args.rounds, log=True)
    table = validate_runs(runs, {base.name: with_eff(base, values)})
    with pd.option_context("display.width", 250, "display.max_colwidth", 70):
        print(table[COLUMNS].to_string())
    print(error_summary(table))
    print("fitted:", {k: float(v) for k, v in values.items()})


def corpus_rows() -> pd.DataFrame:
    """Every calibration table's rows (planner/calibration.py load_calibration) that an interval
    rests on: confidence other than low, no unused reason."""
    runs = load_calibration()
    conf = runs["confidence"].fillna("high").astype(str).str.split().str[0]
    unused = runs["unused"].notna() if "unused" in runs else False
    return runs[(conf != "low") & ~unused]


def fit(runs, base, knobs, values, rounds, log=False) -> dict:
    """Coordinate search: each knob in turn over its grid, keeping what lowers the MAPE."""
    def score(vals):
        return error_summary(validate_runs(runs, {base.name: with_eff(base, vals)}))["mape"]

    if not len(runs):  # nothing to fit to: the starting values stand
        return values

    best = score(values)
    for rnd in range(rounds):
        for k in knobs:
            for v in grid(k, base):
                trial = {**values, k: v}
                s = score(trial)
                if s < best - 1e-6:
                    best, values = s, trial
            if log:
                print(f"round {rnd + 1} {k}: mape {best:.4f} {values}", flush=True)
    return values


def leave_one_out(runs, base, knobs, values, rounds) -> None:
    """Refit without each row in turn and predict that row: out-of-sample errors."""
    rows = []
    for i in range(len(runs)):
        held = runs.iloc[[i]]
        fitted = fit(runs.drop(runs.index[i]), base, knobs, values, rounds)
        out = validate_runs(held, {base.name: with_eff(base, fitted)})
        out["fitted"] = str({k: round(float(v), 3) for k, v in fitted.items()})
        rows.append(out)
        print(f"held out {held.iloc[0]['model']}: error {out.iloc[0]['error']:+.3f} "
              f"with {out.iloc[0]['fitted']}", flush=True)
    table = pd.concat(rows, ignore_index=True)
    print(table[["model", "gpus", "engine", "metric", "measured", "predicted", "error"]]
          .to_string())
    for engine, part in table.groupby("engine"):
        print(f"leave-one-out {engine}:", error_summary(part))
    print("leave-one-out:", error_summary(table))


if __name__ == "__main__":
    main()
