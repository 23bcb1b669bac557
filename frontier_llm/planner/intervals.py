"""Error bars from the cost model's error on published runs of sources it did not see.

Method (docs/planner.md, "Reading an interval"):

- The residuals are ``log(predicted / measured step time)`` of the rows of the calibration
  corpus (every ``planner/data/calibration_runs*.csv``), each
  predicted **leave-one-source-out**: with the knobs fitted without any row of its paper,
  repository or blog (``analysis/loso_residuals.py`` writes them to
  ``planner/data/calibration_residuals.csv``). A new user's run is a new source, not a new row
  of a known one, so this is the error that transfers. Rows whose ``confidence`` is ``low`` are
  left out (the tables' README: the doubtful LUMI DP 8 row); rows the model cannot build (an
  unstated architecture) have no residual.
- A layout's **family** is its engine, whether it shards parameters (ZeRO-3, FSDP, HSDP), and
  its GPU's maker: ``megatron@nvidia``, ``deepspeed@amd``, ``native+sharded@nvidia`` ... A
  system whose GPU is another system's (Frontier's and LUMI-G's MI250X GCDs) is within that
  system's rows, not beyond them. The half-width at
  confidence ``c`` is the empirical quantile of the family's absolute residuals: the
  ``ceil(n·c)``-th smallest of ``n`` (:func:`residual_quantile`; split-conformal's
  ``ceil((n + 1)·c)``-th, Vovk et al. 2005, Lei et al. 2018, over-covered the left-out
  sources). A family with fewer rows than ``c / (1 - c)`` takes the larger of the reference
  quantile (below) and its own largest error.
- **The reference quantile** (:func:`reference_pool`): that of the rows that ran on the layout's
  GPU, every engine's, where there are at least ``c / (1 - c)`` of them (an MI250X layout on
  Frontier or LUMI-G: LUMI-G's rows, not the NVIDIA-heavy pool); else the all-family quantile.
- **Extrapolation**: a layout of a family without rows, or beyond its family's rows on a GPU
  none of them ran on, takes at least the reference quantile; one at more than
  :data:`SCALE_REACH` times their largest GPU count at least the all-family quantile (the
  model-form error across engines, systems and scales, which is what the family's rows cannot
  measure). ``interval_basis`` says which applied.
- A system file with ``prediction_error`` (``flm calibrate --from-runs``) uses its own
  cross-validated residuals instead.
- The interval is symmetric in log space: ``step_time · exp(±q)``; throughput the reciprocal.
- Peak memory: the same from the rows that state a measured peak (``memory_log_residual``;
  their empirical quantile, or their largest error where they are too few for ``c``, said in
  ``memory_interval_basis``). The verdict: ``fits`` (the high end fits the device),
  ``exceeds`` (the low end does not), ``tight`` (the interval straddles the capacity);
  ``memory_margin`` is the share of the device the point estimate leaves free (negative: over).

Assumptions: future runs' residuals are like the published ones' (same engines, similar
scales); the GPU's rows of other engines, or the all-family quantile, stand in for what no
calibration row measures (an engine never run on that GPU, say), which they may understate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from frontier_llm.catalog import load_system
from frontier_llm.errors import UserError
from frontier_llm.specs import axes
from frontier_llm.specs.system import SystemSpec

RESIDUALS = Path(__file__).with_name("data") / "calibration_residuals.csv"
DEFAULT_CONFIDENCE = 0.8
INTERVAL_FIGURES = ("step_time_s", "tokens_per_s", "peak_memory_bytes")
# A GPU count more than this many times the family's largest calibration run is an
# extrapolation in scale (the exposed share of data-parallel communication grows with it).
SCALE_REACH = 2.0


def params_sharded(sharding: str | None) -> bool:
    """Whether a sharding's text form (``Sharding.describe``) shards parameters."""
    text = str(sharding or "")
    return text == "zero3" or text.startswith(("p=full", "p=partial"))


def vendor(system: SystemSpec) -> str:
    """The maker of a system's GPU (``nvidia``, ``amd``; ``other`` for a CPU process): the
    same engine runs other kernels (cuBLAS/NCCL vs rocBLAS/RCCL) on each, so its error is
    measured per vendor."""
    gpu = system.gpu.lower()
    for maker, words in (("amd", ("amd", "mi250", "mi300", "instinct")),
                         ("nvidia", ("nvidia", "a100", "h100", "h200", "b200"))):
        if any(w in gpu for w in words):
            return maker
    return "other"


