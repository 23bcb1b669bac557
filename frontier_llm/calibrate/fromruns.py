"""The closed loop: refit the cost model's efficiency knobs from measured runs in the store, and
measure the model's step-time error before and after on runs the fit has not seen.

Knobs (each a physical quantity of the system, docs/calibrate.md):

- ``matmul``: the achieved matrix rate (FLOP/s) — the ``matmul`` efficiency times the peak; a
  rate above the stated peak raises the peak (the stated one was then wrong);
- ``layer_overhead_s``: fixed seconds per transformer block and micro-batch forward (backward
  twice): kernel launches on a GPU; on a CPU the Python and framework dispatch of every block;
- ``latency``: start-up seconds per message on the node tier (``links.node.latency``, and the
  package tier's when it has one), as a training framework sees it;
- ``network_latency``: the same on the network tier (runs that span nodes);
- ``collective``: the fraction of the link bandwidths collectives achieve;
- ``memory``: the fraction of the memory bandwidth element-wise work achieves.

The fit minimises the squared log ratio of predicted to measured step time (a relative error, so
a slow run does not outweigh a fast one) with scipy's bounded least squares. Cross-validation:
the runs are split into ``k`` folds (a seeded shuffle); each fold is predicted by the base
system ("before") and by knobs fitted on the other folds ("after"). An in-sample error much
below the held-out one shows over-fitting.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from frontier_llm.catalog import model_from_mapping
from frontier_llm.costmodel import evaluate, from_configs
from frontier_llm.errors import UserError
from frontier_llm.specs.forms import label
from frontier_llm.specs.layout import Layout
from frontier_llm.specs.plausible import step_time_problem
from frontier_llm.specs.system import Efficiency, SystemSpec
from frontier_llm.specs.vocab import RunStatus

KNOBS = ("matmul", "layer_overhead_s", "latency", "network_latency", "collective", "memory")
UNITS = {"matmul": "FLOP/s", "layer_overhead_s": "s", "latency": "s", "network_latency": "s",
         "collective": "fraction", "memory": "fraction"}


@dataclass(frozen=True)
class RunSet:
    """Measured runs ready to predict: per-run id, measured seconds, and (model, layouts,
    row positions) groups for vectorized evaluation."""

    runs: pd.DataFrame  # run_id, measured_s, layout, model (+ whatever the query gave)
    groups: tuple  # ((ModelSpec, LayoutTable, positions), ...)

    def subset(self, mask: np.ndarray) -> RunSet:
        return make_runset(self.runs[mask].reset_index(drop=True))


def describe(lay: Layout) -> str:
    """The layout's one label (specs.forms.label)."""
    return label(lay)


def make_runset(runs: pd.DataFrame) -> RunSet:
    groups = []
    for key, g in runs.groupby("model_json", sort=False):
        model = model_from_mapping(json.loads(key))
        table = from_configs(list(g["config"]))
        groups.append((model, table, g.index.to_numpy()))
    return RunSet(runs=runs, groups=tuple(groups))


def measurement_key(model_json: str, layout_hash: str, steps: list[tuple[int, float]]) -> str:
    """What identifies one measurement, whatever run_id or path it was stored under: the
    sha256 of its model, layout and every step's (number, seconds). A copy of a log folder
    collected again (``flm collect --from-logs`` names a run by its log's path) or a trace
    stored under another run_id repeats the per-step times exactly; two real runs do not
    (wall-clock times to the microsecond). The trace file's own digest cannot tell: it holds
    the run_id and the path, which differ between the copies."""
    text = "\n".join(f"{n}:{t!r}" for n, t in steps)
    return hashlib.sha256(f"{model_json}\0{layout_hash}\0{text}".encode()).hexdigest()


def _step_times(store, sweep: str) -> dict[str, list[tuple[int, float]]]:
    """Each run's (step, seconds) of ``sweep``, in step order."""
    from sqlalchemy import select

    from frontier_llm.store.schema import flm_runs, flm_steps

    r, st = flm_runs, flm_steps
    stmt = (select(r.c.run_id, st.c.step, st.c.time_s)
            .select_from(st.join(r, st.c.run == r.c.id))
            .where(r.c.sweep_name == sweep).order_by(r.c.run_id, st.c.step))
    out: dict[str, list[tuple[int, float]]] = {}
    with store.read() as conn:
        for rid, step, secs in conn.execute(stmt):
            out.setdefault(rid, []).append((int(step), float(secs)))
    return out


