"""Write the cost model's leave-one-SOURCE-out residuals on the calibration corpus (every
``planner/data/calibration_runs*.csv``), the data the
planner's intervals are built from (frontier_llm/planner/intervals.py, docs/planner.md
"Reading an interval") and the per-family error table of docs/costmodel.md.

A source is one paper, repository or blog (the first word of a row's ``source``). For each
source, every row of it is predicted with the knobs fitted without it:

- the system knobs fitted to ``calibration_runs.csv`` (docs/costmodel.md §6: FITS below) are
  refitted on the other sources' rows of the same system, one round of fit_efficiency.py's
  coordinate search (the GEMM size law, ``matmul_half_hidden``, only where the rows left have
  GEMMs of two sizes or more; else it is the other GPU's); a system left without rows takes
  the fitted knobs of another (TRANSFER), ``matmul`` as the same share of its GPU's maximum
  achievable matmul rate (fit_efficiency.MAMF), as Frontier's and LUMI-G's are carried over;
- nothing is fitted to the other tables (``calibration_runs_sharded.csv``,
  ``calibration_runs_published.csv`` ...), so their rows are predicted with the catalog as it
  stands: out of sample already (LUMI-G's and Frontier's ``matmul`` is anchored on Dash et
  al.'s figure, which the MI250X rows' own fit reproduces; the DGX H100's ``tp_overlap`` is
  its runs' stated overlap, held, not fitted).

Per row: ``log(predicted / measured step time)`` (a throughput figure turned into its step
time: the ratio inverts), the family (engine, and whether parameters are sharded), the system,
the GPU count and the row's ``confidence``; a stated peak memory gives
``log(predicted / measured peak)``.

    python analysis/loso_residuals.py           # seconds; writes the CSV and the goldens
    python analysis/loso_residuals.py --table   # print the per-family table from the CSV

It also writes the drift guard's goldens (tests/test_drift_guard.py): the per-family table
(:data:`FAMILIES_GOLDEN`) and the fastest layout the planner predicts for each row's stated
shape with the catalog's knobs (:data:`FASTEST_GOLDEN`). A change that moves them fails the
suite until this command is rerun and the commit says why the move is worth it.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from pathlib import Path

import pandas as pd
from fit_efficiency import fit, matmul_ceiling, with_eff

from frontier_llm.catalog import load_system
from frontier_llm.planner.calibration import (
    CALIBRATION_FILES,
    load_calibration,
    row_system,
    validate_runs,
)
from frontier_llm.planner.intervals import RESIDUALS, family_numbers, family_table, gpu_numbers
from frontier_llm.report.tables import markdown

GOLDEN = Path(__file__).resolve().parents[1] / "tests" / "golden"
FAMILIES_GOLDEN = GOLDEN / "loso_families.csv"
FASTEST_GOLDEN = GOLDEN / "calibration_fastest.csv"

# Per system with rows in calibration_runs.csv: the knobs fitted to them, the ones held at a
# value, and where the search starts (docs/costmodel.md §6).
FITS = {
    "dgx-a100": (("matmul", "collective", "matmul_half_hidden"), {"memory": 0.8}, {}),
    # tp_overlap is the H100 runs' stated overlap (the catalog's dgx-h100.yaml), not fitted.
    "dgx-h100": (("matmul", "collective", "matmul_half_hidden"),
                 {"memory": 0.8, "tp_overlap": 1.0}, {}),
    "grand-teton-h100": (("matmul",), {}, {"matmul": 0.73}),
}
# Whose fitted knobs stand in for a system's own when no other source has rows on it.
TRANSFER = {"dgx-a100": "dgx-h100", "dgx-h100": "dgx-a100", "grand-teton-h100": "dgx-h100"}
TRANSFERRED = ("matmul", "collective", "matmul_half_hidden", "tp_overlap")


def step_log_residual(row: pd.Series) -> float:
    """log(predicted / measured step time) from a validate_runs row."""
    ratio = row["predicted"] / row["measured"]
    return math.log(ratio) if row["metric"] == "iteration_time_s" else -math.log(ratio)


def knobs_of(system, names) -> dict:
    return {k: getattr(system, k) if k == "matmul_half_hidden" else system.eff(k, 0.0)
            for k in names}


def systems_without(runs: pd.DataFrame, source: str) -> tuple[dict, str]:
    """The fitted systems refitted without ``source``'s rows (of the first table) and how."""
    first = runs[(runs["file"] == CALIBRATION_FILES[0].name) & (runs["source_key"] != source)]
    names = [row_system(r).name for _, r in first.iterrows()]
    own = runs[(runs["source_key"] == source) & (runs["file"] == CALIBRATION_FILES[0].name)]
    # Only the first table's rows were fitted to: another source's rows are out of sample
    # with the catalog's knobs as they stand.
    held = {row_system(r).name for _, r in own.iterrows()}
    out, how = {}, []
    for name in sorted(held & set(FITS)):
        knobs, fixed, start = FITS[name]
        base = with_eff(load_system(name), fixed)
        rows = first[[n == name for n in names]]
        if len(rows):
            note = ""
            sizes = rows[["hidden", "tp"]].drop_duplicates()
            if "matmul_half_hidden" in knobs and len(sizes) < 2:
                # Rows whose GEMMs all have one size cannot tell the size effect from the rate
                # (the fit trades one for the other): the size law is the other GPU's, as a
                # whole knob set is carried where no rows are left.
                knobs = tuple(k for k in knobs if k != "matmul_half_hidden")
                base = dataclasses.replace(base, matmul_half_hidden=load_system(
                    TRANSFER[name]).matmul_half_hidden)
                note = f" (one GEMM size: {TRANSFER[name]}'s size law)"
            values = {**knobs_of(base, knobs), **start}
            out[name] = with_eff(base, fit(rows, base, knobs, values, rounds=1))
            how.append(f"{name} refitted on {len(rows)} rows{note}")
        else:
            donor = load_system(TRANSFER[name])
            moved = knobs_of(donor, TRANSFERRED)
            # The software reaches the same share of each GPU's best achievable matmul rate
            # (fit_efficiency.MAMF), not the same share of two different datasheet peaks.
            moved["matmul"] *= matmul_ceiling(base) / matmul_ceiling(donor)
            out[name] = with_eff(base, moved)
            how.append(f"{name} with {TRANSFER[name]}'s knobs (matmul as a share of MAMF)")
    return out, "; ".join(how) or "catalog knobs (not fitted to this source)"


