"""Property tests: a layout survives every handoff unchanged, and so does its hash.

Random valid layouts go planner -> sweep job (the argv rendered into the batch script) -> ``flm
bench`` configuration -> trace -> SQLite store -> Layout. Every stage is the real code: the sweep
is a YAML file expanded by ``load_sweep`` (which runs the planner) and rendered by
``render_sweep``; the argv is read back from the script text; the bench parses it with its own
parser; the trace is the skeleton ``flm bench`` writes, validated against the schema; the store is
a real SQLite database filled by ``collect``. Nothing runs the training (no torch process).
"""

from __future__ import annotations

import argparse
import re
import shlex
import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from frontier_llm.bench.config import build_config, child_argv
from frontier_llm.bench.run import skeleton_trace
from frontier_llm.bench.trace import read_trace, trace_path, validate_trace, write_trace
from frontier_llm.cli import build_parser
from frontier_llm.cli.layout_args import add_layout_args, layout_from_args
from frontier_llm.errors import SpecError
from frontier_llm.jobs.sweepdir import render_sweep
from frontier_llm.jobs.sweepspec import load_sweep
from frontier_llm.report.sources import with_catalog_breakdown
from frontier_llm.specs.engine_rules import RULES
from frontier_llm.specs.forms import bench_command, layout_entry, layout_from_row, layout_record
from frontier_llm.specs.identity import layout_hash
from frontier_llm.specs.layout import (
    COMPONENTS,
    DType,
    Engine,
    FP8Recipe,
    Layout,
    Placement,
    PlacementKind,
    Recompute,
    Schedule,
    Sharding,
    layout_argv,
    zero_preset,
)
from frontier_llm.specs.space import space_knobs
from frontier_llm.store import open_store
from frontier_llm.store.ingest import collect
from frontier_llm.store.queries import runs_frame, stored_layout

# 48 layers: every pp x virtual_stages the strategy draws divides them; 16 heads: every tp.
MODEL = {"name": "prop-gpt", "layers": 48, "hidden": 256, "heads": 16, "seq_len": 64,
         "vocab": 512}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def shardings(draw, dp: int) -> Sharding:
    if draw(st.booleans()):
        return zero_preset(draw(st.integers(0, 3)))

    def placement() -> Placement:
        kind = draw(st.sampled_from(list(PlacementKind)))
        if kind == PlacementKind.PARTIAL:
            return Placement(kind, draw(st.sampled_from(_divisors(dp))))
        return Placement(kind)

    return Sharding(**{c: placement() for c in COMPONENTS})


@st.composite
def layouts(draw) -> Layout:
    # The engine first, then only what it runs (specs/engine_rules.py), so few draws are lost.
    engine = draw(st.sampled_from(list(Engine)))
    rules = RULES[engine]
    tp = draw(st.sampled_from([1, 2, 4]))
    pp = draw(st.sampled_from([1, 2, 3, 4]))
    dp = draw(st.sampled_from([1, 2, 4, 6]))
    schedule = draw(st.sampled_from(list(rules.schedules)))
    if schedule == Schedule.INTERLEAVED:
        pp = max(pp, 2)
    virtual = draw(st.sampled_from([2, 4])) if schedule == Schedule.INTERLEAVED else 1
    micro = draw(st.sampled_from([1, 2]))
    steps = draw(st.integers(1, 3)) * (pp if schedule == Schedule.INTERLEAVED else 1)
    sharding = draw(shardings(dp))
    if engine != Engine.NATIVE:
        allowed = rules.pipeline_shardings if pp > 1 and rules.pipeline_shardings else \
            rules.shardings
        sharding = draw(st.sampled_from(list(allowed)))
    # Knobs an engine runs at some values only (EngineRules.only): one of those.
    only = {knob: draw(st.sampled_from(list(values))) for knob, values, _ in rules.only}
    try:
        return Layout(
            tp=tp, cp=only.get("cp", draw(st.sampled_from([1, 2]))), pp=pp, dp=dp,
            micro_batch=micro, global_batch=micro * dp * steps,
            schedule=schedule, virtual_stages=virtual,
            sequence_parallel=draw(st.booleans()) if tp > 1 and rules.sequence_parallel
            else False,
            recompute=draw(st.sampled_from(list(Recompute))),
            # The sweep runs on cpu-local, which has no FP8 tensor cores (fp8 is refused there:
            # tests/test_fp8.py); the recipe knob still travels through every handoff.
            flash_attention=draw(st.booleans()),
            dtype=draw(st.sampled_from([d for d in rules.dtypes if d != DType.FP8])),
            fp8_recipe=draw(st.sampled_from(list(FP8Recipe))),
            sharding=sharding, engine=engine,
            reshard_after_forward=only.get("reshard_after_forward", draw(st.booleans())),
        )
    except SpecError:  # a sharding coarser than what it is built from
        assume(False)


def _sweep_file(folder: Path, layout: Layout) -> Path:
    """A sweep whose space holds exactly ``layout`` (the planner enumerates it)."""
    record = layout_record(layout)
    space = {name: [record[name]] for name in space_knobs()}
    space["fits_only"] = False
    (folder / "model.yaml").write_text(yaml.safe_dump(MODEL))
    sweep = {"name": "prop", "system": "cpu-local", "model": "model.yaml",
             "gpus": [layout.world_size], "gpus_per_node": 256, "dtype": str(layout.dtype),
             "global_batch": layout.global_batch, "space": space, "steps": 1, "warmup": 0}
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    return path


