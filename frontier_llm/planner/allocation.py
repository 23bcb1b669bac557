"""Allocation planning: what a token budget costs on a layout, and which GPU count to ask for.

Pure functions over the planner's frames (docs/planner.md, "Planning an allocation"):

- :func:`parse_tokens`, :func:`parse_days`: a token budget (``2e13``, ``20T``, ``300B``) and a
  deadline (``45d``, ``12w``, ``36h``), refused in one line when absurd;
- :func:`training_flops`: the seed arithmetic, ``6 · parameters · tokens`` (Kaplan et al. 2020,
  eq. 2.1: forward and backward cost about 6 FLOPs per parameter and token);
- :func:`add_allocation`: steps, days, node-hours, GPU-hours and energy for each row of a plan
  frame, with the low/high ends of each from the step-time interval (planner/intervals.py);
- :func:`curve`: the best layout at each GPU count of a scaling curve;
- :func:`select_deadline`, :func:`select_budget`: the GPU count that finishes by a deadline for
  the fewest node-hours, or the fastest within a node-hour budget, and what would qualify when
  nothing does;
- :func:`min_gpus`: the smallest GPU count with any layout predicted to fit, and the largest
  micro-batch that fits at a count.
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


def select_deadline(cur: pd.DataFrame, deadline_days: float, end: str = "") -> Selection:
    """The row that trains within ``deadline_days`` for the fewest node-hours (ties: fewer
    GPUs). ``end`` '' judges by the prediction, '_high' by the pessimistic end of the
    interval. When none does, the message names the fastest row and what would qualify: more
    GPUs than the curve holds, or the tokens the fastest trains in time."""
    ok = _fitting(cur)
    days, hours = f"train_days{end}", f"node_hours{end}"
    if not len(ok):
        return Selection(None, _NOTHING_FITS)
    inside = ok[ok[days] <= deadline_days]
    if len(inside):
        best = inside.sort_values([hours, "gpus"]).iloc[0]
        return Selection(
            best,
            f"{int(best['gpus']):,} GPUs train in {best[days]:.1f} days "
            f"(deadline {deadline_days:g}) for {best[hours]:,.0f} node-hours, "
            f"the fewest of the {len(inside)} GPU counts that finish in time",
        )
    fastest = ok.sort_values([days, "gpus"]).iloc[0]
    share = deadline_days / fastest[days]
    return Selection(
        None,
        (
            f"nothing qualifies: the fastest, {int(fastest['gpus']):,} GPUs, needs "
            f"{fastest[days]:.1f} days for a {deadline_days:g}-day deadline; would need at least "
            f"{math.ceil(fastest['gpus'] / share):,} GPUs (the fastest's count scaled by "
            f"{1 / share:.2f}, at perfect scaling; --curve LO-HI plans further), or at most "
            f"{share * fastest['tokens']:.3g} tokens ({share:.0%} of the budget)"
        ),
    )


def select_budget(cur: pd.DataFrame, max_node_hours: float, end: str = "") -> Selection:
    """The fastest row within ``max_node_hours`` (ties: fewer node-hours). When none fits the
    budget, the message names the cheapest row and what would qualify: a larger budget, or the
    tokens the cheapest trains within it."""
    ok = _fitting(cur)
    days, hours = f"train_days{end}", f"node_hours{end}"
    if not len(ok):
        return Selection(None, _NOTHING_FITS)
    inside = ok[ok[hours] <= max_node_hours]
    if len(inside):
        best = inside.sort_values([days, hours]).iloc[0]
        return Selection(
            best,
            f"{int(best['gpus']):,} GPUs train in {best[days]:.1f} days for "
            f"{best[hours]:,.0f} node-hours (budget {max_node_hours:,.0f}), "
            f"the fastest of the {len(inside)} GPU counts within budget",
        )
    cheapest = ok.sort_values([hours, "gpus"]).iloc[0]
    share = max_node_hours / cheapest[hours]
    return Selection(
        None,
        (
            f"nothing qualifies: the cheapest, {int(cheapest['gpus']):,} GPUs, needs "
            f"{cheapest[hours]:,.0f} node-hours for a budget of {max_node_hours:,.0f}; would need "
            f"a budget of at least {cheapest[hours]:,.0f} node-hours, or at most "
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


def allocation_curve(
    model: ModelSpec,
    system: SystemSpec,
    counts: Iterable[int],
    tokens: float | None = None,
    confidence: float | None = None,
    space=None,
    on_count: Callable[[int], None] | None = None,
    global_batch: int | None = None,
) -> pd.DataFrame:
    """The best layout at each GPU count of ``counts`` with its intervals (``confidence``,
    default :data:`~frontier_llm.planner.intervals.DEFAULT_CONFIDENCE`) and, with ``tokens``,
    the budget's days, node-hours, GPU-hours and energy: what ``flm plan --curve`` prints,
    ``flm report plan`` draws and a notebook plots. ``on_count(i)`` after each count.
    ``global_batch`` None: each count's default (it grows with the count, planner.plan);
    a number: the same batch at every count (strong scaling)."""
    from frontier_llm.planner import intervals
    from frontier_llm.planner.plan import plan

    plans = []
    for i, n in enumerate(counts):
        plans.append(plan(model, system, int(n), global_batch, space))
        if on_count:
            on_count(i + 1)
    cur = curve(plans)
    cur = intervals.add_intervals(cur, system, confidence or intervals.DEFAULT_CONFIDENCE)
    if tokens is not None:
        cur = add_allocation(cur, system, model.seq_len, tokens)
    return cur
