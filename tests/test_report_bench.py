"""flm report and the notebooks on a database of real ``flm bench`` runs (tiny-gpt on 1, 2 and
4 gloo ranks, one of them crashed on purpose; tests/report_fixtures.py)."""

from __future__ import annotations

import nbformat
import pandas as pd
import pytest
from nbclient import NotebookClient
from report_fixtures import check_pdf, check_png

from frontier_llm.cli import main
from frontier_llm.report.paper import REPO
from frontier_llm.report.sources import measured_runs

pytestmark = [pytest.mark.slow]


def test_weak_scaling_measured_and_predicted(bench_db, tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["report", "scaling", "--sweep", "tiny-weak", "--db", bench_db.url,
                 "--predicted", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "weak-scaling efficiency at 4 GPUs: measured" in printed and "predicted" in printed
    t = pd.read_csv(out / "tiny-weak-scaling.csv").set_index("gpus")
    assert t.index.tolist() == [1, 2, 4] and set(t["mode"]) == {"weak"}
    assert t.loc[1, "runs"] == 2 and t.loc[1, "status"] == "2 completed"  # the repeat
    runs = measured_runs(bench_db.url, "tiny-weak").set_index("run_id")
    # Median of the two 1-rank runs, and the efficiency from the stored step times.
    base = runs.loc[["w1a", "w1b"], "step_time_s"].median()
    assert t.loc[1, "step_time_s"] == pytest.approx(base)
    per_gpu = {n: gb * 32 / (runs.loc[r, "step_time_s"] * n)
               for n, gb, r in ((2, 4, "w2"), (4, 8, "w4"))}
    for n, x in per_gpu.items():
        assert t.loc[n, "measured_efficiency_pct"] == pytest.approx(x / (2 * 32 / base) * 100)
    assert t.loc[1, "measured_efficiency_pct"] == 100.0
    assert t["predicted_efficiency_pct"].notna().all()
    assert "| tiny-gpt tp1 pp1 mb2 fp32 | weak | 1 |" in (out / "tiny-weak-scaling.md").read_text()
    check_png(out / "tiny-weak-scaling.png")
    check_pdf(out / "tiny-weak-scaling.pdf")


def test_strong_scaling_shows_the_crashed_run(bench_db, tmp_path):
    out = tmp_path / "r"
    assert main(["report", "scaling", "--sweep", "tiny-strong", "--db", bench_db.url,
                 "--out", str(out)]) == 0
    t = pd.read_csv(out / "tiny-strong-scaling.csv").set_index("gpus")
    assert set(t["mode"]) == {"strong"}
    assert t.loc[2, "status"] == "1 completed, 1 failed" and t.loc[2, "not_completed"] == 1
    runs = measured_runs(bench_db.url, "tiny-strong").set_index("run_id")
    t1, t4 = runs.loc["s1", "step_time_s"], runs.loc["s4", "step_time_s"]
    assert t.loc[4, "measured_efficiency_pct"] == pytest.approx(t1 * 1 / (t4 * 4) * 100)
    check_png(out / "tiny-strong-scaling.png")


def test_layouts_and_errors_reports(bench_db, tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["report", "layouts", "--sweep", "tiny-strong", "--db", bench_db.url,
                 "--out", str(out)]) == 0
    layouts = pd.read_csv(out / "tiny-strong-layouts.csv")
    assert sorted(layouts["dp"]) == [1, 2, 4]
    assert layouts.set_index("dp").loc[2, "status"] == "1 completed, 1 failed"
    assert layouts["peak_memory_gb"].notna().all() and layouts["predicted_peak_memory_gb"].notna(
    ).all()
    memory = pd.read_csv(out / "tiny-strong-layouts-memory.csv")
    assert (memory["params_gb"] > 0).all() and (memory["optimizer_gb"] > 0).all()
    # What the ranks measured, by part, beside the prediction (flm_rank_memory).
    for part in ("params", "grads", "optimizer", "activations"):
        assert (memory[f"measured_{part}_gb"] > 0).all(), part
    assert main(["report", "errors", "--db", bench_db.url, "--out", str(out)]) == 0
    errors = pd.read_csv(out / "errors.csv")
    assert errors[["system", "engine", "runs"]].values.tolist() == [["cpu-local", "native", 7]]
    for name in ("tiny-strong-layouts", "tiny-strong-layouts-memory", "errors"):
        check_png(out / f"{name}.png")
        check_pdf(out / f"{name}.pdf")


def _execute(name: str, tmp_path) -> list[str]:
    nb = nbformat.read(REPO / "notebooks" / f"{name}.ipynb", as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    return _outputs(nb, pngs=True)


def _outputs(nb, pngs: bool = False) -> list[str]:
    """Each cell's outputs as text. A cell's consecutive printed (stream) outputs are one text:
    how the kernel splits printed text into messages depends on timing (one run kept the
    heading of the next model apart, another sent it with the lines before)."""
    texts: list[str] = []
    for cell in nb.cells:
        stream = None
        for o in cell.get("outputs", []):
            if o.get("output_type") == "stream":
                if stream is not None and o.get("name") == stream:
                    texts[-1] += o.get("text", "")
                else:
                    texts.append(o.get("text", ""))
                stream = o.get("name")
                continue
            stream = None
            texts.append(o.get("text") or o.get("data", {}).get("text/plain", ""))
            if pngs and "image/png" in o.get("data", {}):
                texts.append("<png>")
    return texts


def test_scaling_notebook_runs_on_the_bench_database(bench_db, tmp_path, monkeypatch):
    monkeypatch.setenv("FLM_DB", bench_db.url)
    monkeypatch.setenv("FLM_WEAK_SWEEP", "tiny-weak")
    monkeypatch.setenv("FLM_STRONG_SWEEP", "tiny-strong")
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    out = "\n".join(_execute("scaling_efficiency", tmp_path))
    assert "w1a" in out and "s2-crash" not in out  # the weak runs' table
    assert "tiny-gpt tp1 pp1 mb2 fp32  weak" in out  # the weak-scaling table
    assert "1 completed, 1 failed" in out  # the strong table keeps the crashed run
    assert "cpu-local" in out and "step_time_mape_pct" in out  # the error table
    assert out.count("<png>") == 3  # weak, strong, predicted against measured


def test_planner_tour_notebook(tmp_path, monkeypatch):
    """Executed here; it ships with its outputs (a reader on the web sees them), and those must
    be what it prints today."""
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    shipped = _outputs(nbformat.read(REPO / "notebooks" / "planner_tour.ipynb", as_version=4))
    outputs = _execute("planner_tour", tmp_path)
    printed = [t for t in outputs if t != "<png>"]
    assert printed == shipped, (
        "notebooks/planner_tour.ipynb's saved outputs are stale: run it again with "
        "'jupyter execute --inplace planner_tour.ipynb' in notebooks/ (nbclient's command; "
        "the dev extra has no nbconvert)")
    out = "\n".join(outputs)
    assert out.count("Winner: ") == 3 and "=== gpt-1t ===" in out
    assert "params_gb" in out and "activations_gb" in out  # the memory breakdown table
    assert "nothing qualifies" in out  # the allocation cell: 20T tokens miss 120 days
    assert out.count("<png>") == 4  # three memory breakdowns and the allocation curve
