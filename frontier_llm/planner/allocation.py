"""Allocation planning: what a token budget costs on a layout, and which GPU count to ask for.

Pure functions over the planner's frames (docs/planner.md, "Planning an allocation"):

- :func:`parse_tokens`, :func:`parse_days`: a token budget (``2e13``, ``20T``, ``300B``) and a
  deadline (``45d``, ``12w``, ``36h``), refused in one line when absurd;
- :func:`training_flops`: the seed arithmetic, ``6 · parameters · tokens`` (Kaplan et al. 2020,
  eq. 2.1: forward and backward cost about 6 FLOPs per parameter and token);
- :func:`add_allocation`: steps, days, node-hours, GPU-hours and energy for each row of a plan
  frame, with the low/high ends of each from the step-time interval (planner/intervals.py);
- :func:`curve`, :func:`allocation_curve`: the best layout at each GPU count of a scaling
  curve, at one global batch in tokens for the whole curve unless asked otherwise;
- :func:`select_deadline`, :func:`select_budget`: the GPU count that finishes by a deadline for
  the fewest node-hours, or the fastest within a node-hour budget, and what would qualify when
  nothing does;
- :func:`min_gpus`: the smallest GPU count with any layout predicted to fit, and the largest
  micro-batch that fits at a count;
- :func:`batch_note`, :func:`rests_on`: the lines that say what an answer assumed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from frontier_llm.errors import UserError
from frontier_llm.planner.plan import Plan
from frontier_llm.specs import axes
from frontier_llm.specs.layout import MAX_GPUS
from frontier_llm.specs.model import ModelSpec
from frontier_llm.specs.system import SystemSpec

# The largest published pre-training runs are tens of trillions of tokens (Llama 3: 15T); a
# thousand times that is a typing mistake, not a plan.
MAX_TOKENS = 1e16
# Ten years: a longer deadline is a typing mistake.
MAX_DAYS = 3650.0
SECONDS_PER_DAY = 86400.0
_SUFFIX = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12, "p": 1e15}
_TOKENS = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMbBgGtTpP]?)\s*$")
_DAYS = {"": 1.0, "d": 1.0, "h": 1 / 24, "w": 7.0}
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([dDhHwW]?)\s*$")
# The figures a token budget adds, each with a low/high end from the step-time interval.
ALLOCATION_FIGURES = ("train_days", "node_hours", "gpu_hours", "energy_kwh")


def parse_tokens(text: str) -> float:
    """Tokens from ``2e13``, ``20T``, ``300B``, ``1.5M`` (K, M, B or G, T, P: powers of 1,000).
    Raises ValueError with a one-line reason for anything else, zero, negative or more than
    :data:`MAX_TOKENS`."""
    match = _TOKENS.match(str(text))
    if not match:
        raise ValueError(f"expected a token count such as 2e13, 20T or 300B, got {text!r}")
    value = float(match.group(1)) * _SUFFIX[match.group(2).lower()]
    if not math.isfinite(value) or not 1 <= value <= MAX_TOKENS:
        raise ValueError(f"the token count must be between 1 and {MAX_TOKENS:.0e} (got {text})")
    return value


def parse_days(text: str) -> float:
    """A duration in days from ``45d``, ``12w``, ``36h`` or a bare number of days. Raises
    ValueError with a one-line reason for anything else, zero, negative or over
    :data:`MAX_DAYS`."""
    match = _DURATION.match(str(text))
    if not match:
        raise ValueError(f"expected a duration such as 45d, 12w or 36h, got {text!r}")
    value = float(match.group(1)) * _DAYS[match.group(2).lower()]
    if not math.isfinite(value) or not 0 < value <= MAX_DAYS:
        raise ValueError(
            f"the duration must be above 0 and at most {MAX_DAYS:,.0f} days (got {text})"
        )
    return value


def format_tokens(tokens: float) -> str:
    """2e13 -> '20T', 3e11 -> '300B', 4194304 -> '4.19M' (the way budgets are spoken of)."""
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M")):
        if tokens >= div:
            return f"{tokens / div:.3g}{suffix}"
    return f"{tokens:,.0f}"


def training_flops(params: float, tokens: float) -> float:
    """Model FLOPs to train ``params`` parameters on ``tokens`` tokens: 6·N·D (Kaplan et al.
    2020, eq. 2.1; forward 2·N, backward 4·N per token, attention neglected)."""
    return 6.0 * params * tokens


def nodes_for(gpus, gpus_per_node: int):
    """Whole nodes a job of ``gpus`` GPUs is charged for (a partial node is a whole node)."""
    return np.ceil(np.asarray(gpus, dtype=float) / gpus_per_node)


def add_allocation(
    frame: pd.DataFrame, system: SystemSpec, seq_len: int, tokens: float
) -> pd.DataFrame:
    """``frame`` (rows with the layout's degrees, ``global_batch``, ``step_time_s``, and
    ``step_time_s_low/_high`` when intervals were added) with the cost of ``tokens`` tokens:
    ``steps`` (whole iterations of ``global_batch · seq_len`` tokens), ``train_days``,
    ``node_hours`` (whole nodes), ``gpu_hours``, ``energy_kwh`` (the system's ``power``, NaN
    where it states none), each with ``_low``/``_high`` from the step-time interval. A new
    frame; ``frame`` is not changed."""
    out = frame.copy()
    gpus = out["gpus"].to_numpy(float) if "gpus" in out else axes.frame_world_size(out)
    nodes = nodes_for(gpus, system.gpus_per_node)
    tokens_per_step = out["global_batch"].to_numpy(float) * seq_len
    steps = np.ceil(tokens / tokens_per_step)
    out["tokens"] = tokens
    out["steps"] = _whole(steps)
    out["nodes"] = _whole(nodes)
    if system.power is not None:
        p = system.power
        # The GPUs of the job draw their share; the host of every node charged draws in full.
        watts = p.utilisation * p.device_w * gpus + p.host_w * nodes
    else:
        watts = np.full(len(out), np.nan)
    for end in ("", "_low", "_high"):
        if f"step_time_s{end}" not in out:
            continue
        seconds = steps * out[f"step_time_s{end}"].to_numpy(float)
        out[f"train_days{end}"] = seconds / SECONDS_PER_DAY
        out[f"node_hours{end}"] = nodes * seconds / 3600.0
        out[f"gpu_hours{end}"] = gpus * seconds / 3600.0
        out[f"energy_kwh{end}"] = watts * seconds / 3.6e6
    return out


def _whole(values: np.ndarray) -> list:
    """Whole numbers as Python ints (None where NaN: a curve's count where nothing fits)."""
    return [int(v) if np.isfinite(v) else None for v in values]


def power_note(system: SystemSpec) -> str:
    """One line saying what the energy figures assume."""
    p = system.power
    if p is None:
        return f"energy: {system.name} states no power figures (its YAML has no power: key)"
    return (
        f"energy: {p.utilisation:.0%} of {p.device_w:g} W per GPU + {p.host_w:g} W per node "
        f"host = {p.node_w(system.gpus_per_node) / 1e3:.2f} kW a full node "
        f"(utilisation assumed; sources in {system.name}'s YAML)"
    )


# --- the scaling curve ----------------------------------------------------------------------
def power_of_two_counts(lo: int, hi: int) -> list[int]:
    """Every power of two from ``lo`` to ``hi`` (both rounded up to a power of two)."""
    if not 1 <= lo <= hi <= MAX_GPUS:
        raise UserError(
            f"a curve's GPU counts must satisfy 1 <= LO <= HI <= {MAX_GPUS:,} (got {lo}-{hi})"
        )
    first = 1 << max(0, math.ceil(math.log2(lo)))
    out = []
    while first <= hi:
        out.append(first)
        first *= 2
    return out


def curve(plans: Iterable[Plan], pick: Callable[[Plan], int | None] | None = None) -> pd.DataFrame:
    """The best layout at each GPU count: one row per plan (its ``gpus``), the row ``pick``
    chooses (default: the plan's fastest that fits), with ``rank`` dropped. A count where no
    layout fits has a row with ``fits`` False and NaN figures, so that the curve shows where
    the model stops fitting."""
    rows = []
    for p in plans:
        i = pick(p) if pick else _fastest(p)
        if i is None:
            rows.append(
                pd.DataFrame({"gpus": [p.gpus], "global_batch": [p.global_batch], "fits": [False]})
            )
            continue
        row = p.frame(np.array([i]))
        row.insert(0, "gpus", p.gpus)
        rows.append(row)
    if not rows:
        return pd.DataFrame()
    return pd.concat(rows, ignore_index=True)


def _fastest(p: Plan) -> int | None:
    order = p.order()
    return int(order[0]) if len(order) else None


# --- selections -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Selection:
    """A chosen curve row (None when nothing qualifies) and one line saying why."""

    row: pd.Series | None
    message: str


def _fitting(cur: pd.DataFrame) -> pd.DataFrame:
    need = ("train_days", "node_hours")
    missing = [c for c in need if c not in cur]
    if missing:
        raise UserError(
            f"a deadline or node-hour budget needs --tokens (the curve has no {', '.join(missing)})"
        )
    return cur[cur["fits"].astype(bool) & cur["train_days"].notna()]


# What deadline and budget selection say when no GPU count of the curve has a fitting layout.
_NOTHING_FITS = ("nothing qualifies: no GPU count of the curve has a layout that fits in "
                 "memory; would need more GPUs (see --min-gpus)")


def _end(cur: pd.DataFrame, end: str | None) -> str:
    """The figures a verdict judges: ``end`` as given, or (None) the interval's high end where
    the curve has intervals, else the point estimate."""
    if end is not None:
        return end
    return "_high" if "train_days_high" in cur and "node_hours_high" in cur else ""


def _spread(row: pd.Series, figure: str, fmt: str) -> str:
    """`` (LOW-HIGH)`` of ``figure`` when the row has its interval, else nothing."""
    lo, hi = row.get(f"{figure}_low"), row.get(f"{figure}_high")
    if lo is None or hi is None or not (np.isfinite(lo) and np.isfinite(hi)):
        return ""
    return f" ({lo:{fmt}}-{hi:{fmt}})"


def _judged(end: str) -> str:
    return (" (judged on the interval's high end)" if end == "_high"
            else " (judged on the point estimate)" if end == "" else "")


def select_deadline(cur: pd.DataFrame, deadline_days: float, end: str | None = None) -> Selection:
    """The row that trains within ``deadline_days`` for the fewest node-hours (ties: fewer
    GPUs). ``end`` '_high' judges by the pessimistic end of the interval, '' by the point
    estimate; None (default): the high end where the curve has intervals. A proposal that
    meets its deadline only by the point estimate misses it about half the time. The message
    gives the point estimate and the interval, and, when the point estimate alone would have
    chosen a cheaper count, that count. When none qualifies, the message names the fastest row
    and what would qualify: more GPUs than the curve holds, or the tokens the fastest trains in
    time."""
    ok = _fitting(cur)
    end = _end(cur, end)
    days, hours = f"train_days{end}", f"node_hours{end}"
    if not len(ok):
        return Selection(None, _NOTHING_FITS)
    inside = ok[ok[days] <= deadline_days]
    if len(inside):
        best = inside.sort_values([hours, "gpus"]).iloc[0]
        message = (
            f"{int(best['gpus']):,} GPUs train in {best['train_days']:.1f} days"
            f"{_spread(best, 'train_days', '.1f')} for {best['node_hours']:,.0f} node-hours"
            f"{_spread(best, 'node_hours', ',.0f')}, the fewest of the {len(inside)} GPU "
            + (f"counts whose interval's high end meets the {deadline_days:g}-day deadline"
               if end == "_high" else
               f"counts that finish by the {deadline_days:g}-day deadline{_judged(end)}")
        )
        if end:
            point = ok[ok["train_days"] <= deadline_days].sort_values(["node_hours", "gpus"])
            if len(point) and int(point.iloc[0]["gpus"]) != int(best["gpus"]):
                other = point.iloc[0]
                message += (
                    f"; by the point estimate alone {int(other['gpus']):,} GPUs would do "
                    f"({other['train_days']:.1f} days, but up to {other[days]:.1f})"
                )
        return Selection(best, message)
    fastest = ok.sort_values([days, "gpus"]).iloc[0]
    share = deadline_days / fastest[days]
    return Selection(
        None,
        (
            f"nothing qualifies{_judged(end)}: the fastest, {int(fastest['gpus']):,} GPUs, needs "
            f"{fastest[days]:.1f} days for a {deadline_days:g}-day deadline; would need at least "
            f"{math.ceil(fastest['gpus'] / share):,} GPUs (the fastest's count scaled by "
            f"{1 / share:.2f}, at perfect scaling; --curve LO-HI plans further), or at most "
            f"{share * fastest['tokens']:.3g} tokens ({share:.0%} of the budget)"
        ),
    )


def select_budget(cur: pd.DataFrame, max_node_hours: float, end: str | None = None
                  ) -> Selection:
    """The fastest row within ``max_node_hours`` (ties: fewer node-hours), judged as
    :func:`select_deadline` judges (default: the interval's high end). When none fits the
    budget, the message names the cheapest row and what would qualify: a larger budget, or the
    tokens the cheapest trains within it."""
    ok = _fitting(cur)
    end = _end(cur, end)
    days, hours = f"train_days{end}", f"node_hours{end}"
    if not len(ok):
        return Selection(None, _NOTHING_FITS)
    inside = ok[ok[hours] <= max_node_hours]
    if len(inside):
        best = inside.sort_values([days, hours]).iloc[0]
        return Selection(
            best,
            f"{int(best['gpus']):,} GPUs train in {best['train_days']:.1f} days"
            f"{_spread(best, 'train_days', '.1f')} for {best['node_hours']:,.0f} node-hours"
            f"{_spread(best, 'node_hours', ',.0f')} (budget {max_node_hours:,.0f}), "
            f"the fastest of the {len(inside)} GPU counts within budget{_judged(end)}",
        )
    cheapest = ok.sort_values([hours, "gpus"]).iloc[0]
    share = max_node_hours / cheapest[hours]
    return Selection(
        None,
        (
            f"nothing qualifies{_judged(end)}: the cheapest, {int(cheapest['gpus']):,} GPUs, "
            f"needs {cheapest[hours]:,.0f} node-hours for a budget of {max_node_hours:,.0f}; "
            f"would need a budget of at least {cheapest[hours]:,.0f} node-hours, or at most "
            f"{share * cheapest['tokens']:.3g} tokens ({share:.0%} of the budget)"
        ),
    )


# --- the smallest machine -----------------------------------------------------------------
def min_gpus(plan_at: Callable[[int], Plan], counts: Iterable[int]) -> Plan | None:
    """The plan at the smallest of ``counts`` (increasing) with any layout predicted to fit, or
    None. Counts are tried in order and the search stops at the first that fits: a model
    that fits on N GPUs is not assumed to fit on more (the global batch changes with N)."""
    for n in counts:
        p = plan_at(n)
        if len(p.order()):
            return p
    return None


def largest_micro_batch(p: Plan) -> pd.DataFrame:
    """Per engine, the largest micro-batch with a layout that fits in ``p``, and the fastest such
    layout (one row per engine, empty when nothing fits)."""
    order = p.order()
    if not len(order):
        return pd.DataFrame()
    frame = p.frame(order)
    frame["engine"] = frame["engine"].astype(str)
    best = frame.sort_values("micro_batch", ascending=False, kind="stable")
    return best.groupby("engine", sort=False, observed=True).head(1).reset_index(drop=True)


def curve_global_batch(model: ModelSpec, counts: Iterable[int]) -> int:
    """One global batch (sequences) for a whole curve: the planner's default at the curve's
    largest count (planner.plan.default_global_batch: 4M tokens rounded up to whole sequences
    and to a multiple of the largest divisor of that count not above them; exactly 4M tokens
    at a power-of-two sequence length and power-of-two counts). Every count then trains the
    same tokens a step, so the curve compares GPU counts on one training run."""
    from frontier_llm.planner.plan import default_global_batch

    return default_global_batch(model, max(int(n) for n in counts))


def growing_global_batch(model: ModelSpec, gpus: int) -> int:
    """The batch that grows with the GPU count (``--grow-batch``): the smallest multiple of
    ``gpus`` holding 4M tokens, so that every data-parallel degree divides it. Past the
    critical batch size it buys fewer steps than it costs (:data:`CRITICAL_BATCH_CAVEAT`)."""
    from frontier_llm.planner.plan import DEFAULT_BATCH_TOKENS

    sequences = math.ceil(DEFAULT_BATCH_TOKENS / model.seq_len)
    return gpus * math.ceil(sequences / gpus)


# Why a curve keeps its batch: the token budget is trained in fewer steps with a larger batch
# only up to the critical batch size; beyond it the steps needed fall more slowly than the
# batch grows (McCandlish et al. 2018, "An Empirical Model of Large-Batch Training", arXiv
# 1812.06162, §2-3), and that size depends on the loss reached (Kaplan et al. 2020, "Scaling
# Laws for Neural Language Models", arXiv 2001.08361, §5.1). The planner does not model it.
CRITICAL_BATCH_CAVEAT = (
    "more tokens a step only shorten training below the critical batch size (McCandlish et al. "
    "2018, arXiv 1812.06162; Kaplan et al. 2020, arXiv 2001.08361 s5.1), which this plan does "
    "not model"
)


def batch_note(cur: pd.DataFrame, seq_len: int, grown: bool) -> str:
    """One line on the global batch of a curve: fixed or growing, in sequences and tokens."""
    batches = sorted({int(b) for b in cur["global_batch"].dropna()})
    if not batches:
        return "global batch: none (no GPU count was planned)"
    if not grown and len(batches) == 1:
        b = batches[0]
        return (
            f"global batch: {b:,} sequences = {b * seq_len / 1e6:.3g}M tokens at every GPU "
            "count (4M tokens rounded up to whole sequences splittable over the largest "
            "count; flm plan --global-batch sets another); flm plan --grow-batch lets it grow "
            f"with the GPU count, but {CRITICAL_BATCH_CAVEAT}"
        )
    lo, hi = batches[0], batches[-1]
    if lo == hi:
        return (
            f"global batch: {lo:,} sequences = {lo * seq_len / 1e6:.3g}M tokens at every GPU "
            "count (--grow-batch: each count's smallest multiple holding 4M tokens; no count "
            "here has more GPUs than that batch has sequences)"
        )
    return (
        f"global batch: grows with the GPU count, {lo:,} to {hi:,} sequences = "
        f"{lo * seq_len / 1e6:.3g}M to {hi * seq_len / 1e6:.3g}M tokens a step (--grow-batch); "
        f"the days at large counts are optimistic: {CRITICAL_BATCH_CAVEAT}"
    )


def rests_on(system: SystemSpec) -> str:
    """One line saying what the system's predictions rest on: how many published runs of its
    own the calibration holds, which knobs are fitted, anchored on a published figure or
    assumed (read from the sources its YAML gives each knob), and where its interval's width
    comes from."""
    from frontier_llm.planner.intervals import load_residuals, system_class, usable

    cls = system_class(system)
    kinds: dict[str, list[str]] = {}
    for name, knob in system.efficiency.items():
        kind = knob.source.split(":", 1)[0].strip().lower() if ":" in knob.source else "stated"
        kinds.setdefault(kind, []).append(name)
    assumed = kinds.get("assumed", [])
    tail = f"; assumed: {', '.join(assumed)}" if assumed else ""
    if cls == "calibrated":
        n = len(system.prediction_error.log_residuals)
        return (
            f"rests on: {system.name} calibrated on measured runs (flm calibrate --from-runs; "
            f"its interval from {n} held-out runs){tail}"
        )
    runs = int((usable(load_residuals())["system"] == system.name).sum())
    if cls == "fitted":
        return (
            f"rests on: {system.name} fitted to its {runs} published runs in "
            f"frontier_llm/planner/data/calibration_runs*.csv (fitted: "
            f"{', '.join(kinds.get('fitted', [])) or 'none'}){tail}; interval from the "
            "engine family's error on sources left out of the fit"
        )
    anchored = [
        f"{name}: {system.efficiency[name].source.split(':', 1)[1].strip()}"
        for name in kinds.get("anchored", [])
    ]
    count = {1: "one published figure", 0: "no published figure"}.get(
        len(anchored), f"{len(anchored)} published figures")
    own = "no published run of its own" if runs == 0 else f"{runs} published run(s) of its own"
    head = (f"rests on: {system.name} is anchored on {count}"
            + (f" ({'; '.join(anchored)})" if anchored else "")
            + f" and has {own} in the calibration set{tail}")
    kin = same_gpu_rows(system)
    if len(kin):
        # Rows ran on this GPU (LUMI-G's and, for Frontier, the same MI250X GCDs): a layout of
        # their family rests on their residuals, and a family with too few of them on the
        # quantile of all of them, every engine's (planner/intervals.py reference_pool).
        return (head + f"; its intervals rest on the {system.gpu}'s {gpu_rows_text(kin)}, left out "
                "source by source: a family's own where it has enough, else these rows' "
                "quantile across engines; measure runs and refit (flm calibrate --from-runs)")
    return (
        head + "; its interval is at least the error "
        "on sources left out of the fit across engines and systems, which may understate it "
        "here: measure runs and refit (flm calibrate --from-runs)"
    )


def gpu_rows_text(kin) -> str:
    """``kin`` (:func:`same_gpu_rows`) in words: how many, on which systems, of which families
    and sources ("14 published runs (14 on lumi-g; deepspeed@amd 13, megatron@amd 1; ...)")."""
    if not len(kin):
        return "no published run"
    where = ", ".join(f"{n} on {s}" for s, n in kin.groupby("system").size().items())
    fams = ", ".join(f"{f} {n}" for f, n in kin.groupby("family").size().items())
    return (f"{len(kin)} published runs ({where}; {fams}; "
            f"{', '.join(sorted(kin['source'].unique()))})")


def same_gpu_rows(system: SystemSpec):
    """The usable calibration rows that ran on ``system``'s GPU, on it or on another system
    with that GPU (Frontier: LUMI-G's)."""
    from frontier_llm.planner.intervals import gpu_rows, load_residuals, usable

    return gpu_rows(usable(load_residuals()), system.gpu)


def allocation_curve(
    model: ModelSpec,
    system: SystemSpec,
    counts: Iterable[int],
    tokens: float | None = None,
    confidence: float | None = None,
    space=None,
    on_count: Callable[[int], None] | None = None,
    global_batch: int | None = None,
    grow_batch: bool = False,
    eager: bool = False,
    overlap_comm: bool = True,
    tp_comm_overlap: bool = False,
    moe_run=None,
    cp_exchange: str | None = None,
    p2p_overlap: bool = False,
) -> pd.DataFrame:
    """The best layout at each GPU count of ``counts`` with its intervals (``confidence``,
    default :data:`~frontier_llm.planner.intervals.DEFAULT_CONFIDENCE`) and, with ``tokens``,
    the budget's days, node-hours, GPU-hours and energy: what ``flm plan --curve`` prints,
    ``flm report plan`` draws and a notebook plots. ``on_count(i)`` after each count.
    The global batch is the same at every count: ``global_batch`` sequences, or (None)
    :func:`curve_global_batch`; ``grow_batch``: each count's :func:`growing_global_batch`
    instead (weak scaling; :data:`CRITICAL_BATCH_CAVEAT`). Each row carries its
    ``global_batch`` and ``batch_tokens``. ``eager``: element-wise work priced as un-compiled
    PyTorch runs it, ``overlap_comm`` False DeepSpeed's ZeRO-1/2 reductions not overlapped,
    ``tp_comm_overlap`` Megatron-LM's ``--tp-comm-overlap``, ``moe_run`` an MoE run's
    dispatch and overlap (None: none overlapped), ``cp_exchange`` the native engine's
    context-parallel exchange (None: the engine's rule), ``p2p_overlap`` an interleaved
    Megatron schedule's sends overlapped with compute (:func:`~frontier_llm.planner.plan.plan`)."""
    from frontier_llm.planner import intervals
    from frontier_llm.planner.plan import plan

    counts = [int(n) for n in counts]
    fixed = None if grow_batch else (global_batch or curve_global_batch(model, counts))
    plans = []
    for i, n in enumerate(counts):
        plans.append(plan(model, system, n, fixed or growing_global_batch(model, n), space,
                          eager=eager, overlap_comm=overlap_comm,
                          tp_comm_overlap=tp_comm_overlap, cp_exchange=cp_exchange,
                          p2p_overlap=p2p_overlap,
                          **({"moe_run": moe_run} if moe_run is not None else {})))
        if on_count:
            on_count(i + 1)
    cur = curve(plans)
    cur["batch_tokens"] = cur["global_batch"].astype(float) * model.seq_len
    cur = intervals.add_intervals(cur, system, confidence or intervals.DEFAULT_CONFIDENCE)
    if tokens is not None:
        cur = add_allocation(cur, system, model.seq_len, tokens)
    return cur
