"""The layout has one owner (``specs/``): no consumer spells the layout's fields out, and the
six bugs that hand copies caused stay fixed, each tested through the consumer that had it.

Everything here is real code on real inputs (catalog models and systems, a real Optuna study in
memory, sweep files loaded by the sweep loader); nothing needs a process or a database.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import shlex
from pathlib import Path

import numpy as np
import optuna
import pandas as pd
import pytest

from frontier_llm.catalog import load_model, load_system
from frontier_llm.cli import build_parser, main
from frontier_llm.cli.layout_args import layout_from_args
from frontier_llm.errors import SpecError
from frontier_llm.jobs.sweepspec import load_sweep
from frontier_llm.report.frames import layout_rows
from frontier_llm.report.layouts import layouts_table
from frontier_llm.report.render import layouts_report
from frontier_llm.report.scaling import scaling_table
from frontier_llm.report.sources import with_catalog_breakdown
from frontier_llm.specs import axes
from frontier_llm.specs.forms import LAYOUT_COLUMNS, label, layout_from_row, layout_record
from frontier_llm.specs.layout import Layout, Sharding, zero_preset
from frontier_llm.specs.model import EXPERT_FIELDS
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
    # A trainer's log reader lists the layout fields that trainer's logs never print (they come
    # from --layout): a fact of the trainer's output, held by its round-trip test.
    "frontier_llm/trainers/deepspeed_log.py": "the fields DeepSpeed's logs never state",
    "frontier_llm/trainers/torchtitan_log.py": "the fields torchtitan's logs never state",
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
    """Bug 4: a DeepSpeed run gets DeepSpeed's memory breakdown, and a partial placement (HSDP)
    gets one at all (the hand-written rebuild dropped the engine and refused partial)."""
    model, system = load_model("tiny-gpt"), load_system("cpu-local")
    ds = Layout(dp=2, global_batch=4, dtype="fp32", engine="deepspeed", sharding=zero_preset(1))
    amsp = Layout(dp=4, global_batch=4, dtype="fp32",
                  sharding=Sharding.parse("p=partial:2,g=partial:2,o=partial:2"))
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
    # Micro-batch 4: tiny-gpt's peak at micro-batch 1 is its optimizer step (cost model 2.3),
    # where no activation is held under either recompute.
    layouts = [Layout(global_batch=4, micro_batch=4, dtype="fp32"),
               Layout(global_batch=4, micro_batch=4, dtype="fp32", recompute="full")]
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


# --- the layout's arithmetic has one owner: specs/axes.py -----------------------------------

DEGREES = {str(a) for a in axes.AXES}

# The places outside specs/ that may multiply degrees, and why each must.
PRODUCT_EXCEPTIONS = {
    "frontier_llm/planner/space.py": (
        "the vectorised enumeration builds each block's degrees before any layout exists: "
        "dp = N / (tp x cp) for every tp and cp candidate, and each block's sharding groups over "
        "its dp x cp ranks; its columns then become Layouts whose arithmetic is specs.axes'"),
}
# Products in files other engineers edit at the same time as this one (issue 36's trainer
# half); the lead replaces them with specs.axes at the merge. Not exceptions: a list to empty.
LEFT_TO_MERGE = {
}


def _degree(node: ast.AST) -> str | None:
    """The degree a name, an attribute or a string subscript stands for (``tp``, ``t.cp``,
    ``df["dp"]``), else None."""
    if isinstance(node, ast.Name):
        word = node.id
    elif isinstance(node, ast.Attribute):
        word = node.attr
    elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        word = node.slice.value
    else:
        return None
    return word if word in DEGREES else None


def _factors(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return _factors(node.left) + _factors(node.right)
    return [node]


def _chain(node: ast.AST) -> list[ast.AST]:
    """The multiplications one chain of factors is made of (``a * b * c`` is two BinOps)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return [node, *_chain(node.left), *_chain(node.right)]
    return []


