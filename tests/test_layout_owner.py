"""The layout has one owner (``specs/``): no consumer spells the layout's fields out, and the
six bugs that hand copies caused stay fixed, each tested through the consumer that had it.

Everything here is real code on real inputs (catalog models and systems, a real Optuna study in
memory, sweep files loaded by the sweep loader); nothing needs a process or a database.
"""

from __future__ import annotations

import ast
import dataclasses
import shlex
from pathlib import Path

import numpy as np
import optuna
import pandas as pd
import pytest

from frontier_llm.catalog import load_model, load_system
from frontier_llm.cli import build_parser
from frontier_llm.cli.layout_args import layout_from_args
from frontier_llm.jobs.sweepspec import load_sweep
from frontier_llm.report.frames import layout_rows
from frontier_llm.report.layouts import layouts_table
from frontier_llm.report.render import layouts_report
from frontier_llm.report.scaling import scaling_table
from frontier_llm.report.sources import with_catalog_breakdown
from frontier_llm.specs.forms import LAYOUT_COLUMNS, label, layout_from_row, layout_record
from frontier_llm.specs.layout import Layout, Sharding, zero_preset
from frontier_llm.tune import optuna_study as osx
from frontier_llm.tune.report import best_document

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "frontier_llm"
FIELDS = {f.name for f in dataclasses.fields(Layout)} | {"zero", "zero_stage"}

# The places outside specs/ that may spell four or more layout fields in one literal, and why
# each must (at most three).
ALLOWED = {
    "frontier_llm/planner/space.py": (
        "the vectorised enumeration: the knobs with rules of their own (degrees per block, the "
        "schedule with its interleaving depths, sequence parallelism only with tp > 1, the "
        "sharding's six columns, the engine's model rules) are built column by column; every "
        "other knob is enumerated generically"),
}


def _hand_spellings() -> list[tuple[str, int, list[str]]]:
    """(file, line, fields) of every list, tuple, set or dict literal of the package, outside
    specs/, that names four or more layout fields."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith("frontier_llm/specs/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.List | ast.Tuple | ast.Set):
                elts = node.elts
            elif isinstance(node, ast.Dict):
                elts = [k for k in node.keys if k is not None]
            else:
                continue
            names = {e.value for e in elts if isinstance(e, ast.Constant)
                     and isinstance(e.value, str)} & FIELDS
            if len(names) >= 4:
                found.append((rel, node.lineno, sorted(names)))
    return found


def test_no_module_outside_specs_spells_the_layout_out():
    assert len(ALLOWED) <= 3
    spelled = [h for h in _hand_spellings() if h[0] not in ALLOWED]
    assert not spelled, ("derive these from specs (forms.LAYOUT_KEY, key_columns, "
                         f"layout_records, label, specs.space): {spelled}")


def test_the_scan_finds_a_hand_spelling(tmp_path, monkeypatch):
    """The check above can fail: a module with such a literal is reported."""
    pkg = tmp_path / "frontier_llm" / "report"
    pkg.mkdir(parents=True)
    (pkg / "copy.py").write_text('KEYS = ("tp", "pp", "dp", "micro_batch")\n')
    monkeypatch.setattr(__import__(__name__), "PACKAGE", tmp_path / "frontier_llm")
    monkeypatch.setattr(__import__(__name__), "REPO", tmp_path)
    assert _hand_spellings() == [("frontier_llm/report/copy.py", 1,
                                  ["dp", "micro_batch", "pp", "tp"])]


# The places that give a knob a meaning: its field and rules, the cost model's terms, the
# planner's enumeration of the knobs with rules of their own, each engine's implementation
# (flm bench) and each trainer's codec (flm export's flags, the log parsers' arguments), the
# store's migrations.
MEANING = ("frontier_llm/specs/", "frontier_llm/costmodel/", "frontier_llm/planner/space.py",
           "frontier_llm/bench/", "frontier_llm/export/", "frontier_llm/trainers/",
           "frontier_llm/logs/", "frontier_llm/store/migrations/")


def test_a_knob_is_named_only_where_it_has_a_meaning():
    """``virtual_stages`` reaches only the files that give it meaning (it was named in 20
    package files, report and tune among them); the report, tune, quickstart, sweep, CLI and
    planner consumers derive it."""
    naming = sorted(p.relative_to(REPO).as_posix() for p in PACKAGE.rglob("*.py")
                    if "virtual_stages" in p.read_text())
    assert [n for n in naming if not n.startswith(MEANING)] == []
    assert len([n for n in naming if not n.startswith((
        "frontier_llm/export/", "frontier_llm/trainers/", "frontier_llm/logs/"))]) <= 8, naming


# --- the six bugs ---------------------------------------------------------------------------

def _study_with_winner(layout: Layout) -> optuna.Study:
    study = optuna.create_study(direction="maximize", study_name="owner")
    entry = layout.to_dict()
    entry.pop("zero_stage")
    study.add_trial(optuna.trial.create_trial(
        params={}, distributions={}, values=[123.0],
        user_attrs={osx.A_OUTCOME: "measured", osx.A_LAYOUT: entry}))
    return study


def test_tune_best_prints_the_winners_engine_and_sharding():
    """Bug 1: the flm bench command of a DeepSpeed winner reruns it on DeepSpeed, with its
    sharding, read back by flm bench's own parser into the same layout."""
    winner = Layout(dp=2, global_batch=4, engine="deepspeed", sharding=zero_preset(1))
    doc = best_document(_study_with_winner(winner))
    argv = shlex.split(doc["flm_bench"])
    assert argv[argv.index("--engine") + 1] == "deepspeed"
    args = build_parser().parse_args(["bench", "--model", "tiny-gpt", *argv])
    assert layout_from_args(args) == winner