def family(engine: str, sharding: str | None = None, maker: str | None = None,
           moe: bool = False, fp8: bool = False) -> str:
    """The error family of a layout: its engine, ``+sharded`` when it shards parameters,
    ``+moe`` for a Mixture-of-Experts model (its routing and all-to-alls are errors a dense
    row never shows, so its rows are kept apart), ``+fp8`` when its linear layers run in FP8
    (the FP8 GEMM rates, casts and recipes are errors a bf16 row never shows: the FP8 family
    is judged per precision x vendor, issue 52), and ``@vendor`` where the GPU's maker is given
    (:func:`vendor`)."""
    base = f"{engine}+sharded" if params_sharded(sharding) else str(engine)
    base = f"{base}+moe" if moe else base
    base = f"{base}+fp8" if fp8 else base
    return f"{base}@{maker}" if maker else base


@lru_cache(maxsize=64)
def gpu_of(system: str) -> str:
    """The GPU of a catalog system by name (the name itself for one the catalog lacks)."""
    try:
        return load_system(system).gpu
    except UserError:
        return system


@lru_cache(maxsize=4)
def load_residuals(path: str | Path = RESIDUALS) -> pd.DataFrame:
    """The leave-one-source-out residuals of the calibration rows (analysis/loso_residuals.py)."""
    try:
        return pd.read_csv(path)
    except FileNotFoundError:
        raise UserError(
            f"{path}: no such file (python analysis/loso_residuals.py writes it)"
        ) from None


def usable(residuals: pd.DataFrame) -> pd.DataFrame:
    """The rows an interval rests on: a finite residual, and a confidence other than ``low``."""
    conf = residuals["confidence"].fillna("high").astype(str).str.split().str[0]
    ok = np.isfinite(residuals["loso_log_residual"].to_numpy(float)) & (conf != "low")
    return residuals[ok]


def residual_quantile(abs_residuals: np.ndarray, confidence: float) -> float:
    """The ``ceil(n·c)``-th smallest of ``n`` absolute residuals (their empirical ``c``
    quantile); inf when there are fewer than ``c / (1 - c)`` of them, too few for one to lie
    beyond it. Split-conformal's ``ceil((n + 1)·c)``-th guarantees at least ``c`` for
    exchangeable runs and, measured leave-one-source-out on the 46-row corpus where the choice
    was made, covered 91 % at 80 % with a half-width of ×1.165 against the empirical
    quantile's 87 % at ×1.150; on today's 147 rows the two cover 80 % (×1.154) and 77 %
    (×1.144) (docs/planner.md)."""
    r = np.sort(np.abs(np.asarray(abs_residuals, dtype=float)))
    n = len(r)
    if n < confidence / (1 - confidence) - 1e-9:
        return math.inf
    k = max(1, math.ceil(n * confidence - 1e-9))
    return float(r[k - 1])


def half_width(group: np.ndarray, pool: np.ndarray, confidence: float) -> float:
    """The group's quantile, or, when the group is too small for it, the larger of
    the pool's quantile and the group's largest absolute residual."""
    q = residual_quantile(group, confidence)
    if math.isfinite(q):
        return q
    worst = float(np.max(np.abs(group))) if len(group) else 0.0
    return max(residual_quantile(pool, confidence), worst)


def fitted_systems(residuals: pd.DataFrame) -> list[str]:
    """The systems whose knobs were fitted to calibration rows: those with rows in the first
    table (``calibration_runs.csv``; nothing is fitted to the sharded table)."""
    first = residuals[residuals["file"] == "calibration_runs.csv"]
    return sorted(set(first["system"]))


def system_class(system: SystemSpec, residuals: pd.DataFrame | None = None) -> str:
    """``calibrated`` (its own cross-validated residuals), ``fitted`` (calibration rows ran
    on it) or ``transferred`` (none did: its knobs are carried over from another)."""
    if system.prediction_error is not None:
        return "calibrated"
    res = load_residuals() if residuals is None else residuals
    return "fitted" if system.name in fitted_systems(res) else "transferred"