def _degree_products(root: Path | None = None) -> list[tuple[str, int, str]]:
    """(file, line, 'tp*pp*dp') of every product of two or more degrees in the package
    outside specs/ (a chain of multiplications is one product)."""
    root = root or PACKAGE
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        if rel.startswith("frontier_llm/specs/"):
            continue
        inner: set[int] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult)) \
                    or id(node) in inner:
                continue
            factors = _factors(node)
            # Only the chain's own multiplications are this product; a product inside one of its
            # factors (a call's argument: ``x * f(tp * pp)``) is a product of its own.
            inner.update(id(n) for n in _chain(node) if n is not node)
            names = [d for d in map(_degree, factors) if d]
            if len(names) >= 2:
                found.append((rel, node.lineno, "*".join(names)))
    return found


def test_no_product_of_degrees_outside_specs():
    """World sizes, model-parallel sizes and shard ranks come from specs.axes (issue 36 counted
    16 hand-written products in 12 files; a degree added to specs missed several of them)."""
    assert len(PRODUCT_EXCEPTIONS) <= 2
    written = [p for p in _degree_products()
               if p[0] not in PRODUCT_EXCEPTIONS and p[0] not in LEFT_TO_MERGE]
    assert not written, f"ask specs.axes (world_size, shard_ranks, ...): {written}"


def test_the_scan_finds_a_product_of_degrees(tmp_path):
    """The check above can fail: names, attributes and a frame's columns are all found, and a
    product with one degree (tokens x tp) is not one."""
    pkg = tmp_path / "frontier_llm" / "report"
    pkg.mkdir(parents=True)
    (pkg / "world.py").write_text(
        "def f(layout, df, tokens, tp, pp):\n"
        "    a = layout.tp * layout.cp * layout.pp * layout.dp\n"
        "    b = df['dp'] * df['cp']\n"
        "    c = tokens * tp\n"
        "    return a, b, c, 2 * tp * pp\n"
        "def g(layout, n):\n"
        "    return n * max(1, layout.tp * layout.ep)\n")
    assert _degree_products(tmp_path / "frontier_llm") == [
        ("frontier_llm/report/world.py", 2, "tp*cp*pp*dp"),
        ("frontier_llm/report/world.py", 3, "dp*cp"),
        ("frontier_llm/report/world.py", 5, "tp*pp"),
        ("frontier_llm/report/world.py", 7, "tp*ep")]


# The consumers a degree must reach with no edit: budgets and curves, flm bench's traces, the
# store, the quickstart, report frames and the tuner.
CONSUMERS = ("frontier_llm/planner/allocation.py", "frontier_llm/cli/allocation.py",
             "frontier_llm/cli/plan.py", "frontier_llm/bench/run.py", "frontier_llm/bench/trace.py",
             "frontier_llm/store/ingest.py", "frontier_llm/store/schema.py",
             "frontier_llm/store/queries.py", "frontier_llm/quickstart/",
             "frontier_llm/report/frames.py", "frontier_llm/tune/space.py",
             "frontier_llm/tune/runcost.py")


def _hand_degree_uses(path: Path) -> list[tuple[int, str]]:
    """(line, what) where ``path`` multiplies degrees or lists two or more degrees or rank
    fields in one literal (the mesh's axes written out by hand). One degree used for its own
    meaning (dp halved along a weak-scaling series, the last pipeline stage) is no hand copy."""
    words = DEGREES | set(axes.RANK_FIELDS)
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult) and len(
                [f for f in _factors(node) if _degree(f)]) >= 2:
            out.append((node.lineno, "a product of degrees"))
        elif isinstance(node, ast.List | ast.Tuple | ast.Set | ast.Dict):
            named = {n.value for n in ast.walk(node) if isinstance(n, ast.Constant)
                     and isinstance(n.value, str) and n.value in words}
            if len(named) >= 2:
                out.append((node.lineno, f"lists {sorted(named)}"))
    return out


