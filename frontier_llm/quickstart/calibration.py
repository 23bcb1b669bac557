"""The quickstart's two calibrations of the machine it runs on, through flm calibrate's API.

- microbench: before the plan, ``flm calibrate run``'s microbenchmarks on the quickstart's own
  ranks (its model's block GEMMs, gloo collectives of pairs and of all ranks), fitted into the
  base system (``--system``, the catalog's cpu-local by default): the plan and the sweep
  predict with ``DIR/calibration/microbench.yaml``.
- refit: after the sweep, ``flm calibrate --from-runs`` on the sweep's runs, from the
  microbenchmark file, with k-fold cross-validation: the study predicts (and warm-starts) with
  ``DIR/calibration/refit.yaml``.

Both files name the system ``BASE-calibrated``: they describe one machine, and a layout's
identity (its hash) holds the system's name, so the study recognises the sweep's runs of its
layouts whichever of the two predicted them.

Resumable: each file is written atomically and last, so a file that exists is a finished
calibration and is reused; Ctrl-C during the microbenchmark kills its ranks and leaves no file.

The scores here are the quickstart's verdict on each system file: the step time's mean absolute
percentage error and the rank correlation of predicted and measured throughput per rank (does
the model order the layouts as they measured).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from frontier_llm.calibrate.fromruns import (
    LoopReport,
    closed_loop,
    load_runs,
    make_runset,
    predict,
    refitted_mapping,
)
from frontier_llm.calibrate.microbench import MiB, WorkerConfig
from frontier_llm.calibrate.system_file import base_mapping, provenance_line, write_system
from frontier_llm.catalog import load_model, load_system
from frontier_llm.errors import UserError
from frontier_llm.quickstart.settings import Settings
from frontier_llm.specs.layout import Layout
from frontier_llm.specs.system import SystemSpec
from frontier_llm.specs.vocab import RunStatus

# What a quickstart's microbenchmark measures, sized to take seconds on two cores: the GEMMs
# of tiny-gpt's blocks are microseconds each, so 50 ms of calls per GEMM averages hundreds of
# them; 4 MiB messages already take several times the start-up time on loopback gloo
# (bandwidth-bound), which is what the alpha-beta fit needs from the top of its range.
MATMUL_BUDGET_S = 0.05
MIN_BYTES, MAX_BYTES = 1024, 4 * MiB
# The knobs refitted from the runs: what the microbenchmark cannot see. layer_overhead_s is the
# Python and framework dispatch of every block (no GEMM loop times it); latency is a message's
# start-up as a training step sees it, waiting for a peer rank to be scheduled on shared cores;
# collective is the fraction of the measured link bandwidth a training step's collectives get
# (bucketed gradient all-reduces issued from Python, ranks sharing the cores with their own
# compute) (docs/calibrate.md §5-6). Without collective, a one-rank run (no communication) and
# the multi-rank runs (gradient all-reduces) cannot both be fitted: on the first runs here the
# fit gave up the one-rank run (+276 %). The matrix rate stays the microbenchmark's
# measurement: on these tiny GEMMs a fitted rate runs to its bound (cpu-local-fit's header).
REFIT_KNOBS = ("layer_overhead_s", "latency", "collective")
MAX_FOLDS = 5

ROLES = ("built-in", "microbench", "refit")


@dataclass(frozen=True)
class Files:
    """Where the quickstart keeps its calibration (DIR/calibration/)."""

    folder: Path

    @property
    def results(self) -> Path:
        return self.folder / "microbench.calibration.json"

    @property
    def microbench(self) -> Path:
        return self.folder / "microbench.yaml"

    @property
    def refit(self) -> Path:
        return self.folder / "refit.yaml"

    @property
    def refit_runs(self) -> Path:
        """The refit's per-run table (held-out and in-sample predictions), for a resume."""
        return self.folder / "refit-runs.csv"


def calibrated_name(base: str) -> str:
    return f"{load_system(base).name}-calibrated"


