"""The Python API (frontier_llm/api.py, docs/api.md) against the command line it wraps: the same
numbers as ``flm plan|predict|results|validate|export`` print, a cheap ``import frontier_llm``,
and a reference page built from the docstrings that names every public function."""

from __future__ import annotations

import inspect
import json
import math
import subprocess
import sys
import warnings

import pandas as pd
import pytest
from store_fixtures import make_trace

import frontier_llm as flm
from frontier_llm import api
from frontier_llm.cli import main
from frontier_llm.errors import UserError
from frontier_llm.report.paper import REPO
from frontier_llm.store.ingest import TRACE_SUFFIX


def _cli_json(capsys, argv: list[str]) -> dict:
    capsys.readouterr()
    main(argv)
    return json.loads(capsys.readouterr().out)


def _same(a, b, path: str = "") -> None:
    """Equal JSON values: floats to 1e-9 relative (JSON writes them with repr, so they come
    back exact; the tolerance only absorbs numpy's float32 columns), NaN and None alike."""
    if isinstance(a, dict):
        assert set(a) == set(b), f"{path}: keys differ: {set(a) ^ set(b)}"
        for k in a:
            _same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), f"{path}: {len(a)} != {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{path}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        if a is None or b is None or math.isnan(a) or math.isnan(b):
            assert (a is None or math.isnan(a)) and (b is None or math.isnan(b)), path
        else:
            assert a == pytest.approx(b, rel=1e-9), path
    else:
        assert a == b, path


def _records(frame: pd.DataFrame) -> list[dict]:
    """A frame as flm's JSON writes it (json.dumps with default=str), read back."""
    return json.loads(json.dumps(frame.to_dict(orient="records"), default=str))


def test_every_public_name_is_documented_and_typed():
    assert flm.__all__ == api.__all__  # the package's lazy names are the API's
    for name in api.__all__:
        fn = getattr(flm, name)
        assert fn is getattr(api, name)
        assert inspect.getdoc(fn) and len(inspect.getdoc(fn)) > 60, name
        sig = inspect.signature(fn)
        assert sig.return_annotation is not inspect.Signature.empty, f"{name}: no return type"
        bare = [p for p in sig.parameters.values() if p.annotation is inspect.Parameter.empty]
        assert not bare, f"{name}: {[p.name for p in bare]} have no type"
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        _ = flm.nothing