@dataclass(frozen=True)
class Width:
    """A log-space half-width and what it was measured on."""

    q: float
    basis: str


def gpu_rows(rows: pd.DataFrame, gpu: str) -> pd.DataFrame:
    """The rows of ``rows`` that ran on ``gpu``, on any system and with any engine (Frontier's
    GPU: LUMI-G's MI250X GCDs)."""
    return rows[[gpu_of(s) == gpu for s in rows["system"]]]


def reference_pool(use: pd.DataFrame, gpu: str, confidence: float) -> tuple[float, str]:
    """(quantile, what it is) that a family too small for its own quantile, without rows, or
    beyond its rows' systems falls back on for a layout on ``gpu``: the quantile of the rows
    that ran on that GPU, every engine's, where there are enough of them for it (the
    MI250X's LUMI-G rows for Frontier: an AMD interval rests on AMD residuals), else the
    all-family quantile of every usable row."""
    own = gpu_rows(use, gpu)
    q = residual_quantile(own["loso_log_residual"].to_numpy(float), confidence)
    if math.isfinite(q):
        return q, (f"the {gpu} quantile of {len(own)} rows (every engine; on "
                   f"{', '.join(sorted(set(own['system'])))})")
    pool = use["loso_log_residual"].to_numpy(float)
    return residual_quantile(pool, confidence), f"the all-family quantile of {len(pool)} rows"


def family_width(residuals: pd.DataFrame, fam: str, system: str, gpus: float | None,
                 confidence: float, gpu: str | None = None) -> Width:
    """The half-width for a layout of family ``fam`` on ``system`` at ``gpus`` GPUs from
    ``residuals`` (module docstring): the family's quantile; a family too small for it, without
    rows, or beyond its rows' systems takes at least :func:`reference_pool` (the system's GPU's
    rows where there are enough); beyond their scale, at least the all-family quantile.
    ``gpu``: the system's GPU (default: the catalog's, by name)."""
    use = usable(residuals)
    pool = use["loso_log_residual"].to_numpy(float)
    gpu = gpu or gpu_of(system)
    ref, ref_name = reference_pool(use, gpu, confidence)
    rows = use[use["family"] == fam]
    group = rows["loso_log_residual"].to_numpy(float)
    if not len(rows):
        return Width(ref, f"{fam}: no calibration row of this family: {ref_name}, "
                          "leave-one-source-out")
    q = residual_quantile(group, confidence)
    basis = (f"{fam}: {len(rows)} rows of {rows['source'].nunique()} sources "
             f"({', '.join(sorted(rows['source'].unique()))}; on "
             f"{', '.join(sorted(set(rows['system'])))}), leave-one-source-out")
    if not math.isfinite(q):
        worst = float(np.max(np.abs(group)))
        q = max(ref, worst)
        basis += (f"; too few for {confidence:.0%}: "
                  + (f"their largest error, wider than {ref_name}" if worst > ref
                     else f"widened to {ref_name}"))
    ran_on = sorted(set(rows["system"]))
    if system not in ran_on and gpu not in {gpu_of(s) for s in ran_on}:
        # Another system with the same GPU (Frontier and LUMI-G: MI250X GCDs on Slingshot 11)
        # runs the same kernels: within the family's rows, not beyond them.
        q, words = _at_least(q, ref, ref_name)
        basis += (f"; beyond them in system {system} (the family ran on {', '.join(ran_on)}): "
                  f"{words}")
    top = float(rows["gpus"].max())
    if gpus is not None and np.isfinite(gpus) and gpus > SCALE_REACH * top:
        q, words = _at_least(q, residual_quantile(pool, confidence),
                             f"the all-family quantile of {len(pool)} rows")
        basis += f"; beyond them in scale ({gpus:.0f} GPUs > {SCALE_REACH:g} x {top:.0f}): {words}"
    return Width(q, basis)


def _at_least(q: float, floor: float, floor_name: str) -> tuple[float, str]:
    """``q`` raised to ``floor``, and words that say whether it was: a basis that said
    "widened to at least" where the width was already wider told a reader the fallback had
    set it."""
    if floor > q:
        return floor, f"widened to {floor_name}"
    if floor == q:
        return q, f"already as wide as {floor_name}"
    return q, f"already wider than {floor_name}"