def _one_layout_sweep(folder: Path, entry: dict) -> str:
    """The sweep of _sweep_file with ``entry`` as its one ``layouts:`` entry (a study's trial
    and the quickstart write such files)."""
    sweep = yaml.safe_load((folder / "sweep.yaml").read_text())
    del sweep["space"]
    sweep["layouts"] = [entry]
    return yaml.safe_dump(sweep)


def _script_argv(script: str, key: str) -> list[str]:
    """The ``flm bench`` arguments a rendered batch script sets for the task ``key``."""
    for line in script.splitlines():
        m = re.match(rf"\s*\d+\) key={re.escape(key)}; set -- (.*) ;;$", line)
        if m:
            return shlex.split(m.group(1))
    raise AssertionError(f"no task {key} in the script")


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(layouts())
def test_a_layout_survives_every_handoff(layout):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        # planner -> sweep job
        sweep = load_sweep(_sweep_file(folder, layout))
        assert len(sweep.jobs) == 1
        job = sweep.jobs[0]
        assert job.layout == layout
        expected = layout_hash(job.model, sweep.system.name, layout)
        # sweep job -> the argv rendered into the batch script
        manifest = render_sweep(sweep, folder / "run")
        entry = manifest.jobs[0]
        assert entry["layout_hash"] == expected
        script = (folder / "run" / entry["script"]).read_text()
        argv = _script_argv(script, job.key)
        assert argv == entry["argv"]
        # -> flm bench's configuration, as the job's rank parses it
        args = build_parser("bench").parse_args(
            ["bench", *argv, "--run-id", "r1", "--trace-dir", str(folder / "traces")])
        cfg = build_config(args)
        assert cfg.layout == layout
        # -> the trace (schema-valid, through the file)
        trace = skeleton_trace(cfg, layout.world_size, "local", "gloo", "cpu",
                               "2026-01-01T00:00:00+00:00")
        validate_trace(trace)
        write_trace(cfg.trace_dir, trace)
        trace = read_trace(trace_path(cfg.trace_dir, "r1"))
        assert trace["layout_hash"] == expected
        assert Layout.from_dict(trace["layout"]) == layout
        # -> the store -> a Layout again
        store = open_store(f"sqlite:///{folder / 'flm.db'}")
        try:
            report = collect(store, [cfg.trace_dir])
            assert report.as_dict()["inserted"] == 1, report.as_dict()
            back = stored_layout(store, expected)
            runs = runs_frame(store)
        finally:
            store.close()
        assert back == layout
        assert layout_hash(cfg.model, cfg.system.name, back) == expected
        # -> the report stage's frame of runs, and its rebuild of each run's layout
        assert layout_from_row(runs.iloc[0]) == layout
        assert layout_from_row(with_catalog_breakdown(runs).iloc[0]) == layout
        # -> a study's trial (its sweep text) and flm tune best's bench command
        entry = {k: v for k, v in layout.to_dict().items() if k != "zero_stage"}
        tried = load_sweep(folder / "sweep.yaml", text=_one_layout_sweep(folder, entry))
        assert tried.jobs[0].layout == layout
        best = shlex.split(bench_command(layout))
        assert layout_from_args(build_parser("bench").parse_args(
            ["bench", "--model", "tiny-gpt", *best])) == layout
        # -> the quickstart's layouts: entry
        qs = load_sweep(folder / "sweep.yaml",
                        text=_one_layout_sweep(folder, layout_entry(layout)))
        assert qs.jobs[0].layout == layout


@settings(max_examples=300, deadline=None)
@given(layouts())
def test_codecs_round_trip(layout):
    """The sharding text, the argv codec and the numpy table each give the layout back."""
    assert Sharding.parse(layout.sharding.describe()) == layout.sharding
    parser = argparse.ArgumentParser()
    add_layout_args(parser)
    assert layout_from_args(parser.parse_args(layout_argv(layout))) == layout
    assert Layout.from_dict(layout.to_dict()) == layout
    from frontier_llm.costmodel.layouts import from_configs

    assert from_configs([layout]).config(0) == layout


def test_local_spawner_and_sweep_write_the_same_layout_argv(tmp_path):
    """The two writers of a flm bench command line share one codec (they used to disagree:
    --zero N against --sharding)."""
    layout = Layout(tp=2, dp=2, global_batch=4, sharding=zero_preset(2))
    sweep = load_sweep(_sweep_file(tmp_path, layout))
    args = build_parser("bench").parse_args(["bench", *sweep.jobs[0].bench_args])
    cfg = build_config(args)
    assert layout_argv(layout) == layout_argv(cfg.layout)
    spawned = child_argv(cfg)
    job = list(sweep.jobs[0].bench_args)
    start = spawned.index("--tp")
    assert spawned[start:start + len(layout_argv(layout))] == layout_argv(layout)
    assert job[job.index("--tp"):job.index("--tp") + len(layout_argv(layout))] == \
        layout_argv(layout)


def test_codes_are_member_positions_even_for_shared_words():
    """Recompute.FULL and PlacementKind.FULL are both the word "full" (equal strings, equal
    hashes); each keeps its own code."""
    for vocab in (Schedule, Recompute, DType, PlacementKind, Engine):
        assert [m.code for m in vocab] == list(range(len(vocab)))
        assert [vocab.from_code(i) for i in range(len(vocab))] == list(vocab)
    assert (PlacementKind.FULL.code, Recompute.FULL.code, Recompute.FULL.code) == (1, 2, 2)
    assert Recompute.NONE.code == 0 and PlacementKind.REPLICATE.code == 0
