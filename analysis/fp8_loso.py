"""Leave-one-source-out error of the cost model on the FP8 and new-GPU runs
(frontier_llm/planner/data/calibration_runs_fp8.csv), per family (precision x vendor) and per
GPU, and the bf16 -> fp8 speed-up it predicts beside the measured one: the tables of
docs/costmodel.md, "FP8".

Nothing is fitted to this file: the FP8 matmul knobs come from published achievable-matmul
measurements (the system files' ``matmul_fp8`` sources), the bf16 knobs from the other tables.
So each source's rows are predicted without any of its rows, and the error below is already
leave-one-source-out. Rows whose ``confidence`` is ``low`` are shown but left out of the
family and GPU errors (as planner/intervals.py leaves them out).

The fifth table inverts the model instead: for each confident row, the matmul knob that would
make its prediction equal the measurement (``matmul`` for a bf16 row; ``matmul_fp8`` for an fp8
row, once with ``matmul`` as carried and once with it at its own source's bf16 row's implied
value, so that the bf16 baseline's error is taken out). A row implies a knob; it does not fit
one: a knob fitted to one source has no other source to be judged on (leave-one-source-out).

The last table is a diagnostic, not the model: what a leave-one-source-out refit of each
system's ``matmul_fp8`` on its other sources' FP8 rows would give (:func:`refit_loso`).

    python analysis/fp8_loso.py            # prints the Markdown tables
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
from scipy.optimize import brentq

from frontier_llm.catalog import load_system
from frontier_llm.planner.calibration import (
    DATA,
    load_calibration,
    load_runs,
    source_key,
    validate_runs,
)
from frontier_llm.report.tables import markdown
from frontier_llm.specs.system import Efficiency, SystemSpec

FP8_RUNS = DATA / "calibration_runs_fp8.csv"
AMD_WORDS = ("mi300", "mi325", "mi355", "mi250", "amd")


def vendor(gpu: str) -> str:
    return "AMD" if any(w in gpu.lower() for w in AMD_WORDS) else "NVIDIA"


def systems_left_out(source: str) -> dict:
    """The systems whose knobs were fitted to ``source``'s bf16 rows, refitted or transferred
    without them (loso_residuals.systems_without, the drift guard's own rule), with their FP8
    knob carried along: a fitted system's ``matmul_fp8`` is its ``matmul`` times a measured
    FP8/bf16 ratio, so it moves with ``matmul``. Empty for a source nothing was fitted to."""
    from loso_residuals import systems_without

    systems, _ = systems_without(load_calibration(), source)
    out = {}
    for name, system in systems.items():
        catalog = load_system(name)
        eff = dict(system.efficiency)
        if "matmul_fp8" in catalog.efficiency:
            scale = system.eff("matmul") / catalog.eff("matmul")
            eff["matmul_fp8"] = Efficiency(catalog.eff("matmul_fp8") * scale,
                                           "moved with matmul (left out of the fit)")
        out[name] = dataclasses.replace(system, efficiency=eff)
    return out


def predicted_runs(path=FP8_RUNS) -> pd.DataFrame:
    """Every row of the file predicted, with its precision, recipe, vendor and confidence,
    each source with knobs not fitted to it (:func:`systems_left_out`)."""
    runs = load_runs(path)
    keys = runs["source"].map(source_key)
    parts = []
    for k in dict.fromkeys(keys):
        rows = runs[keys == k]
        parts.append(validate_runs(rows, systems_left_out(k)).set_axis(rows.index))
    table = pd.concat(parts).sort_index()
    table["dtype"] = runs["dtype"].fillna("bf16").to_numpy()
    table["fp8_recipe"] = runs["fp8_recipe"].fillna("").to_numpy()
    table["confidence"] = runs["confidence"].to_numpy()
    table["vendor"] = [vendor(g) for g in runs["gpu_type"]]
    table["family"] = table["dtype"] + " x " + table["vendor"]
    table["source"] = runs["source"].map(source_key).to_numpy()
    # ``error`` is on the row's own metric (the corpus's convention): positive is a faster
    # prediction for a rate, a slower one for a step time. ``fast`` puts both one way round:
    # predicted speed over measured speed, less one.
    time = table["metric"] == "iteration_time_s"
    table["fast"] = (table["measured"] / table["predicted"] - 1).where(time, table["error"])
    return table


def family_errors(table: pd.DataFrame, by: str = "family") -> pd.DataFrame:
    """Mean and largest absolute error per group, confident rows only, and the mean signed
    speed error (``bias``: positive where the model predicts faster than measured)."""
    used = table[table["confidence"] != "low"]
    out = used.groupby(by)["error"].agg(
        rows="size", mape=lambda e: e.abs().mean(), max=lambda e: e.abs().max())
    out["bias"] = used.groupby(by)["fast"].mean()
    out["sources"] = used.groupby(by)["source"].nunique()
    return out.reset_index()


def speedups(table: pd.DataFrame) -> pd.DataFrame:
    """Each fp8 row beside the bf16 row of the same source, GPU, model and GPU count: measured
    and predicted speed-up (tokens/s ratio). The model and count are part of the pair because
    one source can publish runs of several models (AMD's MI325X table: an fp8 8B and a bf16
    70B run), whose ratio is no speed-up."""
    rows = []
    for (src, gpu, _, _), group in table.groupby(["source", "gpu", "model", "gpus"]):
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


def _error_with(row: pd.DataFrame, knobs: dict[str, float], name: str | None = None) -> float:
    """The row's error with the system's efficiency knobs replaced by ``knobs`` (``name``: the
    row's system, when the caller knows it: finding it is a whole validation)."""
    if name is None:
        name = validate_runs(row)["system"].iloc[0]
    system = load_system(name)
    eff = dict(system.efficiency)
    eff.update({k: Efficiency(v, "implied by a published run") for k, v in knobs.items()})
    probe = dataclasses.replace(system, efficiency=eff)
    return float(validate_runs(row, {name: probe})["error"].iloc[0])


def _solve(row: pd.DataFrame, key: str, held: dict[str, float]) -> float:
    """The ``key`` knob at which the row is predicted exactly (a root: a larger matmul
    fraction only ever predicts a faster step, so a larger rate, or a shorter step for a row
    that states its step time); NaN where no fraction in (0, 1] reaches it."""
    # The error of a step-time row falls as the knob grows; a rate row's rises.
    sign = -1.0 if pd.notna(row["iteration_time_s"].iloc[0]) else 1.0
    name = validate_runs(row)["system"].iloc[0]

    def err(x: float) -> float:
        return sign * _error_with(row, {**held, key: x}, name)

    lo, hi = 0.02, 1.0
    if err(hi) < 0 or err(lo) > 0:
        return float("nan")
    # Brent's method: the error is smooth and monotone in the knob, so it closes in well under
    # the 20 halvings bisection took to reach the same 1e-6, each one a whole prediction.
    return float(brentq(err, lo, hi, xtol=1e-6))


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
            # The bf16 baseline is the same source's run of the same model on as many GPUs
            # (see speedups).
            pair = (source_key(r["source"]), r["gpu_type"], r["model"], r["num_gpus"])
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


def _speed_errors(rows: pd.DataFrame, system: SystemSpec, knob: float) -> np.ndarray:
    """log(predicted speed / measured speed) of ``rows`` (one system's), its ``matmul_fp8``
    set to ``knob``: positive where the model predicts faster; increasing in ``knob``."""
    eff = dict(system.efficiency)
    eff["matmul_fp8"] = Efficiency(knob, "refitted leave-one-source-out (diagnostic)")
    probe = dataclasses.replace(system, efficiency=eff)
    out = validate_runs(rows, {system.name: probe})
    time = (out["metric"] == "iteration_time_s").to_numpy()
    ratio = out["predicted"].to_numpy() / out["measured"].to_numpy()
    return np.log(np.where(time, 1 / ratio, ratio))


def refit_loso(path=FP8_RUNS, systems: tuple[str, ...] | None = None) -> pd.DataFrame:
    """What a leave-one-source-out refit of ``matmul_fp8`` would give: NOT the model's figure.

    For each system and each source of its confident FP8 rows, ``matmul_fp8`` is fitted (the
    mean log speed error of the system's FP8 rows from every *other* source set to zero, by
    bisection) on the system that source is predicted with (:func:`systems_left_out`), and the
    held-out source's rows are predicted with it. A system whose FP8 rows come from one source
    has nothing to fit on and is left out. Read it with the sources' independence in mind: the
    three MI355X sources run AMD's one MLPerf recipe, so a held-out submitter is not
    independent of the two fitted to; and a fitted value above the chip's measured GEMM rate
    (the catalog's ``matmul_fp8``) is absorbing other terms, not measuring the GEMMs."""
    runs = load_runs(path)
    runs = runs[(runs["confidence"] != "low") & (runs["dtype"] == "fp8")]
    keys = runs["source"].map(source_key)
    names = validate_runs(runs)["system"].to_numpy()
    out = []
    for name in dict.fromkeys(names):
        if systems is not None and name not in systems:
            continue
        mine = names == name
        for k in dict.fromkeys(keys[mine]):
            held = runs[mine & (keys == k).to_numpy()]
            fit_on = runs[mine & (keys != k).to_numpy()]
            if fit_on.empty:
                continue
            base = systems_left_out(k).get(name, load_system(name))
            lo, hi = 0.05, 1.0
            for _ in range(20):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if _speed_errors(fit_on, base, mid).mean() < 0 else (lo, mid)
            knob = (lo + hi) / 2
            fitted = np.expm1(_speed_errors(held, base, knob))
            carried = np.expm1(_speed_errors(held, base, base.eff("matmul_fp8")))
            out.append({"system": name, "held_out": k, "rows": len(held),
                        "fitted_on_rows": len(fit_on), "carried": base.eff("matmul_fp8"),
                        "fitted": knob, "mape_carried": np.abs(carried).mean(),
                        "mape_refit": np.abs(fitted).mean(),
                        "bias_refit": fitted.mean()})
    return pd.DataFrame(out)


def main() -> None:
    table = predicted_runs()
    cols = ["source", "gpu", "system", "dtype", "fp8_recipe", "confidence", "measured",
            "predicted", "error", "fast"]
    print(markdown(table[cols].round({"measured": 3, "predicted": 3, "error": 3, "fast": 3})))
    print()
    print(markdown(family_errors(table).round(3)))
    print()
    print(markdown(family_errors(table, "system").round(3)))
    print()
    print(markdown(speedups(table).round(3)))
    print()
    print(markdown(implied_knobs().round(3)))
    print()
    print(markdown(refit_loso().round(3)))


if __name__ == "__main__":
    main()