def step_width(
    system: SystemSpec,
    engine: str,
    confidence: float = DEFAULT_CONFIDENCE,
    residuals: pd.DataFrame | None = None,
    sharding: str | None = None,
    gpus: float | None = None,
    fp8: bool = False,
) -> Width:
    """The step-time half-width (log space) for a layout of ``engine`` and ``sharding`` on
    ``gpus`` GPUs of ``system`` (``fp8``: its linear layers in FP8)."""
    check_confidence(confidence)
    if system.prediction_error is not None:
        r = np.asarray(system.prediction_error.log_residuals)
        q = residual_quantile(r, confidence)
        if not math.isfinite(q):
            q = float(np.max(np.abs(r)))
        return Width(
            q,
            f"calibrated: {len(r)} held-out runs "
            f"({system.prediction_error.method or 'flm calibrate --from-runs'})",
        )
    res = load_residuals() if residuals is None else residuals
    return family_width(res, family(engine, sharding, vendor(system), fp8=fp8), system.name,
                        gpus, confidence, system.gpu)


def memory_width(
    confidence: float = DEFAULT_CONFIDENCE, residuals: pd.DataFrame | None = None
) -> Width:
    """The peak-memory half-width (log space) from the rows that state a measured peak."""
    check_confidence(confidence)
    res = load_residuals() if residuals is None else residuals
    r = res["memory_log_residual"].dropna().to_numpy(float)
    if not len(r):
        return Width(0.0, "no calibration row states a measured peak memory")
    q = residual_quantile(r, confidence)
    if math.isfinite(q):
        return Width(q, f"{len(r)} rows with a measured peak memory")
    return Width(
        float(np.max(np.abs(r))),
        f"{len(r)} row(s) with a measured peak memory, too "
        f"few for {confidence:.0%}: the width is their largest error",
    )


def moe_width(width: Width, confidence: float = DEFAULT_CONFIDENCE,
              residuals: pd.DataFrame | None = None) -> Width:
    """``width`` for a Mixture-of-Experts layout: at least the all-family quantile and, where
    MoE calibration rows exist (families with ``+moe``), their largest leave-one-source-out
    error (too few of them for a quantile of their own), and the basis says so."""
    res = load_residuals() if residuals is None else residuals
    ok = usable(res)
    pool = residual_quantile(ok["loso_log_residual"].to_numpy(float), confidence)
    moe = ok[ok["family"].fillna("").astype(str).str.contains("+moe", regex=False)]
    if moe.empty:
        q, words = _at_least(width.q, pool, "the all-family quantile")
        return Width(q, f"no MoE calibration: {words} ({width.basis})")
    worst = float(np.max(np.abs(moe["loso_log_residual"].to_numpy(float))))
    q, words = _at_least(width.q, max(pool, worst),
                         "the larger of their largest error and the all-family quantile")
    return Width(q, f"{len(moe)} MoE calibration row(s) of {moe['source'].nunique()} "
                    f"source(s): {words} ({width.basis})")


def check_confidence(confidence: float) -> None:
    if not 0 < confidence < 1:
        raise UserError(f"the confidence must be between 0 and 1, exclusive (got {confidence})")


def memory_verdict(low, high, capacity: float) -> np.ndarray:
    """``fits`` / ``tight`` / ``exceeds`` from a memory interval and the device's capacity."""
    low, high = np.asarray(low, float), np.asarray(high, float)
    return np.where(high <= capacity, "fits", np.where(low > capacity, "exceeds", "tight"))


def _column(frame: pd.DataFrame, name: str, default) -> np.ndarray:
    if name not in frame:
        return np.full(len(frame), default, dtype=object)
    col = frame[name].astype(object)
    return col.where(col.notna(), default).to_numpy()


