"""What ``flm plan``, ``flm predict`` and the Python API add to the planner's answer: the
intervals every prediction carries, a token budget's days, node-hours and energy, the
risk-aware order, and which questions about an allocation cannot be answered (docs/planner.md,
"Planning an allocation").

Typed arguments, no command line: ``cli/allocation.py`` reads flags into these calls and prints
what they return, ``api.py`` calls them with its keywords. The arithmetic is
planner/allocation.py's and planner/intervals.py's.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from frontier_llm.planner import allocation as alloc
from frontier_llm.planner.intervals import DEFAULT_CONFIDENCE, add_intervals, memory_group
from frontier_llm.specs.forms import layout_record
from frontier_llm.specs.layout import Layout
from frontier_llm.specs.model import ModelSpec
from frontier_llm.specs.system import SystemSpec

DEFAULT_CURVE = "auto"  # powers of two from one node's GPUs to CURVE_TOP
CURVE_TOP = 65536
# Keys flm predict adds (JSON), beside its own.
PREDICT_KEYS = ("interval_confidence", "memory_verdict", "interval_basis",
                "memory_interval_basis", "tokens", "steps", "nodes")


def annotate(frame: pd.DataFrame, model: ModelSpec, system: SystemSpec, *,
             confidence: float = DEFAULT_CONFIDENCE, tokens: float | None = None,
             risk_aware: bool = False, top: int | None = None) -> pd.DataFrame:
    """Intervals (always), the token budget's figures (with ``tokens``), the risk-aware order
    (with ``risk_aware``; then the first ``top`` rows)."""
    # An MoE model's layouts at ep 1 are no better calibrated than its ep > 1 ones.
    out = add_intervals(frame, system, confidence, moe=model.is_moe) if len(frame) else frame
    if tokens is not None and len(out):
        out = alloc.add_allocation(out, system, model.seq_len, tokens)
    if risk_aware and len(out):
        # Rank by the low end of throughput within the plan's memory groups, so a tight layout
        # never goes before one that fits (sorting on the point estimate's ``fits`` put a
        # tight layout predicted under the device among those that fit).
        out = out.assign(_group=memory_groups(out, system)).sort_values(
            ["_group", "tokens_per_s_low"], ascending=[True, False], kind="stable"
        )
        out = out.drop(columns="_group").head(top).reset_index(drop=True)
        if "rank" in out:
            out["rank"] = np.arange(1, len(out) + 1)
    return out


def memory_groups(frame: pd.DataFrame, system: SystemSpec) -> np.ndarray:
    """Per row, the plan's memory groups (intervals.memory_group): 0 its memory interval
    fits, 1 tight (``memory_tight``: the interval straddles the device) with the point estimate
    within the device, 2 tight with it over; then 3 for a row that is not tight yet over the
    device (a layout that does not fit, ranked with --include-oom) or has no prediction."""
    peak = frame["peak_memory_bytes"].to_numpy(float)
    if "memory_tight" in frame:
        tight = frame["memory_tight"].eq(True).to_numpy()
    else:  # a frame without the plan's verdict: the intervals' own
        tight = frame.get("memory_verdict", pd.Series("", index=frame.index)).eq(
            "tight").to_numpy()
    with np.errstate(invalid="ignore"):
        over = peak > system.memory_bytes
    return np.where((~tight & over) | np.isnan(peak), 3,
                    memory_group(tight, peak, system.memory_bytes))


def predict_extras(out: dict, layout: Layout, model: ModelSpec, system: SystemSpec, *,
                   confidence: float = DEFAULT_CONFIDENCE,
                   tokens: float | None = None) -> dict:
    """flm predict's intervals (and, with ``tokens``, the budget's figures) for one layout."""
    row = pd.DataFrame([{**layout_record(layout), "step_time_s": out["step_time_s"],
                         "tokens_per_s": out["tokens_per_s"],
                         "peak_memory_bytes": out["peak_memory_bytes"], "fits": out["fits"]}])
    row = annotate(row, model, system, confidence=confidence, tokens=tokens).iloc[0]
    keep = [k for k in row.index
            if k.endswith(("_low", "_high")) or k in PREDICT_KEYS or k in alloc.ALLOCATION_FIGURES]
    return {k: row[k].item() if hasattr(row[k], "item") else row[k] for k in keep}


def allocation_refusal(*, tokens: float | None, deadline_days: float | None,
                       max_node_hours: float | None, global_batch: int | None = None,
                       grow_batch: bool = False, curve: bool = False,
                       risk_aware: bool = False,
                       names: dict[str, str] | None = None) -> str | None:
    """One line for an allocation question that cannot be answered, else None. ``names``: how
    the asker spells each setting (the command line's flags by default)."""
    n = {"tokens": "--tokens", "deadline_days": "--deadline", "max_node_hours":
         "--max-node-hours", "global_batch": "--global-batch", "grow_batch": "--grow-batch",
         "curve": "--curve", "risk_aware": "--risk-aware", "one_count": "--gpus N", **(names or {})}
    if (deadline_days is not None or max_node_hours is not None) and tokens is None:
        return (f"{n['deadline_days']} and {n['max_node_hours']} need {n['tokens']} (the "
                "budget to train)")
    if deadline_days is not None and max_node_hours is not None:
        return f"give {n['deadline_days']} or {n['max_node_hours']}, not both"
    if grow_batch and global_batch is not None:
        return (f"give {n['global_batch']} (one batch for the whole curve) or "
                f"{n['grow_batch']}, not both")
    wants_curve = curve or deadline_days is not None or max_node_hours is not None
    if grow_batch and not wants_curve:
        return (f"{n['grow_batch']} needs {n['curve']}, {n['deadline_days']} or "
                f"{n['max_node_hours']}")
    # The curve keeps each count's best by its point estimate (and prices the budget on it):
    # accepting the flag there would answer another question than the one asked.
    if risk_aware and wants_curve:
        return (f"{n['risk_aware']} ranks one GPU count's layouts by the low end of their "
                f"throughput; the curve ({n['curve']}, {n['deadline_days']}, "
                f"{n['max_node_hours']}) takes each count's fastest by its point estimate: drop "
                f"{n['risk_aware']}, or rank one count with {n['one_count']}")
    return None


def curve_counts(system: SystemSpec, gpus: tuple[int, int] | None = None) -> list[int]:
    """The power-of-two GPU counts of a curve from ``gpus = (lo, hi)`` (default: one node's
    GPUs to CURVE_TOP)."""
    lo, hi = gpus if gpus is not None else (system.gpus_per_node, CURVE_TOP)
    return alloc.power_of_two_counts(lo, hi)