def load_runs(store, sweep: str, dropped: list[str] | None = None,
              repeated: list[str] | None = None) -> pd.DataFrame:
    """Completed runs of ``sweep`` with a measured step time, and their model and layout.

    Repeated runs of one layout (same model and layout hash) are one measurement of one step
    time: their median, with ``runs`` counting them (``run_id`` is the first one's). On a
    shared machine, repeating each layout at different times is how the load's drift is
    averaged out instead of being fitted as a property of the layout. A run that is a copy of
    another (the same per-step times, :func:`measurement_key`) is no repetition: it is left
    out, and ``repeated`` gets one line per copy.

    A step time outside the plausible range (specs/plausible.py: a database filled by an older
    flm, or by hand) is left out, never fitted: one run of 1e305 s moved a calibration's
    held-out error from 15 % to 336 %. ``dropped`` gets one line per run left out, for the
    caller to print.
    """
    from sqlalchemy import select

    from frontier_llm.store.schema import flm_layouts, flm_runs

    r, lay = flm_runs, flm_layouts
    stmt = (select(r.c.run_id, r.c.step_time_s, r.c.status, lay.c.model_json, lay.c.layout_json,
                   lay.c.layout_hash)
            .select_from(r.join(lay, r.c.layout_id == lay.c.id))
            .where(r.c.sweep_name == sweep).order_by(r.c.run_id))
    with store.read() as conn:
        rows = [tuple(x) for x in conn.execute(stmt)]
    df = pd.DataFrame(rows, columns=["run_id", "measured_s", "status", "model_json",
                                     "layout_json", "layout_hash"])
    df = df[(df["status"] == RunStatus.COMPLETED) & (pd.to_numeric(df["measured_s"]) > 0)]
    why = [step_time_problem(float(x)) for x in df["measured_s"]]
    if dropped is not None:
        dropped.extend(f"{rid}: {w}" for rid, w in zip(df["run_id"], why, strict=True) if w)
    df = df[[w is None for w in why]]
    if df.empty:
        raise UserError(f"no completed runs with a step time for sweep {sweep!r} in the "
                        "database: run 'flm collect DIR' on its traces, or check --sweep/--db")
    # One measurement stored twice (a copied folder collected again) counts once: the first
    # run_id keeps it. A run without step rows is its own measurement (nothing to compare).
    steps = _step_times(store, sweep)
    df["measurement"] = [measurement_key(m, h, steps[rid]) if steps.get(rid) else rid
                         for rid, m, h in zip(df["run_id"], df["model_json"], df["layout_hash"],
                                              strict=True)]
    copies = df["measurement"].duplicated(keep="first")
    if repeated is not None:
        first = dict(zip(df.loc[~copies, "measurement"], df.loc[~copies, "run_id"], strict=True))
        repeated.extend(f"{rid} (= {first[key]})" for rid, key
                        in zip(df.loc[copies, "run_id"], df.loc[copies, "measurement"],
                               strict=True))
    df = df[~copies]
    df["measured_s"] = df["measured_s"].astype(float)
    df = (df.groupby(["model_json", "layout_hash"], sort=False)
          .agg(run_id=("run_id", "first"), measured_s=("measured_s", "median"),
               runs=("run_id", "size"), layout_json=("layout_json", "first"))
          .reset_index().sort_values("run_id").reset_index(drop=True))
    df["config"] = [Layout.from_dict(json.loads(t)) for t in df["layout_json"]]
    df["layout"] = [describe(c) for c in df["config"]]
    df["model"] = [json.loads(m)["name"] for m in df["model_json"]]
    return df


def predict(system: SystemSpec, rs: RunSet) -> np.ndarray:
    out = np.empty(len(rs.runs))
    for model, table, pos in rs.groups:
        out[pos] = evaluate(model, system, table)["step_time_s"]
    return out


# --- knobs <-> system ---------------------------------------------------------------------
def _main_dtype(rs: RunSet) -> str:
    return str(pd.Series([c.dtype for c in rs.runs["config"]]).mode().iloc[0])


def knob_values(system: SystemSpec, dtype: str) -> dict[str, float]:
    """The system's current value of every knob (physical units)."""
    return {
        "matmul": system.peak(dtype) * system.eff("matmul"),
        "layer_overhead_s": system.layer_overhead_s,
        "latency": system.link("node").latency,
        "network_latency": system.link("network").latency,
        "collective": system.eff("collective"),
        "memory": system.eff("memory"),
    }