def add_intervals(
    frame: pd.DataFrame,
    system: SystemSpec,
    confidence: float = DEFAULT_CONFIDENCE,
    residuals: pd.DataFrame | None = None,
    moe: bool = False,
) -> pd.DataFrame:
    """``frame`` (plan rows with ``engine``, ``step_time_s``, ``tokens_per_s``,
    ``peak_memory_bytes``, and where present ``sharding`` and ``gpus``) with
    ``interval_confidence``, ``<figure>_low``/``_high`` for each of :data:`INTERVAL_FIGURES`,
    ``memory_verdict``, ``memory_margin`` and the bases of the widths. A new frame. ``moe``:
    the rows are a Mixture-of-Experts model's, which no calibration row measured (widened to
    at least the all-family quantile, :func:`moe_width`); a row with ``ep`` > 1 is one
    whatever ``moe`` says (only an MoE model takes ep)."""
    out = frame.copy()
    # Rows without an engine (a curve's GPU count where nothing fits) get no interval.
    engines = _column(out, "engine", "native" if "engine" not in out else "").astype(str)
    shardings = _column(out, "sharding", "").astype(str)
    if "gpus" in out:
        gpus = _column(out, "gpus", np.nan).astype(float)
    elif "dp" in out:
        # A plan's or flm predict's rows carry their layout, not a GPU count: the layout's world
        # is the count :func:`family_width`'s scale rule reads (without it a layout at many
        # times its family's largest run kept the family's own width).
        gpus = axes.frame_world_size(out)
    else:
        gpus = np.full(len(out), np.nan)
    q = np.full(len(out), np.nan)
    basis = np.full(len(out), "", dtype=object)
    widths: dict[tuple, Width] = {}
    experts = moe | (_column(out, "ep", 1).astype(float) > 1)
    fp8s = _column(out, "dtype", "bf16").astype(str) == "fp8"
    for i, (engine, sharding, n, e, f) in enumerate(zip(engines, shardings, gpus, experts, fp8s,
                                                        strict=True)):
        if not engine:
            continue
        key = (engine, sharding, n, e, f)
        if key not in widths:
            widths[key] = step_width(system, engine, confidence, residuals, sharding or None,
                                     None if np.isnan(n) else float(n), fp8=bool(f))
            if e:
                widths[key] = moe_width(widths[key], confidence, residuals)
        q[i], basis[i] = widths[key].q, widths[key].basis
    mem = memory_width(confidence, residuals)
    out["interval_confidence"] = confidence
    step = out["step_time_s"].to_numpy(float)
    out["step_time_s_low"], out["step_time_s_high"] = step * np.exp(-q), step * np.exp(q)
    tps = out["tokens_per_s"].to_numpy(float)
    out["tokens_per_s_low"], out["tokens_per_s_high"] = tps * np.exp(-q), tps * np.exp(q)
    peak = out["peak_memory_bytes"].to_numpy(float)
    out["peak_memory_bytes_low"] = peak * np.exp(-mem.q)
    out["peak_memory_bytes_high"] = peak * np.exp(mem.q)
    out["memory_verdict"] = np.where(
        np.isnan(peak),
        "",
        memory_verdict(
            out["peak_memory_bytes_low"], out["peak_memory_bytes_high"], system.memory_bytes
        ),
    )
    out["memory_margin"] = 1 - peak / system.memory_bytes
    out["interval_basis"] = basis
    out["memory_interval_basis"] = mem.basis
    return out


def loso_coverage(
    confidence: float = DEFAULT_CONFIDENCE, residuals: pd.DataFrame | None = None
) -> pd.DataFrame:
    """Each usable calibration row's interval built without its source: the half-width from
    the other sources' residuals by the rules of :func:`family_width`, and whether the row's
    own residual lies inside. One row per usable calibration row: ``source``, ``family``,
    ``system``, ``gpus``, ``residual``, ``half_width``, ``covered``, ``basis``."""
    res = load_residuals() if residuals is None else residuals
    rows = []
    for _, held in usable(res).iterrows():
        others = res[res["source"] != held["source"]]
        w = family_width(others, held["family"], held["system"], float(held["gpus"]),
                         confidence)
        r = float(held["loso_log_residual"])
        rows.append({"source": held["source"], "model": held["model"],
                     "family": held["family"], "system": held["system"],
                     "gpus": int(held["gpus"]), "residual": r, "half_width": w.q,
                     "covered": abs(r) <= w.q, "basis": w.basis})
    return pd.DataFrame(rows)


