"""The allocation report: time to train and node-hours against the GPU count for a token budget,
the best layout at each scale, with the error bands (docs/planner.md, "Planning an
allocation"). Pure: a curve (planner.allocation.allocation_curve) in, a table and a Figure out;
:func:`allocation_report` writes them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.transforms import blended_transform_factory

from frontier_llm.planner.allocation import format_tokens
from frontier_llm.report import style
from frontier_llm.report.figures import _gpu_axis, _log_axis
from frontier_llm.report.tables import write_table
from frontier_llm.specs.forms import row_label
from frontier_llm.specs.layout import layout_types

# The curve's columns a reader wants, in the Markdown table.
SHOWN = {
    "gpus": "GPUs",
    "nodes": "nodes",
    "layout": "best layout",
    "global_batch": "batch (seqs)",
    "batch_tokens": "batch (tokens)",
    "step_time_s": "step s",
    "mfu_pct": "MFU %",  # percent, as every table flm prints (the CSV keeps the fraction)
    "memory_verdict": "memory",
    "train_days": "days",
    "train_days_low": "days low",
    "train_days_high": "days high",
    "node_hours": "node-hours",
    "node_hours_low": "node-h low",
    "node_hours_high": "node-h high",
    "energy_mwh": "MWh",
}
# Whole numbers, kept whole where a count without a fitting layout leaves them empty.
_WHOLE = ("gpus", "nodes")
BAND = {"alpha": 0.22, "linewidth": 0}


def allocation_table(cur: pd.DataFrame) -> pd.DataFrame:
    """The Markdown table's rows: one per GPU count, the columns of :data:`SHOWN`."""
    cur = cur.copy()
    if "energy_kwh" in cur:
        cur["energy_mwh"] = cur["energy_kwh"] / 1e3
    if "mfu" in cur:
        cur["mfu_pct"] = (cur["mfu"].astype(float) * 100).round(1)
    for col in _WHOLE:
        if col in cur:
            cur[col] = pd.array(cur[col].to_numpy(float), dtype="Int64")
    # A count where no layout fits leaves NaN in the layout's integer columns, which made
    # them floats and the labels "tp2.0 pp32.0 dp1.0": whole numbers stay whole.
    for col, kind in layout_types().items():
        if kind is int and col in cur:
            cur[col] = pd.array(cur[col].to_numpy(float), dtype="Int64")
    if "batch_tokens" in cur:
        cur["batch_tokens"] = [format_tokens(n) if pd.notna(n) else "" for n in cur["batch_tokens"]]
    if "tp" in cur:  # the one label of the best layout; none where no layout fits
        cur["layout"] = [row_label(r) if pd.notna(r["tp"]) else "" for _, r in cur.iterrows()]
    if "memory_verdict" in cur:
        cur["memory_verdict"] = cur["memory_verdict"].replace("", None)
    cols = [c for c in SHOWN if c in cur]
    return cur[cols].rename(columns=SHOWN)


def _scale(values) -> tuple[float, str]:
    """A divisor and its word so that the largest value reads as a number below 1,000."""
    top = float(np.nanmax(np.asarray(values, float))) if len(values) else 0.0
    for div, word in ((1e9, "billion "), (1e6, "million "), (1e3, "thousand ")):
        if top >= div:
            return div, word
    return 1.0, ""


