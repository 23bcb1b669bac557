"""The Frontier study's figures (Dash et al. 2023, arXiv 2312.12705), each redrawable from the
cost model alone or beside a measured database: what ``analysis/<figure>.py`` runs.

Each figure function takes the repository's sweep files, an optional database URL and an output
folder, and writes ``<figure>.csv``, ``.md``, ``.png`` and ``.pdf``. Without a database the
points are the cost model's predictions for the sweep's layouts; with one, the measured runs of
the sweep of the same name are drawn beside them, and a point with no run shows as missing.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from frontier_llm.errors import UserError
from frontier_llm.report import figures, style
from frontier_llm.report.layouts import KNOBS, knob_table, layouts_table, memory_breakdown
from frontier_llm.report.scaling import scaling_table, summary
from frontier_llm.report.sources import sweep_report_frame
from frontier_llm.report.tables import write_table
from frontier_llm.specs.forms import key_columns
from frontier_llm.specs.vocab import RunStatus

REPO = Path(__file__).resolve().parents[2]
SWEEPS = REPO / "sweeps"
CALIBRATION_CSV = REPO / "tests" / "data" / "calibration_runs.csv"
GCDS = "GCDs"
# What the paper reports (abstract; ../shared/data/README.md). The paper gives no GPU count for
# the strong-scaling figures: they are drawn at the largest count of the matching sweep.
PUBLISHED = pd.DataFrame([
    {"model": "gpt-175b", "mode": "weak", "gpus": 1024, "efficiency_pct": 100.0},
    {"model": "gpt-1t", "mode": "weak", "gpus": 3072, "efficiency_pct": 100.0},
    {"model": "gpt-175b", "mode": "strong", "gpus": 1024, "efficiency_pct": 89.0},
    {"model": "gpt-1t", "mode": "strong", "gpus": 3072, "efficiency_pct": 87.0},
])
SOURCE_NOTE = ("published: Dash et al. 2023 (arXiv 2312.12705), 100 % weak scaling at 1024 "
               "(175B) and 3072 (1T) GCDs, 89 % and 87 % strong scaling (drawn at the sweep's "
               "largest GCD count: the abstract does not give it)")


@functools.lru_cache(maxsize=8)
def _frame(sweep: str, db: str | None) -> tuple[pd.DataFrame, bool]:
    """(frame, measured?) of a sweep file: predictions joined with the database's runs when a
    database is given and holds the sweep, else predictions alone (said on stderr). Cached:
    two figures read the 22B sweep; callers never modify the frame."""
    path = str(SWEEPS / f"{sweep}.yaml")
    if db is None:
        return sweep_report_frame(path, None, model_only=True)[0], False
    try:
        frame = sweep_report_frame(path, db)[0]
    except UserError as exc:
        if "no runs of sweep" not in str(exc):
            raise
        print(f"note: {exc}; drawing the cost model's prediction alone", file=sys.stderr)
        return sweep_report_frame(path, None, model_only=True)[0], False
    return frame, (frame["status"] == RunStatus.COMPLETED).any()


def _scaling(mode: str, db: str | None, out: Path) -> list[Path]:
    tables = []
    for model in ("175b", "1t"):
        frame, measured = _frame(f"frontier-{model}-{mode}", db)
        tables.append(scaling_table(frame, source="both" if measured else "predicted",
                                    mode=mode))
    table = pd.concat(tables, ignore_index=True)
    name = f"{mode}_scaling"
    fig = figures.plot_scaling(table, gpu_label=GCDS, published=PUBLISHED)
    paths = write_table(table, summary(table), out, name,
                        f"{mode.capitalize()} scaling of GPT 175B and 1T on Frontier",
                        [SOURCE_NOTE])
    return paths + style.save(fig, out, name)


def weak_scaling(db: str | None, out: Path) -> list[Path]:
    """Weak scaling, 175B (64-1024 GCDs) and 1T (256-3072 GCDs)."""
    return _scaling("weak", db, out)


def strong_scaling(db: str | None, out: Path) -> list[Path]:
    """Strong scaling, 175B (128-1024 GCDs) and 1T (768-3072 GCDs)."""
    return _scaling("strong", db, out)


def _22b_layouts(db: str | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    frame, _ = _frame("frontier-22b-explore", db)
    return layouts_table(frame, require_measured=False), frame


def throughput_22b(db: str | None, out: Path) -> list[Path]:
    """Throughput per GCD of the 22B model against TP, PP and micro-batch on 16 GCDs, each
    knob varied with the others held at the fastest layout's values."""
    table, _ = _22b_layouts(db)
    knobs = {k: knob_table(table, k) for k in KNOBS}
    rows = pd.concat(knobs.values(), ignore_index=True)
    shown = rows[["knob", "value", "held", "layout", "status", "tokens_per_s_per_gpu",
                  "predicted_tokens_per_s_per_gpu", "predicted_peak_memory_gb",
                  "predicted_fits"]]
    paths = write_table(rows, shown, out, "throughput_22b",
                        "GPT 22B on 16 Frontier GCDs: throughput against TP, PP, micro-batch")
    fig = figures.plot_knobs(knobs, "GPT 22B on 16 Frontier GCDs (2 nodes), global batch 128")
    return paths + style.save(fig, out, "throughput_22b")