def with_knobs(system: SystemSpec, values: dict[str, float], dtype: str,
               source: str = "") -> SystemSpec:
    """``system`` with the given knobs set (only those named)."""
    eff = dict(system.efficiency)
    peaks = dict(system.peak_flops)
    links = dict(system.links)
    changes: dict = {}
    if "matmul" in values:
        rate = values["matmul"]
        peak = system.peak(dtype)
        if rate > peak:
            # The stated peak was too low for the dtype measured: the achieved rate is its best
            # lower bound (as calibrate/system_file.py sets it). Other dtypes' peaks say nothing
            # of it (fp8 is no fixed multiple of bf16 across GPUs), and scaled alike they left
            # a CPU-fitted file's fp8 peak beyond any device's.
            peaks[dtype] = rate
            peak = rate
        eff["matmul"] = Efficiency(min(1.0, rate / peak), source)
        changes["peak_flops"] = peaks
    for name in ("collective", "memory"):
        if name in values:
            eff[name] = Efficiency(float(np.clip(values[name], 1e-6, 1.0)), source)
    if "layer_overhead_s" in values:
        changes["layer_overhead_s"] = float(values["layer_overhead_s"])
    for knob, scopes in (("latency", ("package", "node")), ("network_latency", ("network",))):
        if knob in values:
            for scope in scopes:
                if scope in links:
                    links[scope] = dataclasses.replace(links[scope], latency=float(values[knob]),
                                                       source=source)
    return dataclasses.replace(system, efficiency=eff, links=links, **changes)


# --- the fit ------------------------------------------------------------------------------
_LOG_KNOBS = {"matmul", "latency", "network_latency", "collective", "memory"}


def fit_knobs(system: SystemSpec, rs: RunSet, knobs: tuple[str, ...]) -> dict[str, float]:
    """Knob values minimising the squared log error of the predicted step times."""
    dtype = _main_dtype(rs)
    start = knob_values(system, dtype)
    measured = rs.runs["measured_s"].to_numpy(float)

    def decode(x: np.ndarray) -> dict[str, float]:
        out = {}
        for k, v in zip(knobs, x, strict=True):
            out[k] = float(np.exp(v)) if k in _LOG_KNOBS else float(v) * 1e-3
        return out

    x0, lo, hi = [], [], []
    for k in knobs:
        if k in _LOG_KNOBS:
            v = np.log(max(start[k], 1e-9))
            top = 0.0 if k in ("collective", "memory") else v + 8
            x0.append(min(v, top))
            lo.append(v - 8)
            hi.append(top + 1e-12)
        else:  # layer_overhead_s, fitted in milliseconds
            x0.append(start[k] * 1e3)
            lo.append(0.0)
            hi.append(1e4)

    def residuals(x: np.ndarray) -> np.ndarray:
        pred = predict(with_knobs(system, decode(x), dtype), rs)
        return np.log(pred / measured)

    # soft_l1: a run far off (a burst of load on a shared machine) pulls less than in plain
    # least squares; within ~10 % of the log error the loss is quadratic as usual.
    sol = least_squares(residuals, np.array(x0, float), bounds=(lo, hi), x_scale="jac",
                        loss="soft_l1", f_scale=0.1)
    return decode(sol.x)


def folds(n: int, k: int, seed: int = 0) -> np.ndarray:
    """A fold number per run (seeded shuffle, sizes differ by at most one)."""
    order = np.random.default_rng(seed).permutation(n)
    out = np.empty(n, int)
    out[order] = np.arange(n) % k
    return out


@dataclass
class LoopReport:
    per_run: pd.DataFrame  # run_id, layout, fold, measured_s, before_s, after_s, errors
    summary: pd.DataFrame  # what, runs, MAPE before/after
    knobs_all: dict[str, float]  # fitted on every training run
    knobs_before: dict[str, float]
    system_all: SystemSpec


def _ape(pred: np.ndarray, meas: np.ndarray) -> np.ndarray:
    return (pred - meas) / meas * 100.0