def plot_allocation(
    cur: pd.DataFrame,
    deadline_days: float | None = None,
    selected_gpus: int | None = None,
    gpu_label: str = "GPUs",
    title: str | None = None,
) -> Figure:
    """Two panels against the GPU count (log 2): days to train (log axis) and node-hours
    (linear from zero, so that the allocation's size reads directly), the predicted best
    layout's as a line with the interval as a band, the deadline as a horizontal line, the
    selected count circled, counts where no layout fits marked at the foot."""
    fig, (left, right) = style.new_figure(ncols=2, width=10.0, height=4.6)
    days = cur["train_days"] if "train_days" in cur else pd.Series(np.nan, index=cur.index)
    fits = cur["fits"].astype(bool).to_numpy() & days.notna().to_numpy()
    ok = cur[fits]
    conf = (
        float(cur["interval_confidence"].dropna().iloc[0])
        if "interval_confidence" in cur and cur["interval_confidence"].notna().any()
        else None
    )
    band_label = f"{conf:.0%} interval" if conf else "interval"
    div, word = _scale(ok["node_hours_high"]) if len(ok) else (1.0, "")
    for ax, col, unit, scale in (
        (left, "train_days", "days to train", 1.0),
        (right, "node_hours", f"{word}node-hours", div),
    ):
        ax.fill_between(
            ok["gpus"],
            ok[f"{col}_low"] / scale,
            ok[f"{col}_high"] / scale,
            color=style.PREDICTED["color"],
            label=band_label,
            **BAND,
        )
        ax.plot(
            ok["gpus"],
            ok[col] / scale,
            color=style.PREDICTED["color"],
            marker=style.PREDICTED["marker"],
            linestyle="-",
            label="predicted (best layout)",
        )
        if selected_gpus is not None and selected_gpus in set(ok["gpus"]):
            row = ok[ok["gpus"] == selected_gpus].iloc[0]
            ax.plot(
                [selected_gpus],
                [row[col] / scale],
                marker="o",
                markersize=13,
                markerfacecolor="none",
                markeredgecolor="#000000",
                markeredgewidth=1.5,
                linestyle="none",
                label="chosen: fewest node-hours, high end in time",
            )
        _gpu_axis(ax, cur["gpus"], gpu_label)
        # Many powers of two side by side: slanted labels do not run into each other.
        for tick in ax.get_xticklabels():
            tick.set_rotation(45)
            tick.set_horizontalalignment("right")
            tick.set_rotation_mode("anchor")
        ax.set_ylabel(unit)
        missing = cur[~fits]
        if len(missing):
            foot = blended_transform_factory(ax.transData, ax.transAxes)
            ax.plot(
                missing["gpus"],
                np.full(len(missing), 0.03),
                transform=foot,
                clip_on=False,
                **{**style.MISSING, "label": "no layout fits"},
            )
    left.set_yscale("log")
    _log_axis(left.yaxis)
    if len(ok):
        # Room under the lowest band (and the deadline) for the 'no layout fits' marks.
        values = [ok["train_days_low"].min(), ok["train_days_high"].max()]
        if deadline_days is not None:
            values.append(deadline_days)
        left.set_ylim(min(values) / 2.5, max(values) * 1.6)
        right.set_ylim(0, ok["node_hours_high"].max() / div * 1.1)
    if deadline_days is not None:
        left.axhline(
            deadline_days,
            color=style.FAILED["color"],
            linestyle="--",
            linewidth=1.3,
            label=f"deadline ({deadline_days:g} days)",
        )
        if selected_gpus is None and len(ok):
            left.annotate(
                "no GPU count meets the deadline",
                (0.98, deadline_days),
                xycoords=("axes fraction", "data"),
                xytext=(0, 5),
                textcoords="offset points",
                ha="right",
                va="bottom",
                fontsize=8.5,
                color=style.FAILED["color"],
            )
    left.set_title("time to train")
    right.set_title("allocation")
    for ax in (left, right):
        style.legend_outside(ax, ncols=2, gap=48)
    if title:
        fig.suptitle(title)
    return fig


def allocation_report(
    cur: pd.DataFrame,
    out: str | Path,
    name: str,
    title: str,
    notes: list[str],
    deadline_days: float | None = None,
    selected_gpus: int | None = None,
    gpu_label: str = "GPUs",
) -> list[Path]:
    """NAME.csv (every column of the curve), NAME.md (the main ones and ``notes``), NAME.png
    and NAME.pdf (:func:`plot_allocation`) in ``out``."""
    fig = plot_allocation(cur, deadline_days, selected_gpus, gpu_label, title)
    paths = write_table(cur, allocation_table(cur), out, name, title, notes)
    return paths + style.save(fig, out, name)