def test_consumers_get_degrees_only_through_the_owner():
    """The measure of issue 36: cp (or the next degree) reaches budgets, curves, traces, the
    store, the quickstart, report frames and the tuner with no edit there, because none of them
    multiplies degrees or lists the axes itself (the budget's tp x pp x dp, the curve's
    hand-listed columns, the trace's and the store's rank fields and the quickstart's per-rank
    batch did, and each missed cp)."""
    files = sorted({p for c in CONSUMERS for p in (REPO / c).parent.rglob("*.py")
                    if p.relative_to(REPO).as_posix().startswith(c)})
    assert len(files) >= len(CONSUMERS)
    hand = {p.relative_to(REPO).as_posix(): uses for p in files if (uses := _hand_degree_uses(p))}
    assert hand == {}


# --- specs.axes itself ------------------------------------------------------------------------

_MESH_LAYOUTS = [
    Layout(tp=2, cp=2, pp=2, dp=2, global_batch=4),
    Layout(tp=2, cp=2, pp=1, dp=4, global_batch=4, sharding=Sharding.parse("zero3")),
    Layout(tp=1, cp=4, pp=2, dp=4, global_batch=8,
           sharding=Sharding.parse("p=partial:8,g=partial:8,o=partial:8")),
    Layout(tp=4, pp=3, dp=2, global_batch=6),
]


@pytest.mark.parametrize("layout", _MESH_LAYOUTS, ids=label)
def test_a_rank_and_the_rank_one_stride_on_are_neighbours_along_that_axis(layout):
    """rank_stride is the distance the cost model prices a pipeline hop over: the rank that far
    on differs from this one in that axis's index alone, by one."""
    for axis in axes.MESH_ORDER:
        stride = axes.rank_stride(layout, axis)
        here = axes.coords(0, layout)
        if axes.degree(layout, axis) > 1:
            there = axes.coords(stride, layout)
            # ep re-folds the dp x cp index, so it may move with them.
            moved = {k for k in here if here[k] != there[k]} - {str(axes.Axis.EP)}
            assert moved == {str(axis)}, (axis, here, there)
            assert there[str(axis)] == here[str(axis)] + 1


@pytest.mark.parametrize("layout", _MESH_LAYOUTS, ids=label)
def test_axes_number_ranks_as_flm_benchs_mesh(layout):
    """Every rank's coordinates from specs.axes are those of flm bench's DeviceMesh (its five
    dimensions, dp split into replicate x shard), and rank_of inverts them."""
    from frontier_llm.bench.mesh import mesh_dims

    dims = mesh_dims(layout)
    assert dims.world_size == layout.world_size == axes.world_size(layout)
    assert dims.shard_ranks == layout.shard_ranks == layout.dp * layout.cp
    for rank in range(layout.world_size):
        mine, bench = axes.coords(rank, layout), dims.coords(rank)
        assert mine == {a: bench[a] for a in DEGREES}
        assert axes.rank_of(mine, layout) == rank
    with pytest.raises(ValueError, match="outside a world"):
        axes.coords(layout.world_size, layout)


def test_axes_arithmetic_on_layouts_tables_frames_and_rows():
    from frontier_llm.costmodel.layouts import from_configs

    layouts = [Layout(tp=8, cp=8, pp=4, dp=4, global_batch=16),
               Layout(tp=2, pp=2, dp=3, global_batch=6)]
    table = from_configs(layouts)
    np.testing.assert_array_equal(table.world_size, [1024, 12])
    np.testing.assert_array_equal(table.shard_ranks, [32, 3])
    # A frame from before cp (no column) and one with rows from before it (empty cp): cp 1.
    old = pd.DataFrame({"tp": [8, 2], "pp": [4, 2], "dp": [4, 3]})
    np.testing.assert_array_equal(axes.frame_world_size(old), [128, 12])
    mixed = old.assign(cp=[8, np.nan])
    np.testing.assert_array_equal(axes.frame_world_size(mixed), [1024, 12])
    assert [axes.world_size(row) for _, row in mixed.iterrows()] == [1024, 12]
    assert axes.model_parallel_size(layouts[0]) == 256
    assert axes.data_parallel_for(1024, {"tp": 8, "cp": 8, "pp": 4}) == 4
    assert axes.data_parallel_for(1000, {"tp": 8, "cp": 8, "pp": 4}) is None
    assert axes.RANK_FIELDS == ("tp_rank", "cp_rank", "pp_stage", "dp_rank", "ep_rank")
    assert axes.rank_fields({"tp": 1, "pp": 2}) == {"tp_rank": 1, "cp_rank": 0, "pp_stage": 2,
                                                     "dp_rank": 0, "ep_rank": 0}
    assert " ".join(axes.label_parts(layouts[0])) == "tp8 cp8 pp4 dp4"
    assert " ".join(axes.label_parts(layouts[1])) == "tp2 pp2 dp3"
    assert label(layouts[0]).startswith("tp8 cp8 pp4 dp4 mb1 gb16")
    assert label(layouts[1], omit=("dp", "global_batch")) == "tp2 pp2 mb1"


