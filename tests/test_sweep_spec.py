"""Sweep files: the shipped ones expand; bad ones are refused with file:line and the key."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from frontier_llm.errors import SpecError, UserError
from frontier_llm.jobs.sweepdir import inside, load_manifest, render_sweep, with_resources
from frontier_llm.jobs.sweepspec import load_sweep

SWEEPS = Path(__file__).resolve().parents[1] / "sweeps"
SHIPPED = sorted(SWEEPS.glob("*.yaml"))


def _write(tmp_path: Path, text: str, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


BASE = "name: t\nmodel: tiny-gpt\nsystem: cpu-local\n"


def test_the_papers_sweeps_and_the_tiny_one_are_shipped():
    names = {p.stem for p in SHIPPED}
    assert {"frontier-22b-explore", "frontier-175b-weak", "frontier-1t-weak",
            "frontier-175b-strong", "frontier-1t-strong", "tiny-cpu"} <= names
    for path in SHIPPED:
        if path.stem.startswith("frontier"):
            assert "2312.12705" in path.read_text(), f"{path.name} must cite Dash et al. 2023"


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_sweeps_expand_and_render(path, tmp_path):
    sweep = load_sweep(path)
    assert sweep.jobs
    if sweep.site.account_required:  # Frontier: refused without a project, nothing written
        with pytest.raises(SpecError, match="account_required: an account"):
            render_sweep(sweep, tmp_path / "refused")
        assert not (tmp_path / "refused").exists()
        sweep = with_resources(sweep, account="ABC123")
    manifest = render_sweep(sweep, tmp_path / "out")
    assert len(manifest.jobs) == len(sweep.jobs)
    for group in manifest.groups:
        script = manifest.path(group["script"])
        subprocess.run(["bash", "-n", str(script)], check=True)
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["sweep"] == sweep.name


def test_tiny_cpu_has_four_layouts_one_of_four_ranks():
    sweep = load_sweep(SWEEPS / "tiny-cpu.yaml")
    assert len(sweep.jobs) >= 4
    assert any(j.world_size == 4 for j in sweep.jobs)
    assert all(j.model.name == "tiny-gpt" for j in sweep.jobs)


def test_weak_scaling_grows_the_batch_with_the_nodes():
    sweep = load_sweep(SWEEPS / "frontier-175b-weak.yaml")
    per_node = {j.layout.global_batch / j.nodes for j in sweep.jobs}
    assert per_node == {16.0}
    assert {j.layout.tp for j in sweep.jobs} == {4}
    assert max(j.world_size for j in sweep.jobs) == 1024


def test_strong_scaling_keeps_the_batch():
    sweep = load_sweep(SWEEPS / "frontier-1t-strong.yaml")
    assert {j.layout.global_batch for j in sweep.jobs} == {3072}
    assert max(j.world_size for j in sweep.jobs) == 3072


def test_auto_space_top_k_and_fits_only(tmp_path):
    path = _write(tmp_path, BASE + "gpus: [4]\nglobal_batch: 8\nspace:\n  auto: true\n  top: 3\n")
    sweep = load_sweep(path)
    assert len(sweep.jobs) == 3
    assert all(j.prediction["fits"] for j in sweep.jobs)
    assert all(j.world_size == 4 for j in sweep.jobs)
    # The planner's best comes first.
    tps = [j.prediction["tokens_per_s"] for j in sweep.jobs]
    assert tps == sorted(tps, reverse=True)
    assert sweep.skipped  # the planner's rejections are counted, by rule


def test_explicit_space_is_the_product_of_its_lists(tmp_path):
    path = _write(tmp_path, BASE + "gpus: [4]\nglobal_batch: 8\nspace:\n  tp: [1, 2, 4]\n"
                  "  pp: [1, 2]\n  micro_batch: [1, 2]\n")
    sweep = load_sweep(path)
    combos = {(j.layout.tp, j.layout.pp, j.layout.micro_batch) for j in sweep.jobs}
    # tp 4 x pp 2 needs 8 ranks: never generated; everything else on 4 ranks is valid here.
    assert combos == {(t, p, m) for t in (1, 2, 4) for p in (1, 2) for m in (1, 2)
                      if t * p <= 4}
    assert {j.layout.schedule for j in sweep.jobs} == {"1f1b"}
    assert {j.layout.zero_stage for j in sweep.jobs} == {0}


@pytest.mark.parametrize("text,where", [
    (BASE + "layouts:\n  - {tp: 3}\n", ":5: tiny-gpt: heads (4) is not divisible by tp (3)"),
    (BASE + "layouts:\n  - {tp: 1, bogus: 2}\n", ":5: unknown field 'bogus'"),
    (BASE + "resources:\n  time: '00:05:00'\n  acount: x\nlayouts:\n  - {tp: 1}\n",
     ":6: unknown field 'acount' for ResourcesSpec (did you mean 'account'?)"),
    (BASE + "resources:\n  time: soon\nlayouts:\n  - {tp: 1}\n", ":5: time must be a SLURM"),
    (BASE + "layouts:\n  - tp: 1\n    bench_args: {memory: 1}\n", ":6: unknown bench_args key"),
    (BASE + "stpes: 3\nlayouts:\n  - {tp: 1}\n", ":4: unknown field 'stpes' for SweepFile "
     "(did you mean 'steps'?)"),
    ("name: 'a b'\nmodel: tiny-gpt\nsystem: cpu-local\nlayouts:\n  - {tp: 1}\n",
     ":1: name 'a b' may hold only"),
    (BASE.replace("tiny-gpt", "tiny-gtp") + "layouts:\n  - {tp: 1}\n",
     ":2: unknown model 'tiny-gtp'. Did you mean 'tiny-gpt'?"),
    (BASE + "template_options: {rccl_plugin_dir: /x}\nlayouts:\n  - {tp: 1}\n",
     ":4: unknown template option 'rccl_plugin_dir' for local"),
    (BASE + "layouts:\n  - {tp: 1}\n  - {tp: 1}\n", ":4: two jobs share the key"),
    (BASE + "space: auto\n", "a space needs nodes"),
    (BASE + "gpus: [2]\nspace:\n  schedule: [1f1b, zigzag]\n",
     ":6: schedule must be one of gpipe, 1f1b, interleaved (got 'zigzag')"),
    (BASE + "gpus: [4]\nglobal_batch: 3\nspace:\n  tp: [1]\n  pp: [1]\n",
     "expands to no valid layout (global_batch not divisible by micro_batch x dp"),
])
def test_bad_sweeps_name_file_line_and_key(tmp_path, text, where):
    path = _write(tmp_path, text)
    with pytest.raises(SpecError) as info:
        load_sweep(path)
    assert str(info.value).startswith(str(path)), str(info.value)
    assert where in str(info.value)


def test_fault_layouts_get_their_own_names_and_bench_args(tmp_path):
    path = _write(tmp_path, BASE + "layouts:\n  - {tp: 1, name: ok}\n"
                  "  - {tp: 1, name: crash, bench_args: {fault: crash, fault_step: 1}}\n"
                  "  - {tp: 1, name: slow, time: '00:01:00'}\n")
    jobs = {j.key: j for j in load_sweep(path).jobs}
    assert set(jobs) == {"ok", "crash", "slow"}
    argv = jobs["crash"].bench_args
    assert argv[argv.index("--fault") + 1] == "crash"
    assert jobs["slow"].time == "00:01:00" and jobs["ok"].time == "00:30:00"


def test_groups_share_resources_and_paths_stay_inside(tmp_path):
    sweep = load_sweep(SWEEPS / "tiny-cpu.yaml")
    manifest = render_sweep(sweep, tmp_path / "run")
    for g in manifest.groups:
        members = [j for j in manifest.jobs if j["group"] == g["name"]]
        assert {(j["nodes"], j["ranks_per_node"], j["time"]) for j in members} == {
            (g["nodes"], g["ranks_per_node"], g["time"])}
        assert sorted(j["index"] for j in members) == list(range(g["size"]))
    assert load_manifest(tmp_path / "run").data == manifest.data
    with pytest.raises(UserError, match="leaves the sweep folder"):
        inside(tmp_path / "run", "../elsewhere")
    with pytest.raises(UserError, match="holds no rendered sweep"):
        load_manifest(tmp_path)


def test_resource_overrides_reach_the_script(tmp_path):
    sweep = with_resources(load_sweep(SWEEPS / "tiny-cpu.yaml"), account="proj42",
                           partition="debug")
    manifest = render_sweep(sweep, tmp_path / "run")
    text = manifest.path(manifest.groups[0]["script"]).read_text()
    assert "#SBATCH --account=proj42" in text and "#SBATCH --partition=debug" in text


def test_hostile_label_is_one_argument(tmp_path):
    # Shell in a label is data; a newline is refused at load (tests/test_hostile_boundaries.py).
    hostile = "$(touch pwned); `id` | x"
    path = _write(tmp_path, BASE + f"labels:\n  note: {json.dumps(hostile)}\n"
                  "layouts:\n  - {tp: 1}\n")
    argv = load_sweep(path).jobs[0].bench_args
    assert f"note={hostile}" in argv


def test_engine_list_gives_each_layout_on_each_engine(tmp_path):
    """space engine: [native, deepspeed] -> one job per (layout, engine), each job's flm bench
    line and rendered script carry its engine; a layouts entry may name its engine too."""
    path = _write(tmp_path, BASE + "gpus: [2]\nglobal_batch: 4\ndtype: fp32\nspace:\n"
                  "  tp: [1]\n  pp: [1, 2]\n  zero: [1]\n  engine: [native, deepspeed]\n")
    sweep = load_sweep(path)
    pairs = sorted((j.layout.pp, str(j.layout.engine)) for j in sweep.jobs)
    assert pairs == [(1, "deepspeed"), (1, "native"), (2, "deepspeed"), (2, "native")]
    for job in sweep.jobs:
        argv = job.bench_args
        assert argv[argv.index("--engine") + 1] == str(job.layout.engine)
    manifest = render_sweep(sweep, tmp_path / "run")
    script = "".join(manifest.path(g["script"]).read_text() for g in manifest.groups)
    assert script.count("--engine deepspeed") == 2 and script.count("--engine native") == 2
    one = _write(tmp_path, BASE + "layouts:\n  - {dp: 2, zero: 1, engine: deepspeed}\n",
                 "one.yaml")
    assert str(load_sweep(one).jobs[0].layout.engine) == "deepspeed"


def test_top_level_engine_native_still_loads_any_other_is_refused(tmp_path):
    """Old sweep files (kept in sweep folders and the database) said engine: native at the top
    level, which never had an effect; anything else there says where the engine goes now."""
    old = _write(tmp_path, BASE + "engine: native\nlayouts:\n  - {dp: 2, engine: deepspeed}\n")
    assert str(load_sweep(old).jobs[0].layout.engine) == "deepspeed"
    bad = _write(tmp_path, BASE + "engine: deepspeed\nlayouts:\n  - {dp: 2}\n", "bad.yaml")
    with pytest.raises(SpecError) as info:
        load_sweep(bad)
    msg = str(info.value)
    assert msg.startswith(f"{bad}:4: the engine is a layout knob") and "\n" not in msg
    assert "space (engine: [native, deepspeed])" in msg


def test_a_space_copied_from_a_plans_sp_row_says_why_it_found_nothing(tmp_path):
    """flm plan's tp > 1 rows run sequence parallelism (it searches it off and on); a sweep's
    space leaves it off unless listed, so the copied layout may not fit and the sweep expanded
    to none with no word on why. The refusal now names the knob; listed, the layout renders."""
    from frontier_llm.errors import SpecError

    # One micro-batch a step (global batch = dp x micro_batch), so no gradient accumulates
    # unsharded (cost model 2.3): what decides the fit is the activations sp divides.
    # 64 nodes (dp 128): with cost model 2.11's narrower memory band 32 nodes' layout no longer
    # fits even with sequence parallelism.
    text = ("name: sp\nmodel: gpt-175b\nsystem: frontier\nnodes: [64]\nglobal_batch: 256\n"
            "resources: {time: '02:00:00', account: ABC123}\n"
            "space:\n  tp: [4]\n  pp: [1]\n  micro_batch: [2]\n  recompute: [selective]\n"
            "  zero: [3]\n")
    path = tmp_path / "sp.yaml"
    path.write_text(text)
    with pytest.raises(SpecError, match="sequence_parallel is off unless the space lists it"):
        load_sweep(path)
    path.write_text(text + "  sequence_parallel: [true]\n")
    assert [j.layout.sequence_parallel for j in load_sweep(path).jobs] == [True]