def test_import_is_cheap_and_plan_does_not_load_torch():
    code = ("import sys; import frontier_llm as flm\n"
            "print(sorted(m for m in ('pandas', 'numpy', 'torch', 'frontier_llm.api')"
            " if m in sys.modules))\n"
            "flm.plan('gpt-22b', 'frontier', 16, top=1)\n"
            "print('torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=REPO).stdout.splitlines()
    assert out == ["[]", "False"]


def test_plan_is_flm_plan_json(capsys):
    doc = _cli_json(capsys, ["plan", "--model", "gpt-22b", "--system", "frontier", "--gpus",
                             "64", "--tokens", "1T", "--engine", "megatron,native", "--top",
                             "7", "--format", "json"])
    ranked = flm.plan("gpt-22b", "frontier", 64, tokens=1e12,
                      engine=["megatron", "native"], top=7)
    assert len(ranked) == 7
    _same(_records(ranked), doc["layouts"], "layouts")
    for key in ("model", "system", "gpus", "global_batch", "evaluated", "rejected",
                "interval_confidence", "tokens"):
        _same(ranked.attrs[key], doc[key], key)


def test_plan_restrictions_and_options_are_the_flags(capsys):
    doc = _cli_json(capsys, ["plan", "--model", "gpt-175b", "--system", "frontier", "--gpus",
                             "1024", "--tp", "4,8", "--zero", "1", "--seq-len", "4096",
                             "--global-batch", "512", "--confidence", "0.9", "--risk-aware",
                             "--top", "5", "--format", "json"])
    ranked = flm.plan("gpt-175b", gpus=1024, tp=[4, 8], zero=1, seq_len=4096,
                      global_batch=512, confidence=0.9, risk_aware=True, top=5)
    _same(_records(ranked), doc["layouts"], "layouts")
    assert set(ranked["tp"]) <= {4, 8} and ranked.attrs["global_batch"] == 512


def test_predict_is_flm_predict_json(capsys):
    flags = ["--tp", "8", "--pp", "16", "--dp", "8", "--micro-batch", "1", "--global-batch",
             "1024", "--recompute", "selective", "--sequence-parallel"]
    doc = _cli_json(capsys, ["predict", "--model", "gpt-175b", "--system", "frontier", *flags,
                             "--tokens", "300B", "--format", "json"])
    out = flm.predict("gpt-175b", "frontier", tp=8, pp=16, dp=8, micro_batch=1,
                      global_batch=1024, recompute="selective", sequence_parallel=True,
                      tokens=300e9)
    _same(json.loads(json.dumps(out, default=str)), doc)
    # The same prediction from a Layout object.
    lay = flm.layout(tp=8, pp=16, dp=8, micro_batch=1, global_batch=1024,
                     recompute="selective", sequence_parallel=True)
    assert flm.predict("gpt-175b", "frontier", lay)["step_time_s"] == doc["step_time_s"]


def test_allocation_is_flm_plan_curve_json(capsys):
    argv = ["plan", "--model", "gpt-22b", "--system", "frontier", "--tokens", "1T",
            "--deadline", "90d", "--curve", "8-64", "--format", "json"]
    capsys.readouterr()
    code = main(argv)
    doc = json.loads(capsys.readouterr().out)
    cur = flm.allocation("gpt-22b", "frontier", tokens=1e12, gpus=(8, 64), deadline_days=90)
    _same(_records(cur.astype(object).where(cur.notna(), None)), doc["curve"], "curve")
    _same(cur.attrs["selection"], doc["selection"], "selection")
    assert (cur.attrs["selection"]["gpus"] is not None) == (code == 0)


def test_allocation_refuses_a_deadline_without_tokens_in_its_own_words():
    with pytest.raises(UserError, match=r"^deadline_days and max_node_hours need tokens"):
        flm.allocation("gpt-22b", deadline_days=90)


def test_allocation_refuses_risk_aware_it_cannot_honour():
    with pytest.raises(UserError, match=r"^risk_aware ranks one GPU count's layouts .* "
                                        r"plan\(gpus=N, risk_aware=True\)$"):
        flm.allocation("gpt-22b", "dgx-h100", risk_aware=True)


@pytest.mark.parametrize(("restrict", "message"), [
    ({"tp": "x"},
     r"^tp= takes one value or a list of whole numbers of at least 1 \(got \('x',\)\)$"),
    ({"engine": "jax"}, r"^engine= takes one value or a list of native, "),
    ({"zero": 4}, r"^zero= takes one value or a list of 0, 1, 2, 3"),
    ({"tensor_parallel": 8}, r"^unknown restriction tensor_parallel= \(knobs: zero, "),
])
def test_plan_refuses_a_bad_restriction_in_one_line(restrict, message):
    with pytest.raises(UserError, match=message):
        flm.plan("gpt-22b", "frontier", 16, **restrict)


def test_explain_and_memory_are_the_plans():
    text = flm.explain("gpt-22b", "frontier", 16)
    best = flm.plan("gpt-22b", "frontier", 16, top=1).iloc[0]
    assert "Winner: " in text
    memory = flm.plan_memory("gpt-22b", "frontier", 16, top=3)
    assert len(memory) == 3
    parts = memory[[c for c in memory if c.endswith("_gb") and not c.startswith(
        ("predicted", "device", "measured"))]].sum(axis=1)
    # The fastest layout's parts add up to the plan's peak memory.
    assert parts.iloc[0] * 1e9 == pytest.approx(best["peak_memory_bytes"], rel=0.02)


def _write_traces(folder, traces) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for t in traces:
        (folder / f"{t['run_id']}{TRACE_SUFFIX}").write_text(json.dumps(t))


def test_runs_from_a_folder_of_traces_are_flm_results(tmp_path, capsys):
    traces = [make_trace(f"r{n}", dp=n, global_batch=2 * n, seed=n,
                         labels={"sweep": "weak"}) for n in (1, 2, 4)]
    runs_dir = tmp_path / "runs"
    _write_traces(runs_dir, traces)
    broken = runs_dir / f"broken{TRACE_SUFFIX}"
    broken.write_text("{not json")
    # The folder is only read: the broken trace is a warning, and stays where it was.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from_folder = flm.runs(runs_dir)
    assert [str(w.message) for w in caught if "trace not read" in str(w.message)] == [
        f"trace not read: {broken}: not valid JSON: "
        "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"]
    assert broken.exists() and sorted(p.name for p in runs_dir.iterdir()) == sorted(
        [broken.name] + [f"r{n}{TRACE_SUFFIX}" for n in (1, 2, 4)])
    db = f"sqlite:///{tmp_path}/flm.db"
    main(["collect", str(runs_dir), "--db", db, "--quarantine", str(tmp_path / "q")])
    capsys.readouterr()
    doc = _cli_json(capsys, ["results", "--db", db, "--format", "json"])
    from_db = flm.runs(db)
    for frame in (from_db, from_folder):
        shown = frame.copy()
        for c in ("started_at", "finished_at"):
            shown[c] = shown[c].map(lambda t: t.isoformat() if pd.notna(t) else None)
        _same(json.loads(shown.to_json(orient="records")), doc)
    assert sorted(from_folder["run_id"]) == ["r1", "r2", "r4"]
    # flm validate's rows, and the scaling frame the report draws.
    val = flm.validation(db)
    _same(_records(val),
          _cli_json(capsys, ["validate", "--db", db, "--format", "json"])["runs"])
    table = flm.scaling_table(from_folder, mode="weak")
    assert table["gpus"].tolist() == [1, 2, 4] and table["measured_efficiency_pct"].iloc[0] == 100
    errors = flm.error_table(val)
    assert int(errors.iloc[-1]["runs"]) == 3


def test_runs_refuse_a_missing_database_in_one_line(tmp_path):
    with pytest.raises(UserError, match="no database at"):
        flm.runs(f"sqlite:///{tmp_path}/none.db")


def test_export_layout_is_flm_export(capsys):
    lay = flm.layout(tp=8, pp=16, dp=8, micro_batch=1, global_batch=1024, engine="megatron")
    capsys.readouterr()
    main(["export", "--to", "megatron-lm", "--model", "gpt-175b", "--system", "frontier",
          "--tp", "8", "--pp", "16", "--dp", "8", "--micro-batch", "1", "--global-batch",
          "1024", "--engine", "megatron"])
    printed = capsys.readouterr().out
    assert flm.export_layout("megatron-lm", "gpt-175b", lay, "frontier").strip() == \
        printed.strip()


def test_figures_come_back_as_figures(tmp_path):
    cur = flm.allocation("gpt-22b", tokens=1e12, gpus=(8, 64), deadline_days=90)
    fig = flm.plot_allocation(cur, deadline_days=90, gpu_label="GCDs", title="gpt-22b")
    memory = flm.plot_memory(flm.plan_memory("gpt-22b", "frontier", 16, top=3), "memory")
    paths = flm.save_figure(fig, tmp_path, "curve") + flm.save_figure(memory, tmp_path, "mem")
    assert [p.suffix for p in paths] == [".png", ".pdf", ".png", ".pdf"]
    assert all(p.stat().st_size > 5000 for p in paths)


def test_reference_page_builds_and_names_every_public_function(tmp_path):
    """docs/api.md's reference: pdoc (the docs extra, also in dev) renders it from the
    docstrings; built here, so that a renamed or undocumented function breaks the test."""
    subprocess.run([sys.executable, "-m", "pdoc", "frontier_llm.api", "-o", str(tmp_path)],
                   check=True, cwd=REPO, capture_output=True, text=True)
    page = (tmp_path / "frontier_llm" / "api.html").read_text()
    for name in api.__all__:
        assert f'id="{name}"' in page, name
    # docs/api.md lists the same names (a guide that matches the reference).
    guide = (REPO / "docs" / "api.md").read_text()
    missing = [n for n in api.__all__ if f"`flm.{n}" not in guide]
    assert not missing, f"docs/api.md does not mention {missing}"


@pytest.mark.parametrize("name", ["planner_tour", "scaling_efficiency"])
def test_notebooks_use_only_the_api(name):
    """The notebooks import the package's top level, never a submodule: what they show is what
    the API offers (tests/test_report_bench.py executes them)."""
    import ast

    nb = json.loads((REPO / "notebooks" / f"{name}.ipynb").read_text())
    code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    used = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            used += [(a.name, a.asname) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            used += [(f"{node.module}.{a.name}", a.asname) for a in node.names]
    ours = [u for u in used if u[0].split(".")[0] == "frontier_llm"]
    assert ours == [("frontier_llm", "flm")]
    assert all(n.split(".")[0] in sys.stdlib_module_names for n, _ in used if (n, _) not in ours)
    assert "flm." in code


def test_tp_comm_overlap_is_the_flag_in_plan_predict_and_export(capsys):
    """``tp_comm_overlap`` is --tp-comm-overlap: the same prediction as the flag, the step
    flm.plan ranks for the layout with it, a shorter step on dgx-h100 (tp_overlap 1.0), a
    UserError where Megatron-LM would not run it (no sequence parallelism) or for a value that
    is not a bool, and the export of the run priced (--tp-comm-overlap in the command)."""
    fields = dict(tp=4, pp=8, dp=8, micro_batch=2, global_batch=2048, zero=1,
                  sequence_parallel=True, engine="megatron", recompute="none")
    flags = ["--tp", "4", "--pp", "8", "--dp", "8", "--micro-batch", "2", "--global-batch",
             "2048", "--zero", "1", "--sequence-parallel", "--engine", "megatron",
             "--recompute", "none"]
    doc = _cli_json(capsys, ["predict", "--model", "gpt-175b", "--system", "dgx-h100", *flags,
                             "--tp-comm-overlap", "on", "--format", "json"])
    on = flm.predict("gpt-175b", "dgx-h100", tp_comm_overlap=True, **fields)
    _same(json.loads(json.dumps(on, default=str)), doc)
    off = flm.predict("gpt-175b", "dgx-h100", **fields)
    assert on["step_time_s"] < off["step_time_s"] - 1.0
    with pytest.raises(UserError, match="only when sequence parallelism is enabled"):
        flm.predict("gpt-175b", "dgx-h100", tp_comm_overlap=True,
                    **{**fields, "sequence_parallel": False})
    with pytest.raises(UserError, match="tp_comm_overlap must be True or False"):
        flm.predict("gpt-175b", "dgx-h100", tp_comm_overlap="on", **fields)
    restrict = dict(gpus=256, tp=4, pp=8, micro_batch=2, global_batch=2048, zero=1,
                    sequence_parallel=True, recompute="none", engine="megatron",
                    schedule="1f1b", include_oom=True, all_layouts=True, top=1)
    ranked_on = flm.plan("gpt-175b", "dgx-h100", tp_comm_overlap=True, **restrict)
    ranked_off = flm.plan("gpt-175b", "dgx-h100", **restrict)
    assert ranked_on["step_time_s"].iloc[0] == pytest.approx(on["step_time_s"], rel=1e-9)
    assert ranked_off["step_time_s"].iloc[0] == pytest.approx(off["step_time_s"], rel=1e-9)
    lay = flm.layout(**fields)
    assert "tp-comm-overlap" not in flm.export_layout("megatron-lm", "gpt-175b", lay)
    assert "\n--tp-comm-overlap \\\n" in flm.export_layout("megatron-lm", "gpt-175b", lay,
                                                             tp_comm_overlap=True)
    with pytest.raises(UserError, match="torchtitan has async tensor parallelism"):
        flm.export_layout("torchtitan", "llama3-8b", flm.layout(tp=2, global_batch=4),
                          tp_comm_overlap=True)

def test_p2p_overlap_is_the_flag_in_plan_predict_and_export(capsys):
    """``p2p_overlap`` is --overlap-p2p-comm: the same prediction as the flag, a shorter step on
    Megatron's interleaved schedule, a UserError on a layout it cannot change or a value that
    is not a bool, and the export of the run priced."""
    fields = dict(tp=4, pp=8, dp=8, micro_batch=2, global_batch=2048, zero=1,
                  sequence_parallel=True, engine="megatron", schedule="interleaved",
                  virtual_stages=6)
    flags = ["--tp", "4", "--pp", "8", "--dp", "8", "--micro-batch", "2", "--global-batch",
             "2048", "--zero", "1", "--sequence-parallel", "--engine", "megatron", "--schedule",
             "interleaved", "--virtual-stages", "6"]
    doc = _cli_json(capsys, ["predict", "--model", "gpt-175b", "--system", "dgx-h100", *flags,
                             "--overlap-p2p-comm", "on", "--format", "json"])
    on = flm.predict("gpt-175b", "dgx-h100", p2p_overlap=True, **fields)
    _same(json.loads(json.dumps(on, default=str)), doc)
    off = flm.predict("gpt-175b", "dgx-h100", **fields)
    assert on["step_time_s"] < off["step_time_s"] - 0.5
    with pytest.raises(UserError, match="interleaved schedule only"):
        flm.predict("gpt-175b", "dgx-h100", p2p_overlap=True,
                    **{**fields, "schedule": "1f1b", "virtual_stages": 1})
    with pytest.raises(UserError, match="p2p_overlap must be True or False"):
        flm.predict("gpt-175b", "dgx-h100", p2p_overlap="off", **fields)
    restrict = dict(gpus=256, tp=4, pp=8, micro_batch=2, global_batch=2048, zero=1,
                    sequence_parallel=True, recompute="none", engine="megatron",
                    schedule="interleaved", virtual_stages=6, include_oom=True, top=1)
    ranked_on = flm.plan("gpt-175b", "dgx-h100", p2p_overlap=True, **restrict)
    assert ranked_on["step_time_s"].iloc[0] == pytest.approx(on["step_time_s"], rel=1e-6)
    assert ranked_on["step_time_s"].iloc[0] < flm.plan(
        "gpt-175b", "dgx-h100", **restrict)["step_time_s"].iloc[0]
    lay = flm.layout(**fields)
    assert "--no-overlap-p2p-communication" in flm.export_layout("megatron-lm", "gpt-175b", lay)
    assert "overlap-p2p" not in flm.export_layout("megatron-lm", "gpt-175b", lay,
                                                  p2p_overlap=True)


PLANNING = ("plan", "explain", "plan_memory", "allocation")


def test_every_planning_function_takes_every_run_setting_of_flm_plan():
    """planner/run_settings.py names every run setting flm plan prices (cli/run_settings.py
    reads its flags into it); each planning function of the API takes each one, with flm plan's
    default. The API once lacked --eager and --deepspeed-overlap-comm, and allocation (flm
    plan --curve) every setting."""
    import argparse

    from frontier_llm.cli import build_parser
    from frontier_llm.cli.run_settings import settings_from_args
    from frontier_llm.planner.run_settings import DEFAULTS, NAMES

    args = build_parser("plan").parse_args(["plan"])
    assert settings_from_args(args) == DEFAULTS
    assert settings_from_args(argparse.Namespace()) == DEFAULTS
    for name in PLANNING:
        params = inspect.signature(getattr(api, name)).parameters
        for setting in NAMES:
            assert setting in params, f"{name}() lacks {setting}"
            assert params[setting].default == getattr(DEFAULTS, setting), (name, setting)
        assert "router_balance" in params, name


def test_run_settings_reach_the_planner_from_every_planning_function(monkeypatch):
    """What each planning function hands the planner is RunSettings.keywords() of its keywords:
    the same keywords flm plan's flags give it."""
    import frontier_llm.planner as planner_pkg
    from frontier_llm.costmodel.moe import MoeRun
    from frontier_llm.planner import allocation as alloc_mod

    seen: list[dict] = []

    class Stop(Exception):
        pass

    def record(*args, **kwargs):
        seen.append(kwargs)
        raise Stop

    monkeypatch.setattr(planner_pkg, "plan", record)
    monkeypatch.setattr(alloc_mod, "allocation_curve", record)
    given = {"eager": True, "deepspeed_overlap_comm": False, "tp_comm_overlap": True,
             "p2p_overlap": True, "moe_overlap": "ep-a2a", "moe_dispatcher": "flex",
             "cp_exchange": "ring"}
    want = {"eager": True, "overlap_comm": False, "tp_comm_overlap": True, "p2p_overlap": True,
            "moe_run": MoeRun("ep-a2a", "flex"), "cp_exchange": "ring"}
    for name in PLANNING:
        with pytest.raises(Stop):
            getattr(api, name)("gpt-22b", "frontier", **given)
        assert {k: seen[-1][k] for k in want} == want, name
    with pytest.raises(UserError, match="deepspeed_overlap_comm must be True or False"):
        flm.plan("gpt-22b", "frontier", 64, deepspeed_overlap_comm="off")
    with pytest.raises(UserError, match="cp_exchange must be None or one of"):
        flm.plan("gpt-22b", "frontier", 64, cp_exchange="ringg")