def test_expert_parallelism_refolds_ranks_and_adds_no_gpus():
    """ep re-folds the dp x cp ranks (Megatron-Core's expert-tp x ep x expert-dp): the world,
    the model-parallel size and the data-parallel degree for a GPU count stay the dense
    layout's; the expert-dp and each rank's ep index follow; a frame without ep is at ep 1."""
    moe = Layout(tp=2, cp=2, pp=2, dp=4, ep=4, global_batch=8)
    dense = Layout(tp=2, cp=2, pp=2, dp=4, global_batch=8)
    assert axes.world_size(moe) == axes.world_size(dense) == 32
    assert axes.model_parallel_size(moe) == 8
    assert axes.data_parallel_for(32, moe) == 4
    assert axes.expert_data_parallel(moe) == 2  # dp x cp / ep = 8 / 4
    # ep takes runs of ep consecutive (dp, cp) indices, cp fastest, inside one pipeline stage.
    index = [axes.coords(r, moe) for r in range(axes.world_size(moe))]
    for r, c in enumerate(index):
        assert c["ep"] == (c["dp"] * 2 + c["cp"]) % 4
        assert axes.rank_of(c, moe) == r  # ep is implied by the others
    groups = {}
    for c in index:
        key = (c["pp"], c["tp"], (c["dp"] * 2 + c["cp"]) // 4)
        groups.setdefault(key, []).append(c["ep"])
    assert all(sorted(g) == [0, 1, 2, 3] for g in groups.values())
    np.testing.assert_array_equal(axes.expert_data_parallel(
        pd.DataFrame({"dp": [4, 8], "cp": [2, 1]})), [8, 8])  # no ep column: ep 1
    assert " ".join(axes.label_parts(moe)) == "tp2 cp2 pp2 dp4 ep4"
    assert " ".join(axes.label_parts(dense)) == "tp2 cp2 pp2 dp4"
    with pytest.raises(SpecError, match="ep \\(3\\) does not divide dp x cp"):
        Layout(tp=2, cp=2, dp=4, ep=3, global_batch=8)


# --- the defects of issue 36 that hand-written products caused -------------------------------

_CP8 = ["--model", "gpt-175b", "--system", "frontier", "--seq-len", "131072", "--tp", "8",
        "--cp", "8", "--pp", "4"]


def _budget_checks(row: dict) -> None:
    """A budget of the tp 8 cp 8 pp 4 dp 4 layout counts 1,024 GCDs on 128 nodes."""
    system = load_system("frontier")
    assert row["nodes"] == 128
    seconds = row["steps"] * row["step_time_s"]
    assert row["gpu_hours"] == pytest.approx(1024 * seconds / 3600)
    assert row["node_hours"] == pytest.approx(128 * seconds / 3600)
    p = system.power
    watts = p.utilisation * p.device_w * 1024 + p.host_w * 128
    assert row["energy_kwh"] == pytest.approx(watts * seconds / 3.6e6)


def test_predict_budget_counts_a_cp_layouts_nodes(capsys):
    """Defect (a), flm predict: gpt-175b tp 8 cp 8 pp 4 dp 4 at 131,072 tokens on Frontier is
    1,024 GCDs = 128 nodes (it was budgeted as tp x pp x dp = 128 GCDs on 16 nodes, node-hours,
    GPU-hours and energy 8x too small)."""
    assert main(["predict", *_CP8, "--dp", "4", "--global-batch", "64", "--tokens", "1T",
                 "--format", "json"]) in (0, 1)
    _budget_checks(json.loads(capsys.readouterr().out))


def test_plan_budget_counts_a_cp_layouts_nodes(capsys):
    """Defect (a), flm plan --tokens: every listed row of the cp 8 plan on 1,024 GCDs."""
    main(["plan", *_CP8, "--gpus", "1024", "--tokens", "1T", "--top", "3", "--format", "json"])
    rows = json.loads(capsys.readouterr().out)["layouts"]
    assert rows and all(r["cp"] == 8 and r["dp"] == 4 for r in rows)
    for row in rows:
        _budget_checks(row)


def test_plan_curve_shows_cp(capsys):
    """Defect (b), flm plan --curve: the table's layout columns are derived (specs.forms), so
    a curve of cp 8 layouts says cp 8 (it showed 'tp 8 pp 4 dp 4' on 1,024 GPUs)."""
    main(["plan", *_CP8, "--curve", "512-1024", "--tokens", "1T"])
    lines = [ln.split() for ln in capsys.readouterr().out.splitlines() if not ln.startswith("#")]
    header = lines[0]
    rows = {int(r[0]): dict(zip(header, r, strict=False)) for r in lines[1:]}
    assert rows[1024]["cp"] == "8" and rows[1024]["dp"] == "4" and rows[1024]["nodes"] == "128"
    assert rows[512]["cp"] == "8" and rows[512]["dp"] == "2"


def test_collect_stores_each_ranks_cp_rank(tmp_path):
    """Defect (c), flm collect: a cp 2 trace's cp_rank reaches the store's flm_rank_memory
    (it was dropped); a trace without the field (cp 1, or from before cp) stores index 0."""
    from store_fixtures import make_trace

    from frontier_llm.bench.trace import write_trace
    from frontier_llm.store import open_store
    from frontier_llm.store.ingest import collect
    from frontier_llm.store.queries import rank_memory_frame

    with_cp = make_trace("cp2", tp=2, cp=2, dp=1, global_batch=2)
    old = make_trace("old", tp=2, dp=1, global_batch=2)
    for m in old["memory"]:
        del m["cp_rank"]
    write_trace(tmp_path / "cp2", with_cp)
    write_trace(tmp_path / "old", old)
    store = open_store(f"sqlite:///{tmp_path / 'cp.db'}")
    try:
        assert collect(store, [tmp_path / "cp2", tmp_path / "old"]).inserted == 2
        frame = rank_memory_frame(store).set_index(["run_id", "rank"]).sort_index()
    finally:
        store.close()
    cp2 = frame.loc["cp2"]
    assert cp2["cp_rank"].tolist() == [0, 0, 1, 1] and cp2["tp_rank"].tolist() == [0, 1, 0, 1]
    assert frame.loc["old", "cp_rank"].tolist() == [0, 0]


def test_a_dense_layouts_identity_is_unchanged_by_the_expert_fields():
    """The MoE fields of a dense model take no part in its layout hash (a dense layout stored
    before them keeps its row, and a trace that omits them names the same row); an MoE model's
    do, and two expert counts are two layouts."""
    from frontier_llm.specs.identity import layout_hash

    model, layout = load_model("tiny-gpt"), Layout(dp=2, global_batch=4)
    dense = {k: v for k, v in model.to_dict().items() if k not in EXPERT_FIELDS}
    assert layout_hash(model, "cpu-local", layout) == layout_hash(dense, "cpu-local", layout)
    moe = dataclasses.replace(model, num_experts=4, top_k=2)
    other = dataclasses.replace(model, num_experts=8, top_k=2)
    assert len({layout_hash(m, "cpu-local", layout) for m in (model, moe, other)}) == 3