def closed_loop(system: SystemSpec, runs: pd.DataFrame, knobs: tuple[str, ...], k: int,
                test: pd.DataFrame | None = None, source: str = "") -> LoopReport:
    """k-fold cross-validated refit of ``knobs`` on ``runs``; ``test`` runs (another sweep) are
    predicted by the fit on all of ``runs`` only."""
    bad = [x for x in knobs if x not in KNOBS]
    if bad or not knobs:
        raise UserError(f"unknown knob(s) {', '.join(bad) or '(none)'}: choose from "
                        f"{', '.join(KNOBS)}")
    n = len(runs)
    if n < 2:
        raise UserError(f"{n} layout(s) measured in the sweep: cross-validation needs at "
                        "least 2")
    k = max(2, min(k, n))
    rs = make_runset(runs)
    dtype = _main_dtype(rs)
    before = predict(system, rs)
    after = np.empty(n)
    fold = folds(n, k)
    for f in range(k):
        train, held = fold != f, fold == f
        fitted = fit_knobs(system, rs.subset(train), knobs)
        after[held] = predict(with_knobs(system, fitted, dtype), rs.subset(held))
    knobs_all = fit_knobs(system, rs, knobs)
    system_all = with_knobs(system, knobs_all, dtype, source)
    insample = predict(system_all, rs)
    meas = runs["measured_s"].to_numpy(float)
    per_run = pd.DataFrame({
        "set": "cv", "run_id": runs["run_id"], "layout": runs["layout"], "runs": runs["runs"],
        "fold": fold,
        "measured_s": meas, "before_s": before, "after_s": after,
        "before_err_pct": _ape(before, meas), "after_err_pct": _ape(after, meas),
    })
    summary = [{"what": f"held-out ({k}-fold CV)", "runs": n,
                "mape_before_pct": np.abs(_ape(before, meas)).mean(),
                "mape_after_pct": np.abs(_ape(after, meas)).mean()},
               {"what": "in-sample (fit on all)", "runs": n,
                "mape_before_pct": np.abs(_ape(before, meas)).mean(),
                "mape_after_pct": np.abs(_ape(insample, meas)).mean()}]
    if test is not None and len(test):
        trs = make_runset(test.reset_index(drop=True))
        tm = trs.runs["measured_s"].to_numpy(float)
        tb, ta = predict(system, trs), predict(system_all, trs)
        per_run = pd.concat([per_run, pd.DataFrame({
            "set": "test", "run_id": trs.runs["run_id"], "layout": trs.runs["layout"],
            "runs": trs.runs["runs"], "fold": -1, "measured_s": tm, "before_s": tb, "after_s": ta,
            "before_err_pct": _ape(tb, tm), "after_err_pct": _ape(ta, tm)})],
            ignore_index=True)
        summary.append({"what": "test sweep (never fitted)", "runs": len(tm),
                        "mape_before_pct": np.abs(_ape(tb, tm)).mean(),
                        "mape_after_pct": np.abs(_ape(ta, tm)).mean()})
    return LoopReport(per_run=per_run, summary=pd.DataFrame(summary), knobs_all=knobs_all,
                      knobs_before={x: knob_values(system, dtype)[x] for x in knobs},
                      system_all=system_all)


def cv_log_residuals(report: LoopReport) -> list[float]:
    """The k-fold cross-validation's held-out residuals, log(predicted / measured step time),
    one per run: what the planner's intervals read from a refitted system file."""
    cv = report.per_run[report.per_run["set"] == "cv"]
    return [round(float(x), 6) for x in np.log(cv["after_s"] / cv["measured_s"])]


def refitted_mapping(base: dict, report: LoopReport, source: str) -> dict:
    """The base system's YAML mapping with the knobs fitted on all runs in place, and the
    cross-validated error of those knobs (``prediction_error``: the planner's intervals for
    this system come from it, planner/intervals.py)."""
    from frontier_llm.calibrate.system_file import plain

    s = report.system_all
    out = dict(base)
    folds_used = int(report.per_run.loc[report.per_run["set"] == "cv", "fold"].max()) + 1
    out["prediction_error"] = {
        "log_residuals": cv_log_residuals(report),
        "method": f"{folds_used}-fold cross-validation of the step time",
        "source": source,
    }
    out["peak_flops"] = {k: float(f"{v:.4g}") for k, v in s.peak_flops.items()}
    eff = dict(out.get("efficiency") or {})
    for name, e in s.efficiency.items():
        if (name in eff and isinstance(eff[name], dict)) or name not in eff:
            eff[name] = {"value": round(e.value, 4), "source": e.source or
                         (eff.get(name) or {}).get("source", "")}
        else:
            eff[name] = {"value": round(e.value, 4), "source": ""}
    out["efficiency"] = eff
    out["layer_overhead_s"] = float(f"{s.layer_overhead_s:.4g}")
    links = {}
    for scope, tier in s.links.items():
        links[scope] = {"bandwidth": tier.bandwidth, "latency": float(f"{tier.latency:.4g}"),
                        "source": tier.source, **({} if tier.rails else {"rails": False})}
    out["links"] = links
    sources = dict(out.get("sources") or {})
    sources["from_runs"] = source
    out["sources"] = sources
    from frontier_llm.catalog import system_from_mapping

    system_from_mapping(plain(out))
    return out