def family_numbers(residuals: pd.DataFrame, confidence: float = DEFAULT_CONFIDENCE
                   ) -> pd.DataFrame:
    """:func:`family_table` as numbers (fractions, rounded to 1e-4): per family and ``all``,
    ``rows``, ``sources``, ``mean_error`` and ``max_error`` (``|predicted/measured − 1|`` of
    the step time), ``bias`` (the mean signed error: negative predicts too fast),
    ``coverage`` of the ``confidence`` interval built without each row's source and
    ``median_half_width`` (a ratio − 1). The drift guard's golden (tests/test_drift_guard.py)."""
    cov = loso_coverage(confidence, residuals)
    use = usable(residuals)
    groups = [(f, use[use["family"] == f], cov[cov["family"] == f])
              for f in sorted(use["family"].unique())]
    groups.append(("all", use, cov))
    out = []
    for name, rows, c in groups:
        signed = np.exp(rows["loso_log_residual"].to_numpy(float)) - 1
        out.append({"family": name, "rows": len(rows), "sources": rows["source"].nunique(),
                    "mean_error": round(float(np.mean(np.abs(signed))), 4),
                    "max_error": round(float(np.max(np.abs(signed))), 4),
                    "bias": round(float(np.mean(signed)), 4),
                    "coverage": round(float(c["covered"].mean()), 4),
                    "median_half_width": round(float(np.exp(np.median(c["half_width"])) - 1),
                                               4)})
    return pd.DataFrame(out)


def gpu_numbers(residuals: pd.DataFrame, confidence: float = DEFAULT_CONFIDENCE,
                min_rows: int = 3) -> pd.DataFrame:
    """:func:`family_numbers` per GPU instead of per family (every engine's rows on the GPU,
    whichever system ran them: the MI250X's are LUMI-G's and Frontier's), for the GPUs with at
    least ``min_rows`` usable rows: what an interval on a system of that GPU falls back on
    (:func:`reference_pool`)."""
    cov = loso_coverage(confidence, residuals)
    use = usable(residuals)
    gpus = np.array([gpu_of(s) for s in use["system"]])
    cov_gpus = np.array([gpu_of(s) for s in cov["system"]])
    out = []
    for gpu in sorted(set(gpus)):
        rows, c = use[gpus == gpu], cov[cov_gpus == gpu]
        if len(rows) < min_rows:
            continue
        signed = np.exp(rows["loso_log_residual"].to_numpy(float)) - 1
        out.append({"gpu": gpu, "rows": len(rows), "sources": rows["source"].nunique(),
                    "mean error": f"{np.mean(np.abs(signed)):.1%}",
                    "max error": f"{np.max(np.abs(signed)):.1%}",
                    "bias": f"{np.mean(signed):+.1%}",
                    f"{confidence:.0%} coverage": f"{c['covered'].mean():.0%}",
                    "median half-width": f"{np.exp(np.median(c['half_width'])) - 1:.1%}"})
    return pd.DataFrame(out)


def family_table(residuals: pd.DataFrame, confidence: float = DEFAULT_CONFIDENCE
                 ) -> pd.DataFrame:
    """Per family and over all: rows, sources, the leave-one-source-out step-time error (mean
    and largest ``|predicted/measured − 1|``), the coverage of the ``confidence`` interval built
    without each row's source and its median half-width (as a ratio − 1): docs/costmodel.md's
    table (``python analysis/loso_residuals.py --table``), with the bias (mean signed error)."""
    out = []
    for r in family_numbers(residuals, confidence).itertuples():
        out.append({"family": r.family, "rows": r.rows, "sources": r.sources,
                    "mean error": f"{r.mean_error:.1%}", "max error": f"{r.max_error:.1%}",
                    "bias": f"{r.bias:+.1%}", f"{confidence:.0%} coverage": f"{r.coverage:.0%}",
                    "median half-width": f"{r.median_half_width:.1%}"})
    return pd.DataFrame(out)


def memory_group(tight: np.ndarray, peak_bytes: np.ndarray, capacity_bytes: float) -> np.ndarray:
    """Per layout, how sure the verdict is that it fits, the planner's ranking groups: 0 its
    whole memory interval fits, 1 tight (the interval straddles the device) with the point
    estimate within the device, 2 tight with the point estimate over it. One owner, because
    flm plan's order and --risk-aware's must agree on the groups."""
    tight = np.asarray(tight, dtype=bool)
    with np.errstate(invalid="ignore"):
        over = np.asarray(peak_bytes, dtype=float) > capacity_bytes
    return tight.astype(np.int8) + (tight & over).astype(np.int8)