def _gemms(settings: Settings) -> list:
    from frontier_llm.calibrate.shapes import gemm_set

    model = load_model(settings.model)
    tps = [t for t in range(1, settings.ranks + 1)
           if settings.ranks % t == 0 and model.hidden % t == 0 and model.ffn_hidden % t == 0
           and model.heads % t == 0]
    # As flm calibrate run's default ladder: a quarter to twice the model's width.
    widths = [w for w in (model.hidden // 4, model.hidden // 2, model.hidden, 2 * model.hidden)
              if w >= model.head_dim and w % model.head_dim == 0]
    return gemm_set(model, tps, widths)


def microbench(settings: Settings, files: Files, db_url: str,
               on_progress: Callable[[str], None] | None = None) -> tuple[Path, str]:
    """Measure this machine and write ``files.microbench``; (the file, a line on the fit).
    A file already there (a resumed quickstart) is reused as it is."""
    from frontier_llm.calibrate.fit import fit_links, fit_matmul
    from frontier_llm.calibrate.local import measure
    from frontier_llm.calibrate.results import load_results

    if files.microbench.is_file():
        return files.microbench, "reused (a resumed quickstart measures once)"
    files.folder.mkdir(parents=True, exist_ok=True)
    base = load_system(settings.system)
    cfg = WorkerConfig(gemms=_gemms(settings), dtype="fp32", min_bytes=MIN_BYTES,
                       max_bytes=MAX_BYTES, gpus_per_package=base.gpus_per_package, mpi=False,
                       matmul_budget_s=MATMUL_BUDGET_S)
    log = files.folder / "microbench.log"
    code = measure(cfg, settings.ranks, files.results, settings.model, base.name,
                   log=log, on_progress=on_progress)
    if code != 0 or not files.results.is_file():
        # The log's last error names the cause in the one line the user reads: before
        # frontier_llm/child.py that was the ImportError no rerun could cure.
        raise UserError(f"the calibration microbenchmark failed (exit {code}: "
                        f"{last_error(log) or 'no error line'}; its log: {log}); run again to "
                        "retry, or pass --no-calibrate to predict with "
                        f"{settings.system} as it is")
    res = load_results(files.results)
    links = fit_links(res.collectives)
    matmul = fit_matmul(res.matmul, res.dtype)
    from frontier_llm.calibrate.system_file import calibrated_mapping

    mapping = calibrated_mapping(base_mapping(settings.system), res.provenance, links, matmul,
                                 calibrated_name(settings.system))
    _store(files.results, db_url)
    write_system(mapping, files.microbench, [
        f"System {mapping['name']}: {provenance_line(res.provenance)}",
        f"Written by flm quickstart from {files.results.name} (flm calibrate's "
        "microbenchmarks; docs/calibrate.md)."])
    node = mapping["links"]["node"]
    return files.microbench, (
        f"gloo between ranks: latency {node['latency'] * 1e6:,.0f} us, bandwidth "
        f"{node['bandwidth'] / 1e9:.2f} GB/s; matrix rate {matmul.rate / 1e9:.1f} GFLOP/s per "
        f"rank with {settings.ranks} ranks computing at once (fp32)")


def last_error(log: Path) -> str | None:
    """The last line of ``log`` that names an error (``...Error: ...``), else its last line;
    None when the log is empty or unreadable."""
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return None
    errors = [ln for ln in lines if "Error" in ln or "error:" in ln]
    return (errors or lines or [None])[-1]


def _store(results: Path, db_url: str) -> None:
    """The microbenchmark's timings into the folder's database, as flm calibrate run does."""
    from frontier_llm.store import open_store
    from frontier_llm.store.calibration_tables import save_results

    raw = results.read_bytes()
    store = open_store(db_url)
    try:
        save_results(store, json.loads(raw), str(results), raw)
    finally:
        store.close()


@dataclass
class Refit:
    file: Path | None  # None: no refit (too few runs); the reason in ``why``
    per_run: pd.DataFrame  # measured, before (microbench) and held-out after, per sweep layout
    knobs: dict[str, float]
    why: str = ""


def refit(settings: Settings, files: Files, db_url: str, sweep: str) -> Refit:
    """``flm calibrate --from-runs`` on the sweep's runs, from the microbenchmark file: write
    ``files.refit``. A refit file already there is reused, with the table it was made with."""
    from frontier_llm.store import open_existing

    if files.refit.is_file() and files.refit_runs.is_file():
        per_run = pd.read_csv(files.refit_runs)
        system = load_system(str(files.refit))
        return Refit(files.refit, per_run, {k: _knob(system, k) for k in REFIT_KNOBS})
    store = open_existing(db_url)
    try:
        runs = load_runs(store, sweep)
    except UserError as exc:
        return Refit(None, pd.DataFrame(), {}, str(exc))
    finally:
        store.close()
    if len(runs) < 2:
        return Refit(None, pd.DataFrame(), {},
                     f"{len(runs)} layout measured: a refit needs at least 2")
    base = str(files.microbench)
    source = (f"flm quickstart: flm calibrate --from-runs on the {len(runs)} layouts of sweep "
              f"{sweep} ({files.folder.parent}), knobs {', '.join(REFIT_KNOBS)}")
    report: LoopReport = closed_loop(load_system(base), runs, REFIT_KNOBS,
                                     min(MAX_FOLDS, len(runs)), source=source)
    mapping = refitted_mapping(base_mapping(base), report, source)
    mapping["description"] = (f"{mapping.get('description', '')}; refitted from the "
                              "quickstart's sweep")
    rs = make_runset(runs)
    per_run = report.per_run.assign(
        per_rank_batch=[c.global_batch / c.world_size for c in runs["config"]],
        builtin_s=predict(load_system(settings.system), rs),
        insample_s=predict(report.system_all, rs))
    per_run.to_csv(files.refit_runs, index=False)
    write_system(mapping, files.refit, [f"System {mapping['name']} refitted from runs.", source])
    return Refit(files.refit, per_run, report.knobs_all)


def _knob(system: SystemSpec, knob: str) -> float:
    from frontier_llm.calibrate.fromruns import knob_values

    return knob_values(system, "fp32")[knob]


def knob_text(knob: str, value: float) -> str:
    """A fitted knob in its unit (docs/calibrate.md §5's table)."""
    if knob in ("layer_overhead_s", "latency", "network_latency"):
        # The fit's bound is 0: a value below a nanosecond is that bound, not a measurement.
        return f"{knob} {value * 1e3:.3g} ms" if value >= 1e-9 else f"{knob} 0 (its bound)"
    if knob == "matmul":
        return f"matmul {value / 1e9:.3g} GFLOP/s"
    return f"{knob} {value:.3g} of the link bandwidth" if knob == "collective" else \
        f"{knob} {value:.3g}"


# --- scores -------------------------------------------------------------------------------------
def score(measured_s, predicted_s, per_rank_batch) -> tuple[float, float]:
    """(step time MAPE in %, rank correlation of predicted and measured throughput per rank).
    Throughput per rank is the per-rank batch over the step time, so runs of different sizes
    (the weak-scaling series) rank by what they deliver per rank."""
    m = np.asarray(measured_s, float)
    p = np.asarray(predicted_s, float)
    b = np.asarray(per_rank_batch, float)
    mape = float(np.mean(np.abs(p - m) / m) * 100)
    if len(m) < 2:
        return mape, float("nan")
    rho = pd.Series(b / m).rank().corr(pd.Series(b / p).rank())
    return mape, float(rho)


def sweep_scores(settings: Settings, fit: Refit) -> list[tuple[str, float, float]]:
    """(what, MAPE, rank correlation) on the sweep's runs: each system file, and the refit
    held out (k-fold: each layout predicted by knobs fitted without it) beside in-sample."""
    t = fit.per_run
    m, b = t["measured_s"], t["per_rank_batch"]
    folds = int(t["fold"].max()) + 1
    return [(f"built-in {settings.system}", *score(m, t["builtin_s"], b)),
            ("microbenchmark-calibrated", *score(m, t["before_s"], b)),
            (f"refit, held out ({folds}-fold)", *score(m, t["after_s"], b)),
            ("refit, in-sample", *score(m, t["insample_s"], b))]


def kept_calibration(fit: Refit) -> tuple[str, str]:
    """Which file the study predicts with, ``refit`` or ``microbench``, and a line saying why:
    the one with the lower step-time error on the sweep's runs that it was not fitted on (the
    refit's k-fold held-out predictions; every prediction of the microbenchmark file, which no
    run fitted). The in-sample error would favour the refit whatever it is worth: one run had a
    held-out 87 % against the microbenchmark file's 67 %, and the study used the refit."""
    t = fit.per_run
    m, b = t["measured_s"], t["per_rank_batch"]
    held_out, _ = score(m, t["after_s"], b)
    micro, _ = score(m, t["before_s"], b)
    if held_out <= micro:
        return "refit", (f"kept the refit: its held-out step-time error {held_out:.1f} % is at "
                         f"most the microbenchmark file's {micro:.1f} %")
    return "microbench", (f"kept the microbenchmark file: its step-time error {micro:.1f} % is "
                          f"below the refit's held-out {held_out:.1f} %")


def run_layouts(db_url: str) -> pd.DataFrame:
    """Every completed run in the folder's database: run id, sweep name, model and layout
    (``config``), as fromruns' run sets take them."""
    from sqlalchemy import select

    from frontier_llm.store import open_existing
    from frontier_llm.store.schema import flm_layouts, flm_runs

    r, lay = flm_runs, flm_layouts
    store = open_existing(db_url)
    try:
        with store.read() as conn:
            rows = [tuple(x) for x in conn.execute(
                select(r.c.run_id, r.c.sweep_name, lay.c.model_json, lay.c.layout_json)
                .select_from(r.join(lay, r.c.layout_id == lay.c.id))
                .where(r.c.status == RunStatus.COMPLETED.value).order_by(r.c.run_id))]
    finally:
        store.close()
    df = pd.DataFrame(rows, columns=["run_id", "sweep_name", "model_json", "layout_json"])
    df["config"] = [Layout.from_dict(json.loads(t)) for t in df["layout_json"]]
    return df


def three_systems(validation: pd.DataFrame, db_url: str,
                  systems: list[tuple[str, str]]) -> pd.DataFrame:
    """``validation`` (report.sources.validation_runs) once per (label, system file), each
    with that system's predicted step time and peak memory and the errors recomputed: the
    frame the errors report compares the systems on. Adds ``sweep_name``."""
    layouts = run_layouts(db_url).set_index("run_id")
    v = validation[validation["run_id"].isin(layouts.index)].reset_index(drop=True)
    runs = layouts.loc[v["run_id"]].reset_index()
    rs = make_runset(runs)
    out = []
    for label, path in systems:
        system = load_system(path)
        step = predict(system, rs)
        mem = _predict_memory(system, rs)
        f = v.assign(system=label, sweep_name=runs["sweep_name"].to_numpy(),
                     predicted_step_time_s=step, predicted_peak_memory_bytes=mem)
        f["step_time_error_pct"] = (step - f["measured_step_time_s"].astype(float)) / \
            f["measured_step_time_s"].astype(float) * 100
        measured_mem = pd.to_numeric(f["measured_peak_memory_bytes"], errors="coerce")
        f["memory_error_pct"] = (mem - measured_mem) / measured_mem * 100
        out.append(f)
    return pd.concat(out, ignore_index=True)


def _predict_memory(system: SystemSpec, rs) -> np.ndarray:
    from frontier_llm.costmodel import evaluate

    out = np.empty(len(rs.runs))
    for model, table, pos in rs.groups:
        out[pos] = evaluate(model, system, table)["peak_memory_bytes"]
    return out
