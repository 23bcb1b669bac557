"""Figures from the report's tables (pure: a table in, a matplotlib Figure out; saving is
:func:`frontier_llm.report.style.save`). Every figure uses :mod:`frontier_llm.report.style`."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter, NullLocator
from matplotlib.transforms import blended_transform_factory

from frontier_llm.costmodel import MEMORY_PARTS
from frontier_llm.report import style


def _gpu_axis(ax, gpus, label: str) -> None:
    ax.set_xscale("log", base=2)
    ticks = sorted({int(g) for g in gpus})
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{int(v):,}"))
    ax.set_xlabel(label)
    if len(ticks) > 1:
        lo, hi = ticks[0], ticks[-1]
        ax.set_xlim(lo / 1.3, hi * 1.3)


def _log_axis(axis) -> None:
    """Log scale labelled 1, 2, 5 x 10^k in plain numbers (0.05, 200), no minor labels."""
    axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _memory_unit(values_gb) -> tuple[float, str]:
    """GB, or MB when every value is under 1 GB (tiny test models)."""
    v = np.asarray(values_gb, float)
    top = np.nanmax(v) if np.isfinite(v).any() else 0.0
    return (1e3, "MB") if top < 1.0 else (1.0, "GB")


def _status_marks(ax, table: pd.DataFrame) -> None:
    """Failed and missing points at the foot of the efficiency panel (where efficiencies near
    zero would be, rarely data), at their GPU count: shown and counted, not dropped."""
    foot = blended_transform_factory(ax.transData, ax.transAxes)
    failed = table[table["not_completed"] > 0] if "not_completed" in table else table[:0]
    missing = table[table["runs"] == 0] if "runs" in table else table[:0]
    if "measured_efficiency_pct" not in table:
        missing = missing[:0]  # a predicted-only report has no runs by design
    for rows, kind, fmt in ((failed, style.FAILED, "{} not completed"),
                            (missing, style.MISSING, "missing")):
        if len(rows):
            ax.plot(rows["gpus"], np.full(len(rows), 0.05), transform=foot, clip_on=False,
                    **kind)
            for r in rows.itertuples():
                ax.annotate(fmt.format(getattr(r, "not_completed", 0)), (r.gpus, 0.05),
                            xycoords=foot, xytext=(7, 0), textcoords="offset points",
                            va="center", fontsize=8, color=kind["color"])


def plot_scaling(table: pd.DataFrame, gpu_label: str = "GPUs", title: str | None = None,
                 published: pd.DataFrame | None = None) -> Figure:
    """Per series one row of two panels: left the throughput per GPU (weak scaling) or the step
    time (strong scaling) against the GPU count with the ideal line, right the efficiency in
    percent with the 100 % line; measured (median, bars = fastest..slowest repeat) and
    predicted together. ``published`` (columns model, mode, gpus, efficiency_pct) adds
    published efficiencies to the series of the same model and mode."""
    series = list(table.groupby("series", sort=False))
    fig = style.new_canvas(width=10.0, height=3.9 * len(series) + (0.4 if title else 0))
    rows = fig.subfigures(len(series), 1, squeeze=False).ravel() if len(series) > 1 else [fig]
    measured = "measured_efficiency_pct" in table
    predicted = "predicted_efficiency_pct" in table
    for row_fig, (name, t) in zip(rows, series, strict=True):
        left, right = row_fig.subplots(1, 2)
        if t["gpus"].nunique() < 2:
            _single_point(row_fig, left, right, name, t, gpu_label, measured, predicted)
            continue
        mode = t["mode"].iloc[0]
        base_n = t["base_gpus"].iloc[0]
        one = gpu_label.split(" ")[0]
        one = one[:-1] if one.endswith("s") else one  # "GCDs" -> "GCD"
        if mode == "weak":
            col, pcol = "tokens_per_s_per_gpu", "predicted_tokens_per_s_per_gpu"
            lo, hi = "tokens_per_s_per_gpu_min", "tokens_per_s_per_gpu_max"
            left.set_ylabel(f"throughput per {one} (tokens/s)")
            left.set_title(f"throughput per {one} (flat = ideal)", loc="left")
        else:
            col, pcol = "step_time_s", "predicted_step_time_s"
            lo, hi = "step_time_min_s", "step_time_max_s"
            left.set_ylabel("step time (s)")
            left.set_yscale("log")
            _log_axis(left.yaxis)
            left.set_title(f"step time (ideal: halves as {one}s double)", loc="left")
        ref_col = col if measured else pcol
        base = t.loc[t["gpus"] == base_n, ref_col]
        if len(base) and np.isfinite(base.iloc[0]):
            n = t["gpus"].to_numpy(float)
            ideal = np.full(len(n), base.iloc[0]) if mode == "weak" else base.iloc[0] * base_n / n
            left.plot(n, ideal, **style.IDEAL)
        right.axhline(100.0, **style.IDEAL)
        if measured:
            m = t.dropna(subset=[col])
            left.errorbar(m["gpus"], m[col], yerr=[m[col] - m[lo], m[hi] - m[col]], capsize=3,
                          **style.MEASURED)
            e = t.dropna(subset=["measured_efficiency_pct"])
            right.errorbar(e["gpus"], e["measured_efficiency_pct"],
                           yerr=[e["measured_efficiency_pct"] - e["measured_efficiency_min_pct"],
                                 e["measured_efficiency_max_pct"]
                                 - e["measured_efficiency_pct"]], capsize=3, **style.MEASURED)
        if predicted:
            p = t.dropna(subset=[pcol])
            left.plot(p["gpus"], p[pcol], **style.PREDICTED)
            right.plot(t["gpus"], t["predicted_efficiency_pct"], **style.PREDICTED)
        if published is not None:
            pub = published[(published["model"] == t["model"].iloc[0])
                            & (published["mode"] == mode)]
            right.plot(pub["gpus"], pub["efficiency_pct"], **style.PUBLISHED)
        effs = [t[c] for c in ("measured_efficiency_pct", "predicted_efficiency_pct",
                               "measured_efficiency_min_pct", "measured_efficiency_max_pct")
                if c in t]
        top = max([100.0] + [float(np.nanmax(s)) for s in effs if s.notna().any()])
        right.set_ylim(0, top * 1.12)
        right.set_ylabel(f"{mode}-scaling efficiency (%)")
        for ax in (left, right):
            _gpu_axis(ax, t["gpus"], gpu_label)
        _status_marks(right, t)
        if mode == "weak":
            values = [left.get_ylim()[1]] + [float(np.nanmax(t[c])) for c in (hi, pcol)
                                             if c in t and t[c].notna().any()]
            left.set_ylim(0, max(values) * 1.1)  # from zero: a 2 % drop looks like one
        unit = one if base_n == 1 else f"{one}s"
        right.set_title(f"efficiency relative to {int(base_n):,} {unit}", loc="left")
        row_fig.suptitle(f"{name}: {mode} scaling", x=0.01, ha="left", fontweight="bold")
        style.legend_outside(left)
        style.legend_outside(right)
    if title:
        fig.suptitle(title)
    return fig


def _single_point(row_fig, left, right, name: str, t: pd.DataFrame, gpu_label: str,
                  measured: bool, predicted: bool) -> None:
    """A series measured or predicted at one GPU count: its step time as one labelled point,
    and a note in place of an efficiency that would compare it with nothing."""
    n = int(t["gpus"].iloc[0])
    shown = []
    if measured and "step_time_s" in t and t["step_time_s"].notna().any():
        left.errorbar(t["gpus"], t["step_time_s"],
                      yerr=[t["step_time_s"] - t["step_time_min_s"],
                            t["step_time_max_s"] - t["step_time_s"]], capsize=3,
                      **style.MEASURED)
        shown.append(("measured", float(t["step_time_s"].iloc[0])))
    if predicted and t["predicted_step_time_s"].notna().any():
        left.plot(t["gpus"], t["predicted_step_time_s"], **style.PREDICTED)
        shown.append(("predicted", float(t["predicted_step_time_s"].iloc[0])))
    for i, (what, value) in enumerate(shown):
        left.annotate(f"{what} {value:.3g} s", (n, value), xytext=(10, 8 - 16 * i),
                      textcoords="offset points", fontsize=9)
    left.set_ylabel("step time (s)")
    left.set_title("step time", loc="left")
    top = max([v for _, v in shown], default=1.0)
    left.set_ylim(0, top * 1.5)
    _gpu_axis(left, t["gpus"], gpu_label)
    left.set_xlim(n / 2, n * 2)
    if shown:
        style.legend_outside(left)
    right.set_axis_off()
    right.text(0.5, 0.5, f"one GPU count ({n:,}): no scaling efficiency to compute\n"
                         "(it needs runs at two or more GPU counts)",
               ha="center", va="center", transform=right.transAxes, fontsize=10,
               color=style.MISSING.get("color", "0.4"))
    row_fig.suptitle(f"{name}: one point", x=0.01, ha="left", fontweight="bold")


def _hbars(ax, labels, measured, predicted, xlabel: str, lo=None, hi=None,
           log: bool = False) -> None:
    """Measured and predicted bars per label; ``log``: a log x axis, so that bars of a model
    that is off by a large factor, and layouts far apart, can still be compared by length."""
    y = np.arange(len(labels))
    h = 0.38
    m = np.asarray(measured, float)
    if np.isfinite(m).any():
        err = None
        if lo is not None:
            err = [np.nan_to_num(m - np.asarray(lo, float)),
                   np.nan_to_num(np.asarray(hi, float) - m)]
        ax.barh(y - h / 2, np.nan_to_num(m), h, xerr=err, capsize=2,
                color=style.MEASURED["color"], label="measured")
    ax.barh(y + h / 2, np.nan_to_num(np.asarray(predicted, float)), h,
            color=style.PREDICTED["color"], label="predicted", **style.PREDICTED_HATCH)
    ax.set_yticks(y, labels)
    ax.set_ylim(len(labels) - 0.5, -0.5)  # first row on top, no empty margin
    ax.set_xlabel(xlabel + (", log scale" if log else ""))
    ax.grid(axis="y", visible=False)
    if log:
        shown = np.concatenate([m, np.asarray(predicted, float)] +
                               ([np.asarray(lo, float)] if lo is not None else []))
        shown = shown[np.isfinite(shown) & (shown > 0)]
        if len(shown):
            ax.set_xscale("log")
            _log_axis(ax.xaxis)
            # 10000 and 20000 written out collide at a bar chart's width: 10k, 20k.
            ax.xaxis.set_major_formatter(FuncFormatter(
                lambda v, _: f"{v / 1e3:g}k" if v >= 1e4 else f"{v:g}"))
            # Bars start at the left edge: below the smallest value by a margin, so the
            # shortest bar still has a length to read.
            ax.set_xlim(shown.min() / 2.5, shown.max() * 1.6)


def plot_layouts(table: pd.DataFrame, title: str | None = None, per: str = "GPU",
                 log: bool = False) -> Figure:
    """Throughput per GPU (``per``: what a rank is called, e.g. "rank" for CPU processes) and
    peak memory per layout, measured beside predicted (horizontal bars, fastest first); layouts
    whose runs did not complete say so at their bar. ``log``: throughput on a log axis (for a
    model off by a large factor, or layouts an order of magnitude apart)."""
    n = len(table)
    fig, (a, b) = style.new_figure(ncols=2, width=10.0, height=1.6 + 0.32 * n)
    labels = list(table["layout"])
    _hbars(a, labels, table["tokens_per_s_per_gpu"], table["predicted_tokens_per_s_per_gpu"],
           f"throughput per {per} (tokens/s)", table["tokens_per_s_per_gpu_min"],
           table["tokens_per_s_per_gpu_max"], log=log)
    scale, unit = _memory_unit(pd.concat([table["peak_memory_gb"],
                                          table["predicted_peak_memory_gb"]]))
    _hbars(b, labels, table["peak_memory_gb"] * scale, table["predicted_peak_memory_gb"] * scale,
           f"peak memory per rank ({unit})")
    b.set_yticklabels([])
    if table["runs"].sum():  # a report of measurements: say where one is missing or failed
        for i, row in enumerate(table.itertuples()):
            if row.completed < row.runs or row.runs == 0:
                note = "not run" if row.runs == 0 else f"{row.runs - row.completed} not completed"
                x = row.tokens_per_s_per_gpu if row.tokens_per_s_per_gpu == \
                    row.tokens_per_s_per_gpu else a.get_xlim()[0]
                a.annotate(note, (x, i - 0.19), xytext=(4, 0), textcoords="offset points",
                           va="center", fontsize=8, color=style.FAILED["color"])
    style.legend_outside(a)
    style.legend_outside(b)
    measured = "measured beside predicted" if table["runs"].sum() else "predicted"
    fig.suptitle(title or f"throughput and peak memory per layout, {measured}")
    return fig


def plot_errors(validation: pd.DataFrame, title: str | None = None) -> Figure:
    """Predicted against measured step time and peak memory, one colour per system and engine,
    with the y = x line and a +-20 % band."""
    fig, axes = style.new_figure(ncols=2, width=10.0, height=4.6)
    groups = list(validation.groupby(["system", "engine"], sort=True))
    panels = (("measured_step_time_s", "predicted_step_time_s", "step time (s)", 1.0),
              ("measured_peak_memory_bytes", "predicted_peak_memory_bytes",
               "peak memory per rank (MB)", 1e6))
    for ax, (mcol, pcol, what, unit) in zip(axes, panels, strict=True):
        vals = []
        for i, ((system, engine), g) in enumerate(groups):
            m = pd.to_numeric(g[mcol], errors="coerce").astype(float) / unit
            p = pd.to_numeric(g[pcol], errors="coerce").astype(float) / unit
            ok = m.notna() & p.notna() & (m > 0) & (p > 0)
            if ok.any():
                ax.plot(m[ok], p[ok], marker="o", linestyle="none",
                        color=style.SERIES[i % len(style.SERIES)], label=f"{system} / {engine}")
                vals += list(m[ok]) + list(p[ok])
        ax.set_xscale("log")
        ax.set_yscale("log")
        _log_axis(ax.xaxis)
        _log_axis(ax.yaxis)
        ax.set_xlabel(f"measured {what}")
        ax.set_ylabel(f"predicted {what}")
        if vals:
            lo, hi = min(vals) / 1.5, max(vals) * 1.5
            xs = np.geomspace(lo, hi, 50)
            ax.plot(xs, xs, **{**style.IDEAL, "label": "predicted = measured"})
            ax.fill_between(xs, xs * 0.8, xs * 1.2, color=style.IDEAL["color"], alpha=0.12,
                            label="±20 %")
            ax.set_xlim(lo, hi)
            ax.set_ylim(lo, hi)
            if hi / lo > 200:
                # 1, 2, 5 labels over more than two decades collide (0.005 and 0.01 ran into
                # one another at this width): label the decades only.
                for axis in (ax.xaxis, ax.yaxis):
                    axis.set_major_locator(LogLocator(subs=(1.0,)))
        else:
            ax.text(0.5, 0.5, "no run measured this", transform=ax.transAxes, ha="center")
        style.legend_outside(ax, ncols=2)
    fig.suptitle(title or "the cost model against measurements, per system and engine")
    return fig


def plot_knobs(tables: dict[str, pd.DataFrame], title: str | None = None) -> Figure:
    """Throughput per GPU against each knob (one panel per knob, the others held at the values
    in each panel's title): measured and predicted; a layout predicted not to fit is drawn
    hollow."""
    names = {"tp": "tensor-parallel degree (TP)", "pp": "pipeline-parallel degree (PP)",
             "micro_batch": "micro-batch size (sequences)"}
    fig, axes = style.new_figure(ncols=len(tables), width=4.0 * len(tables) + 0.4, height=4.2)
    for ax, (knob, t) in zip(axes, tables.items(), strict=True):
        if t["tokens_per_s_per_gpu"].notna().any():
            ax.errorbar(t["value"], t["tokens_per_s_per_gpu"],
                        yerr=[t["tokens_per_s_per_gpu"] - t["tokens_per_s_per_gpu_min"],
                              t["tokens_per_s_per_gpu_max"] - t["tokens_per_s_per_gpu"]],
                        capsize=3, **style.MEASURED)
        ax.plot(t["value"], t["predicted_tokens_per_s_per_gpu"], **style.PREDICTED)
        if "predicted_fits" in t:
            oom = t[~t["predicted_fits"].astype(bool)]
            if len(oom):
                ax.plot(oom["value"], oom["predicted_tokens_per_s_per_gpu"], linestyle="none",
                        marker="s", markersize=10, markerfacecolor="white",
                        markeredgecolor=style.FAILED["color"], label="predicted not to fit")
        _gpu_axis(ax, t["value"], names[knob])
        ax.set_ylabel("throughput per GPU (tokens/s)")
        top = np.nanmax(np.concatenate([t["predicted_tokens_per_s_per_gpu"].to_numpy(float),
                                        t["tokens_per_s_per_gpu_max"].to_numpy(float)]))
        ax.set_ylim(0, top * 1.12 if np.isfinite(top) else None)  # no marker cut at the top
        ax.set_title(f"held: {t['held'].iloc[0]}" if len(t) else "", loc="left", fontsize=9)
        style.legend_outside(ax, ncols=2)
    fig.suptitle(title or "throughput per GPU against each knob, measured and predicted")
    return fig


def plot_memory_breakdown(breakdown: pd.DataFrame, title: str | None = None) -> Figure:
    """Predicted per-rank memory of each layout, stacked by part (GB, hatched: a prediction, as
    in every bar chart); where runs measured their parts, a solid bar of the measured parts
    under it, and the measured peak; the device's capacity. The legend is at the right, one
    entry per line, so that the bars keep the figure's height whatever the number of parts."""
    n = len(breakdown)
    measured = [p for p in MEMORY_PARTS if f"measured_{p}_gb" in breakdown
                and breakdown[f"measured_{p}_gb"].notna().any()]
    # With measured parts: two bars per layout, predicted above, measured below.
    h, shift = (0.38, 0.2) if measured else (0.65, 0.0)
    fig, (ax,) = style.new_figure(width=10.0, height=1.9 + (0.62 if measured else 0.42) * n)
    y = np.arange(n)
    left = np.zeros(n)
    stacked = sum(breakdown[f"{p}_gb"].fillna(0) for p in MEMORY_PARTS)
    scale, unit = _memory_unit(stacked)
    for part in MEMORY_PARTS:
        v = breakdown[f"{part}_gb"].to_numpy(float) * scale
        ax.barh(y - shift, v, h, left=left, color=style.MEMORY_PARTS[part], label=part,
                **style.PREDICTED_HATCH)
        left += np.nan_to_num(v)
    # The legend says what hatched and solid mean (the parts' own entries are hatched).
    # Keys in black and white, so that no part's colour reads as one of them.
    ax.barh([np.nan], [0], facecolor="white", edgecolor="0.2", hatch="//", linewidth=0.8,
            label="predicted (hatched)")
    if measured:
        mleft = np.zeros(n)
        for part in measured:
            v = np.nan_to_num(breakdown[f"measured_{part}_gb"].to_numpy(float) * scale)
            ax.barh(y + shift, v, h, left=mleft, color=style.MEMORY_PARTS[part])
            mleft += v
        ax.barh([np.nan], [0], facecolor="white", edgecolor="0.2", linewidth=0.8,
                label="measured (solid, lower bar)")
        left = np.maximum(left, mleft)
    if "measured_peak_gb" in breakdown and breakdown["measured_peak_gb"].notna().any():
        ax.plot(breakdown["measured_peak_gb"] * scale, y + shift, linestyle="none",
                marker="D", color="black", label="measured peak")
    device = breakdown["device_memory_gb"].iloc[0] if "device_memory_gb" in breakdown else None
    if device is not None and device * scale <= 3 * max(left.max(), 1e-12):
        ax.axvline(device * scale, color=style.FAILED["color"], linestyle="--",
                   label=f"device memory\n({device:.4g} GB)")
    elif device is not None:  # far off scale: say it rather than squash the bars
        ax.plot([], [], " ", label=f"device memory\n{device:.4g} GB (off scale)")
    ax.set_yticks(y, breakdown["layout"])
    ax.set_ylim(n - 0.5, -0.5)  # first row on top, no empty margin
    ax.grid(axis="y", visible=False)
    ax.set_xlabel(f"memory per rank ({unit})")
    style.legend_right(ax)
    what = "predicted and measured" if measured else "predicted"
    fig.suptitle(title or f"memory per rank by part, {what}")
    return fig


_METRICS = {"iteration_time_s": ("iteration time (s)", True),
            "tflops_per_gpu": ("TFLOP/s per GPU", True),
            "tokens_per_s_per_gpu": ("tokens/s per GPU", True),
            "pct_peak": ("% of peak (MFU)", False)}


def plot_calibration(table: pd.DataFrame, title: str | None = None) -> Figure:
    """Predicted against published, one panel per metric the published rows state, coloured by
    source, with the y = x line and a +-10 % band."""
    metrics = [m for m in _METRICS if (table["metric"] == m).any()]
    fig, axes = style.new_figure(ncols=len(metrics), width=3.9 * len(metrics) + 0.6, height=4.6)
    sources = sorted(table["source"].unique())
    for ax, metric in zip(axes, metrics, strict=True):
        t = table[(table["metric"] == metric) & table["predicted"].notna()]
        for i, src in enumerate(sources):
            g = t[t["source"] == src]
            if len(g):
                ax.plot(g["measured"], g["predicted"], marker="o", linestyle="none",
                        color=style.SERIES[i % len(style.SERIES)], label=src)
        vals = np.concatenate([t["measured"].to_numpy(float), t["predicted"].to_numpy(float)])
        label, log = _METRICS[metric]
        lo, hi = (vals.min() / 1.3, vals.max() * 1.3) if log else (
            max(vals.min() - 5, 0), vals.max() + 5)
        xs = np.geomspace(lo, hi, 50) if log else np.linspace(lo, hi, 50)
        ax.plot(xs, xs, **{**style.IDEAL, "label": "predicted = published"})
        ax.fill_between(xs, xs * 0.9, xs * 1.1, color=style.IDEAL["color"], alpha=0.12,
                        label="±10 %")
        if log:
            ax.set_xscale("log")
            ax.set_yscale("log")
            _log_axis(ax.xaxis)
            _log_axis(ax.yaxis)
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel(f"published {label}")
        ax.set_ylabel(f"predicted {label}")
        ax.set_title(f"{len(t)} runs", loc="left", fontsize=9)
    # One legend for all panels, under the figure.
    handles, labels = {}, []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in handles:
                handles[lab] = h
                labels.append(lab)
    fig.legend([handles[lab] for lab in labels], labels, loc="outside lower center",
               ncols=3, frameon=False)
    fig.suptitle(title or "the cost model against published runs")
    return fig
