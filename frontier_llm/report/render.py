"""Write a report: its tables (CSV, Markdown) and its figures (PNG, PDF) into one folder.

Every function computes everything first and writes only when there is something to show, so
bad input never leaves an empty report behind as if it were data.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from frontier_llm.report import figures, style
from frontier_llm.report.errors import errors_table
from frontier_llm.report.layouts import (
    layouts_summary,
    layouts_table,
    measured_memory_parts,
    memory_breakdown,
)
from frontier_llm.report.scaling import scaling_table, summary
from frontier_llm.report.tables import spreadsheet_safe, write_table
from frontier_llm.specs.forms import key_columns


def scaling_report(frame: pd.DataFrame, out: str | Path, name: str, source: str = "measured",
                   mode: str = "auto", gpu_label: str = "GPUs",
                   published: pd.DataFrame | None = None) -> tuple[pd.DataFrame, list[Path]]:
    table = scaling_table(frame, source=source, mode=mode)
    fig = figures.plot_scaling(table, gpu_label=gpu_label, published=published)
    notes = [
        "efficiency = per-GPU throughput at N over that at the smallest measured N "
        "(weak: global batch grows with N; strong: fixed global batch, = T_base N_base / "
        "(T_N N))",
        "step_time_s is the median over repeated runs; min/max give the spread",
        "spread: the larger of the repeats' half-range and the steps' half-range inside a run, "
        "in % of the step time; an efficiency whose spread (the point's and the base's) reaches "
        "its distance from 100 % is marked 'not a result'",
        "status counts every run of the point: failed runs and missing points are listed, "
        "never dropped",
    ]
    paths = write_table(table, summary(table), out, name, f"Scaling: {name}", notes)
    return table, paths + style.save(fig, out, name)


def layouts_report(frame: pd.DataFrame, out: str | Path, name: str,
                   require_measured: bool = True, rank_memory: pd.DataFrame | None = None,
                   title: str | None = None, per: str = "GPU", log: bool = False
                   ) -> tuple[pd.DataFrame, list[Path]]:
    table = layouts_table(frame, require_measured=require_measured)
    fig = figures.plot_layouts(table, title=title, per=per, log=log)
    paths = write_table(table, layouts_summary(table), out, name, f"Layouts: {name}",
                        ["errors are (predicted - measured) / measured in percent",
                         "throughput per GPU in tokens/s: median over repeats"])
    paths += style.save(fig, out, name)
    if any(c.startswith("mem_") for c in frame.columns):
        keys = key_columns(table)
        first = frame.drop_duplicates(subset=keys).drop(columns=["peak_memory_gb"],
                                                       errors="ignore")
        # The table's order (fastest first), with the measured peaks it holds.
        first = table[[*keys, "peak_memory_gb"]].merge(first, on=keys, how="inner")
        if rank_memory is not None:
            parts = measured_memory_parts(frame, rank_memory)
            if len(parts):
                first = first.merge(parts, on=keys, how="left")
        breakdown = memory_breakdown(first)
        paths += write_table(breakdown, breakdown, out, f"{name}-memory",
                             f"Predicted memory per rank by part (GB): {name}")
        paths += style.save(figures.plot_memory_breakdown(breakdown), out, f"{name}-memory")
    return table, paths


def errors_report(validation: pd.DataFrame, out: str | Path, name: str = "errors",
                  overall: bool = True, title: str | None = None
                  ) -> tuple[pd.DataFrame, list[Path]]:
    """``overall=False``: no row pooling the groups (errors_table)."""
    table = errors_table(validation, overall=overall)
    fig = figures.plot_errors(validation, title=title)
    paths = write_table(table, table, out, name, title or "Cost model against measurements",
                        ["MAPE = mean absolute percentage error; bias = mean signed error "
                         "(positive: predicted too slow / too much memory)",
                         "throughput_rank_corr = rank (Spearman) correlation of predicted and "
                         "measured throughput per GPU over the group's runs"])
    spreadsheet_safe(validation).to_csv(Path(out) / f"{name}-runs.csv", index=False)
    paths.append(Path(out) / f"{name}-runs.csv")
    return table, paths + style.save(fig, out, name)