def residual_rows(runs: pd.DataFrame, source: str) -> list[dict]:
    systems, how = systems_without(runs, source)
    held = runs[runs["source_key"] == source]
    table = validate_runs(held, systems)
    out = []
    for (_, row), (_, pred) in zip(held.iterrows(), table.iterrows(), strict=True):
        ok = pred["metric"] is not None and pd.notna(pred["predicted"])
        out.append({
            "file": row["file"], "row": int(row["row"]), "source": source,
            "model": row["model"], "system": pred["system"], "engine": pred["engine"],
            "family": pred.get("family"), "gpus": pred["gpus"],
            "confidence": row.get("confidence") if pd.notna(row.get("confidence")) else "high",
            "metric": pred["metric"], "measured": pred["measured"],
            "predicted": pred["predicted"], "layout": pred["layout"],
            "fits": pred.get("fits"), "peak_memory_gb": pred.get("peak_memory_gb"),
            "capacity_gb": pred.get("capacity_gb"),
            "loso_log_residual": round(step_log_residual(pred), 6) if ok else None,
            "memory_log_residual": (round(math.log(1 + pred["memory_error"]), 6)
                                    if pd.notna(pred.get("memory_error")) else None),
            "knobs": how,
        })
    return out


def all_residuals(runs: pd.DataFrame, log=None) -> pd.DataFrame:
    """Every corpus row's leave-one-source-out residual, source by source."""
    out = []
    for source in dict.fromkeys(runs["source_key"]):
        t0 = time.perf_counter()
        out += residual_rows(runs, source)
        if log:
            log(f"{source:<32} {out[-1]['knobs']} ({time.perf_counter() - t0:.0f} s)")
    return pd.DataFrame(out)


def fastest_layouts(runs: pd.DataFrame) -> pd.DataFrame:
    """The layout the planner ranks first for each row's stated shape, with the catalog's
    knobs (what a user is told): the rank-order half of the drift guard."""
    table = validate_runs(runs)
    return pd.DataFrame({"file": runs["file"].to_numpy(), "row": runs["row"].to_numpy(),
                         "model": runs["model"].to_numpy(), "layout": table["layout"]})


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(RESIDUALS))
    ap.add_argument("--table", action="store_true",
                    help="print the per-family error and coverage table from --out and stop")
    args = ap.parse_args()
    if args.table:
        frame = pd.read_csv(args.out)
        print(markdown(family_table(frame)))
        # Per GPU (every engine): the MI250X's rows are what Frontier's and LUMI-G's intervals
        # rest on where a family has too few of them (planner/intervals.py reference_pool).
        print()
        print(markdown(gpu_numbers(frame)))
        return
    runs = load_calibration()
    frame = all_residuals(runs, log=lambda line: print(line, flush=True))
    frame.to_csv(args.out, index=False)
    print(markdown(family_table(frame)))
    print(f"wrote {args.out}")
    if args.out == str(RESIDUALS):
        family_numbers(frame).to_csv(FAMILIES_GOLDEN, index=False)
        fastest_layouts(runs).to_csv(FASTEST_GOLDEN, index=False)
        print(f"wrote {FAMILIES_GOLDEN} and {FASTEST_GOLDEN}")


if __name__ == "__main__":
    main()