def memory_22b(db: str | None, out: Path) -> list[Path]:
    """Predicted memory per GCD by part for the 22B layouts of the throughput figure, with the
    measured peak where measured and the GCD's 64 GB."""
    table, frame = _22b_layouts(db)
    keys = key_columns(table)
    picked = pd.concat([knob_table(table, k) for k in KNOBS]).drop_duplicates(subset=keys)
    rows = picked[[*keys, "peak_memory_gb"]].merge(
        frame.drop_duplicates(subset=keys).drop(columns=["peak_memory_gb"], errors="ignore"),
        on=keys)
    breakdown = memory_breakdown(rows)
    paths = write_table(breakdown, breakdown, out, "memory_22b",
                        "GPT 22B on 16 Frontier GCDs: predicted memory per GCD (GB)")
    fig = figures.plot_memory_breakdown(breakdown, "GPT 22B, 16 GCDs: memory per GCD")
    return paths + style.save(fig, out, "memory_22b")


def calibration(csv: str | Path | None, out: Path) -> list[Path]:
    """The cost model against the published runs it was calibrated on (in-sample)."""
    from frontier_llm.planner.calibration import error_summary, load_runs, validate_runs

    table = validate_runs(load_runs(csv or CALIBRATION_CSV))
    s = error_summary(table)
    table["error_pct"] = table["error"] * 100
    shown = table[["source", "model", "gpu", "gpus", "metric", "measured", "predicted",
                   "error_pct", "layout"]].rename(columns={"measured": "published"})
    paths = write_table(table, shown, out, "calibration",
                        "Predicted against published (calibration runs)",
                        [f"{s['rows']} runs: mean absolute error {100 * s['mape']:.1f} %, "
                         f"largest {100 * s['max']:.1f} % (in-sample: the knobs were fitted "
                         "to these rows)"])
    return paths + style.save(figures.plot_calibration(table), out, "calibration")


FIGURES: dict[str, Callable[..., list[Path]]] = {
    "throughput_22b": throughput_22b, "memory_22b": memory_22b,
    "weak_scaling": weak_scaling, "strong_scaling": strong_scaling,
}


def _draw_all(db: str | None, csv: str | None, out: Path) -> list[Path]:
    """Every figure, with a progress bar on a terminal (none in logs and pipes)."""
    from rich.console import Console
    from rich.progress import Progress

    jobs = [(name, lambda fn=fn: fn(db, out)) for name, fn in FIGURES.items()]
    jobs.append(("calibration", lambda: calibration(csv, out)))
    paths: list[Path] = []
    with Progress(console=Console(stderr=True), transient=True,
                  disable=not sys.stderr.isatty()) as progress:
        task = progress.add_task("figures", total=len(jobs))
        for name, draw in jobs:
            progress.update(task, description=f"drawing {name}")
            paths += draw()
            progress.advance(task)
    return paths


def main(figure: str | None, argv: list[str] | None = None) -> int:
    """Command line of ``analysis/<figure>.py`` (``figure`` None: every figure)."""
    what = "every figure of the Frontier study" if figure is None else f"the {figure} figure"
    doc = (FIGURES.get(figure) or calibration).__doc__ if figure else __doc__
    ap = argparse.ArgumentParser(description=f"Draw {what}.\n\n{doc}",
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    if figure != "calibration":
        ap.add_argument("--db", metavar="URL", default=None,
                        help="a results database: measured runs beside the prediction "
                             "(default: the cost model alone)")
    if figure in (None, "calibration"):
        ap.add_argument("--csv", default=None,
                        help=f"published runs (default {CALIBRATION_CSV.relative_to(REPO)})")
    ap.add_argument("--out", required=True, metavar="DIR", help="folder for the figure files")
    args = ap.parse_args(argv)
    out = Path(args.out)
    try:
        if figure == "calibration":
            paths = calibration(args.csv, out)
        elif figure is not None:
            paths = FIGURES[figure](args.db, out)
        else:
            paths = _draw_all(args.db, args.csv, out)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    for p in paths:
        print(f"wrote {p}")
    return 0