def test_layout_rows_carry_the_engine():
    """Bug 2: one layout on two engines is two rows that say which is which."""
    model, system = load_model("tiny-gpt"), load_system("cpu-local")
    base = Layout(dp=2, global_batch=4, sharding=zero_preset(1), dtype="fp32")
    rows = layout_rows(model, system, [base, dataclasses.replace(base, engine="deepspeed")])
    assert list(rows["engine"]) == ["native", "deepspeed"]
    assert rows[list(LAYOUT_COLUMNS)].drop_duplicates().shape[0] == 2


def _run(step_time: float, engine: str, dp: int = 1, run_id: str | None = None) -> dict:
    layout = Layout(dp=dp, global_batch=4, dtype="fp32", engine=engine)
    return {"run_id": run_id or f"{engine}-{dp}-{step_time}", "status": "completed",
            "model": "tiny-gpt", "system": "cpu-local", **layout_record(layout),
            "world_size": dp, "seq_len": 32, "step_time_s": step_time,
            "tokens_per_s": 4 * 32 / step_time, "peak_memory_bytes": 1e6,
            "predicted_step_time_s": step_time, "predicted_peak_memory_bytes": 1e6}


def test_layouts_and_scaling_keep_engines_apart():
    """Bug 3: a native run of 1.0 s and a DeepSpeed run of 3.0 s of one layout are two rows,
    each at its own median, in the layouts table and as two scaling series."""
    runs = pd.DataFrame([_run(1.0, "native"), _run(3.0, "deepspeed"),
                         _run(0.6, "native", dp=2), _run(1.8, "deepspeed", dp=2)])
    table = layouts_table(runs[runs["dp"] == 1])
    per_gpu = dict(zip(table["engine"], table["tokens_per_s_per_gpu"], strict=True))
    assert per_gpu == pytest.approx({"native": 128.0, "deepspeed": 128 / 3})
    assert table["layout"].nunique() == 2
    scaling = scaling_table(runs)
    assert scaling["series"].nunique() == 2
    assert set(scaling.loc[scaling["gpus"] == 1, "step_time_s"]) == {1.0, 3.0}


def test_catalog_breakdown_is_the_runs_own_layout():
    """Bug 4: a DeepSpeed run gets DeepSpeed's memory breakdown, and an AMSP partial placement
    gets one at all (the hand-written rebuild dropped the engine and refused partial)."""
    model, system = load_model("tiny-gpt"), load_system("cpu-local")
    ds = Layout(dp=2, global_batch=4, dtype="fp32", engine="deepspeed", sharding=zero_preset(1))
    amsp = Layout(dp=4, global_batch=4, dtype="fp32",
                  sharding=Sharding.parse("p=replicate,g=partial:2,o=full"))
    runs = pd.DataFrame([{**_run(1.0, "native", run_id="a"), **layout_record(ds)},
                         {**_run(1.0, "native", run_id="b"), **layout_record(amsp)}])
    out = with_catalog_breakdown(runs)
    expected = layout_rows(model, system, [ds, amsp])
    parts = [c for c in expected if c.startswith("mem_")]
    assert parts and out[parts].notna().all().all()
    np.testing.assert_allclose(out[parts].to_numpy(float), expected[parts].to_numpy(float))
    assert [layout_from_row(r) for _, r in out.iterrows()] == [ds, amsp]


def test_memory_breakdown_is_attributed_to_its_own_layout(tmp_path):
    """Bug 5: two layouts that differ only in recompute keep their own memory breakdown in the
    layouts report (the merge on tp, pp, dp, micro-batch, global batch collapsed them)."""
    model, system = load_model("tiny-gpt"), load_system("cpu-local")
    layouts = [Layout(global_batch=4, dtype="fp32"),
               Layout(global_batch=4, dtype="fp32", recompute="full")]
    frame = layout_rows(model, system, layouts)
    frame["status"], frame["run_id"] = "predicted", None
    for c in ("step_time_s", "tokens_per_s", "peak_memory_bytes"):
        frame[c] = np.nan
    layouts_report(frame, tmp_path, "two", require_measured=False)
    breakdown = pd.read_csv(tmp_path / "two-memory.csv")
    assert sorted(breakdown["layout"]) == sorted(label(x) for x in layouts)
    by_label = breakdown.set_index("layout")["activations_gb"]
    for layout, row in zip(layouts, frame.itertuples(), strict=True):
        assert by_label[label(layout)] == pytest.approx(row.mem_activations_bytes / 1e9)
    assert by_label.nunique() == 2


def test_a_sweep_layout_entry_fills_like_flm_bench(tmp_path):
    """Bug 6: {pp: 2, virtual_stages: 2} means the interleaved schedule in a sweep file as it
    does on flm bench's command line (one fill rule: complete_layout)."""
    text = ("name: fill\nmodel: tiny-gpt-8l\nsystem: cpu-local\nexecutor: local\n"
            "gpus_per_node: 4\ndtype: fp32\nglobal_batch: 4\nlayouts:\n"
            "  - {pp: 2, virtual_stages: 2}\n")
    sweep = load_sweep(tmp_path / "fill.yaml", text=text)
    args = build_parser().parse_args(["bench", "--model", "tiny-gpt-8l", "--dtype", "fp32",
                                      "--pp", "2", "--global-batch", "4",
                                      "--virtual-stages", "2"])
    assert sweep.jobs[0].layout == layout_from_args(args)
    assert sweep.jobs[0].layout.schedule == "interleaved"
