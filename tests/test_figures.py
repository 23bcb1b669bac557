"""What a reviewer checks on every figure the project draws: a title, every legend and title
inside the canvas (none clipped when saved), and hatching with one meaning (a hatched bar is a
prediction, never a measurement). Each figure is caught as it is saved (style.save), from the
same calls the reports, the study's figure scripts (analysis/) and the API make."""

from __future__ import annotations

import io
import json
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
from matplotlib.legend import Legend
from store_fixtures import make_trace

import frontier_llm as flm
from frontier_llm.report import paper, render, style
from frontier_llm.store.ingest import TRACE_SUFFIX

SLACK = 1.0  # pixels: antialiasing of the legend's frame may reach the edge


def _titles(fig) -> list[str]:
    figs = [fig, *fig.subfigs]
    return [f._suptitle.get_text() for f in figs if f._suptitle is not None
            and f._suptitle.get_text().strip()]


def problems(fig) -> list[str]:
    """What a reviewer would send back about ``fig``, as it is saved (no bbox cropping)."""
    fig.savefig(io.BytesIO(), format="png")  # lays the figure out as saving does
    renderer = fig.canvas.get_renderer()
    canvas = fig.bbox
    out = []
    if not _titles(fig):
        out.append("no title")
    texts = [f._suptitle for f in (fig, *fig.subfigs) if f._suptitle is not None]
    for name, artist in [("legend", leg) for leg in fig.findobj(Legend)] + \
                        [("title", t) for t in texts]:
        box = artist.get_window_extent(renderer)
        if (box.x0 < canvas.x0 - SLACK or box.x1 > canvas.x1 + SLACK
                or box.y0 < canvas.y0 - SLACK or box.y1 > canvas.y1 + SLACK):
            what = ", ".join(t.get_text() for t in artist.get_texts()[:3]) \
                if name == "legend" else artist.get_text()
            out.append(f"{name} outside the canvas ({what}): {box.bounds} vs {canvas.bounds}")
    for leg in fig.findobj(Legend):
        labels = [t.get_text() for t in leg.get_texts()]
        says_hatched = any("hatched" in lab for lab in labels)
        for handle, label in zip(leg.legend_handles, labels, strict=True):
            hatched = bool(getattr(handle, "get_hatch", lambda: None)())
            if hatched and "measured" in label:
                out.append(f"legend entry {label!r}: a measurement drawn hatched")
            if hatched and "predicted" not in label and not says_hatched:
                out.append(f"legend entry {label!r}: hatched, but the legend does not say "
                           "hatching means predicted")
            if not hatched and "predicted" in label and "hatched" in label:
                out.append(f"legend entry {label!r}: says hatched, drawn solid")
    return out


@pytest.fixture
def saved(monkeypatch) -> dict:
    """Every figure saved through style.save, by name, with its problems. The figure is laid
    out as saving lays it out (problems() renders it) and closed; the files themselves are not
    written, which halves the test's time (the reports' own tests check the files)."""
    found: dict[str, list[str]] = {}

    def checking_save(fig, out_dir, name):
        found[name] = problems(fig)
        plt.close(fig)
        return [Path(out_dir) / f"{name}.png", Path(out_dir) / f"{name}.pdf"]

    monkeypatch.setattr(style, "save", checking_save)
    return found


def _traces(folder) -> None:
    """Weak scaling on 1, 2 and 4 ranks (measured, with predictions) and two layouts at 4."""
    folder.mkdir()
    traces = [make_trace(f"w{n}", dp=n, global_batch=2 * n, seed=n, labels={"sweep": "weak"},
                         predicted_step_time_s=0.05) for n in (1, 2, 4)]
    traces += [make_trace("p4", pp=2, dp=2, global_batch=8, seed=9, labels={"sweep": "weak"},
                          predicted_step_time_s=0.06),
               make_trace("f4", tp=2, dp=2, global_batch=8, seed=7, status="failed",
                          labels={"sweep": "weak"})]
    for t in traces:
        (folder / f"{t['run_id']}{TRACE_SUFFIX}").write_text(json.dumps(t))


def test_every_report_figure_passes_review(tmp_path, saved):
    _traces(tmp_path / "runs")
    runs = flm.runs(tmp_path / "runs")
    render.scaling_report(runs, tmp_path, "scaling", source="both")
    render.layouts_report(runs, tmp_path, "layouts", require_measured=True)
    render.errors_report(flm.validation(tmp_path / "runs"), tmp_path, "errors")
    # The planner tour's memory figures (five layouts, predicted only) and the curve.
    for name, gcds in (("gpt-22b", 16), ("gpt-1t", 3072)):
        flm.save_figure(flm.plot_memory(flm.plan_memory(name, "frontier", gcds, top=5),
                                        f"{name}: memory per GCD"), tmp_path, f"mem-{name}")
    memory = flm.plan_memory("gpt-22b", "frontier", 16, top=3)
    for part, col in (("params", "params_gb"), ("optimizer", "optimizer_gb")):
        memory[f"measured_{part}_gb"] = memory[col] * 0.9
    memory["measured_peak_gb"] = memory["predicted_peak_gb"] * 0.95
    flm.save_figure(flm.plot_memory(memory), tmp_path, "mem-measured")
    cur = flm.allocation("gpt-22b", tokens=1e12, gpus=(8, 256), deadline_days=30)
    flm.save_figure(flm.plot_allocation(cur, deadline_days=30, gpu_label="GCDs"), tmp_path,
                    "allocation")
    assert {"scaling", "layouts", "errors", "mem-gpt-22b", "mem-gpt-1t", "mem-measured",
            "allocation"} <= set(saved)
    assert {k: v for k, v in saved.items() if v} == {}


def test_every_study_figure_passes_review(tmp_path, saved):
    """analysis/*.py: the Frontier study's figures from the cost model alone."""
    for draw in paper.FIGURES.values():
        draw(None, tmp_path)
    paper.calibration(None, tmp_path)
    assert set(saved) >= {"weak_scaling", "strong_scaling", "throughput_22b", "memory_22b",
                          "calibration"}
    assert {k: v for k, v in saved.items() if v} == {}


def test_the_review_finds_what_it_looks_for():
    """The checks can fail: an untitled figure with a clipped legend and hatched measurements."""
    fig, (ax,) = style.new_figure()
    fig.set_layout_engine("none")  # constrained layout would make room for the legend
    ax.bar([0], [1], label="measured", hatch="//")
    ax.legend(loc="upper left", bbox_to_anchor=(1.1, 1.0))
    found = problems(fig)
    assert "no title" in found
    assert any(p.startswith("legend outside the canvas") for p in found)
    assert any("a measurement drawn hatched" in p for p in found)
