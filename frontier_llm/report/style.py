"""The one style every report figure uses: colours, markers, sizes, how a figure is saved.

Measured data is drawn in solid blue circles, the cost model's prediction in dashed orange
squares, the ideal line in grey; failed and missing points keep their place on the axis as red
crosses and hollow grey markers. In bar charts hatching means one thing in every figure: a
hatched bar is the cost model's prediction, a solid bar a measurement (:data:`PREDICTED_HATCH`).
Keeping these in one module is what makes a measured figure and a predicted one comparable at a
glance.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

if "ipykernel" not in sys.modules:
    # Reports are files: never open a window (and work on headless nodes). Inside Jupyter the
    # inline backend stays, so a notebook shows the figures it draws.
    matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.transforms import offset_copy

from frontier_llm.report.tables import inside

# Colour-blind safe (Okabe-Ito).
MEASURED = {"color": "#0072B2", "marker": "o", "linestyle": "-", "label": "measured"}
PREDICTED = {"color": "#E69F00", "marker": "s", "linestyle": "--", "label": "predicted"}
IDEAL = {"color": "#555555", "linestyle": ":", "linewidth": 1.2, "label": "ideal"}
FAILED = {"color": "#D55E00", "marker": "x", "linestyle": "none", "markersize": 9,
          "markeredgewidth": 2, "label": "run not completed"}
MISSING = {"color": "#999999", "marker": "o", "linestyle": "none", "markersize": 9,
           "markerfacecolor": "none", "label": "missing point"}
PUBLISHED = {"color": "#009E73", "marker": "D", "linestyle": "none", "label": "published"}
MEMORY_PARTS = {"params": "#0072B2", "grads": "#56B4E9", "optimizer": "#009E73",
                "activations": "#E69F00", "loss": "#D55E00", "buffers": "#CC79A7",
                "step": "#F0E442",
                "reserved": "#999999"}
# Bars of a prediction (every bar chart): white diagonal lines over the bar's colour.
PREDICTED_HATCH = {"hatch": "//", "edgecolor": "white", "linewidth": 0}
# Extra colours for several series (layouts, models) in one panel.
SERIES = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")

RC = {
    "figure.figsize": (6.4, 4.2),
    "figure.dpi": 100,
    "savefig.dpi": 150,
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "legend.fontsize": 8.5,
    "legend.framealpha": 0.9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "pdf.fonttype": 42,  # editable text in the PDF (journals ask for it)
}


def use() -> None:
    """Make the report style matplotlib's current one. Axes take their style when they are
    created, also axes that a caller adds later (subfigures, a notebook's own panels), so the
    style is set, not held in a context that would end before them."""
    plt.rcParams.update(RC)


def new_figure(ncols: int = 1, nrows: int = 1, width: float | None = None,
               height: float | None = None) -> tuple[Figure, list]:
    """A figure in the report style, with its axes as a flat list."""
    w = width or RC["figure.figsize"][0] * (1 if ncols == 1 else 0.75 * ncols)
    h = height or RC["figure.figsize"][1] * (1 if nrows == 1 else 0.85 * nrows)
    use()
    fig, axes = plt.subplots(nrows, ncols, figsize=(w, h), squeeze=False, layout="constrained")
    return fig, list(axes.ravel())


def new_canvas(width: float, height: float) -> Figure:
    """An empty figure in the report style (for subfigures)."""
    use()
    return plt.figure(figsize=(width, height), layout="constrained")


def legend_right(ax, **kw) -> None:
    """A legend to the right of the axes, one entry per line (constrained layout makes room for
    it): for a panel whose legend has more entries than fit under it without squeezing it."""
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    if unique:
        ax.legend(unique.values(), unique.keys(), loc="upper left", bbox_to_anchor=(1.02, 1.0),
                  frameon=False, **kw)


def legend_outside(ax, **kw) -> None:
    """A legend under the axes' x label, where it can not hide data. The gap is in points, so
    it stays under the label whatever the axes' height."""
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))  # one entry per label
    if unique:
        below = offset_copy(ax.transAxes, fig=ax.figure, y=-kw.pop("gap", 34), units="points")
        ax.legend(unique.values(), unique.keys(), loc="upper center", bbox_to_anchor=(0.5, 0),
                  bbox_transform=below, ncols=min(len(unique), kw.pop("ncols", 4)),
                  frameon=False, **kw)


def save(fig: Figure, out_dir: str | Path, name: str) -> list[Path]:
    """Write ``name``.png and ``name``.pdf into ``out_dir``; returns both paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [inside(out, name, ".png"), inside(out, name, ".pdf")]
    for p in paths:
        fig.savefig(p)
    plt.close(fig)
    return paths
