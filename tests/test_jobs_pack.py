"""Packed allocations (sweep ``pack: N``): grouping, the rendered script run under a stand-in
srun, site rules on the packed time, and each layout's verdict from its own step's files.

The stand-in srun is the one fake here: the real-SLURM run of a packed sweep is in
tests/test_sweep_slurm.py (test_packed_sweep_judges_each_layout_alone).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from slurm_fixtures import flm, tiny_sweep

from frontier_llm.errors import SpecError
from frontier_llm.jobs import contract
from frontier_llm.jobs.lifecycle import Observation, SchedulerState
from frontier_llm.jobs.packing import pack_keys, step_observation
from frontier_llm.jobs.site_policy import SiteRuleError
from frontier_llm.jobs.sweepdir import load_manifest, render_sweep
from frontier_llm.jobs.sweepspec import load_sweep

SWEEPS = Path(__file__).resolve().parents[1] / "sweeps"

PACKED = tiny_sweep("packed", [
    "{dp: 2, micro_batch: 2, name: a}",
    "{dp: 2, micro_batch: 2, name: b, bench_args: {fault: crash, fault_step: 1}}",
    "{dp: 2, micro_batch: 2, name: c}",
    "{dp: 1, micro_batch: 2, name: alone}"], steps=2, extra="pack: 2\n")


def _sweep(tmp_path: Path, text: str, name: str = "s.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return load_sweep(path)


def test_pack_one_renders_exactly_as_before(tmp_path):
    text = (SWEEPS / "tiny-cpu.yaml").read_text()
    plain = render_sweep(_sweep(tmp_path, text, "a.yaml"), tmp_path / "run")
    before = {g["script"]: plain.path(g["script"]).read_text() for g in plain.groups}
    one = render_sweep(_sweep(tmp_path, text + "pack: 1\n", "b.yaml"), tmp_path / "run")
    assert plain.data["jobs"] == one.data["jobs"]
    assert {g["script"]: one.path(g["script"]).read_text() for g in one.groups} == before
    assert not any("srun step" in t for t in before.values())


def test_packed_groups_tasks_and_time(tmp_path):
    manifest = render_sweep(_sweep(tmp_path, PACKED), tmp_path / "run")
    groups = {g["name"]: g for g in manifest.groups}
    assert [(g["pack"], g["size"], g["time"]) for g in groups.values()] == [
        (2, 3, "00:10:00"), (1, 1, "00:05:00")]
    jobs = {j["key"]: j for j in manifest.jobs}
    assert [(jobs[k]["index"], jobs[k]["step"]) for k in "abc"] == [(0, 0), (0, 1), (1, 2)]
    assert "step" not in jobs["alone"] and jobs["alone"]["index"] == 0
    script = manifest.path(manifest.groups[0]["script"]).read_text()
    assert "#SBATCH --time=00:10:00" in script
    assert "0) steps=(0 1) ;;" in script and "1) steps=(2) ;;" in script
    for key in "abc":
        assert f"key={key};" in script
    check = subprocess.run(["shellcheck", "--shell=bash", "--severity=style",
                            str(manifest.path(manifest.groups[0]["script"]))],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout
    # The lone layout's script is today's one-task script.
    assert "exec srun" in manifest.path(manifest.groups[1]["script"]).read_text()


def test_pack_must_be_positive(tmp_path):
    with pytest.raises(SpecError, match="pack must be at least 1"):
        _sweep(tmp_path, PACKED.replace("pack: 2", "pack: 0"))


def test_site_time_bin_checked_on_the_packed_allocation(tmp_path):
    """Frontier's 1-91 node bin allows 2 h: three 50-minute layouts in one allocation ask for
    2.5 h and are refused before anything is written; two fit."""
    text = """\
name: fpack
model: tiny-gpt
system: frontier
gpus_per_node: 8
global_batch: 8
pack: 3
resources: {time: "00:50:00", account: abc123}
layouts:
  - {dp: 8, micro_batch: 1, name: x}
  - {dp: 8, micro_batch: 1, name: y}
  - {dp: 8, micro_batch: 1, name: z}
"""
    with pytest.raises(SiteRuleError, match=r"time_bins: .* at most 02:00:00; it asks for "
                                            r"02:30:00") as err:
        render_sweep(_sweep(tmp_path, text), tmp_path / "refused")
    # Issue 39: --time is each layout's in a packed sweep, and the refusal says so
    assert ("(--time is per layout in a packed sweep: 3 layouts in turn x 00:50:00; lower "
            "pack: or --time)") in str(err.value)
    assert not (tmp_path / "refused").exists()
    manifest = render_sweep(_sweep(tmp_path, text.replace("pack: 3", "pack: 2"), "two.yaml"),
                            tmp_path / "ok")
    assert [g["time"] for g in manifest.groups] == ["01:40:00"]


def _stand_in_bin(tmp_path: Path) -> Path:
    fake = tmp_path / "bin"
    fake.mkdir()
    # srun fails for the layout named b (its argv carries job_key=b), else succeeds.
    (fake / "srun").write_text('#!/bin/bash\necho "srun $FLM_JOB_KEY port $MASTER_PORT"\n'
                               'case " $* " in *job_key=b\\ *) echo "boom" >&2; exit 3 ;; esac\n')
    (fake / "scontrol").write_text("#!/bin/bash\necho localhost\n")
    for f in fake.iterdir():
        f.chmod(0o755)
    return fake


def test_packed_script_runs_every_step_and_records_each_status(tmp_path):
    """A failing step does not stop the next; each step has its own exit, start and log file,
    its own run id and port; the allocation exits non-zero."""
    manifest = render_sweep(_sweep(tmp_path, PACKED), tmp_path / "run")
    script = manifest.path(manifest.groups[0]["script"])
    env = {**os.environ, "PATH": f"{_stand_in_bin(tmp_path)}:{os.environ['PATH']}",
           "SLURM_JOB_ID": "700", "SLURM_ARRAY_JOB_ID": "700", "SLURM_ARRAY_TASK_ID": "0"}
    out = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert out.returncode == 1, out.stderr
    traces = manifest.trace_dir
    for key, code in (("a", 0), ("b", 3)):
        run_id = contract.run_id(key, "700")
        assert (traces / f"{run_id}.exit").read_text().strip() == str(code)
        assert (traces / f"{run_id}.start").is_file()
        log = (traces / f"{run_id}.log").read_text()
        step = 0 if key == "a" else 1
        port = contract.master_port(contract.DEFAULT_MASTER_PORT, 700, step, 2)
        assert f"srun {key} port {port}" in log
    assert "boom" in (traces / f"{contract.run_id('b', '700')}.log").read_text()
    assert not (traces / f"{contract.run_id('c', '700')}.exit").exists()  # the other pack
    assert "flm: step b exited 3" in out.stdout

    # A retry of b alone (FLM_PACK_KEYS) runs only b's step.
    for f in traces.iterdir():
        f.unlink()
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True,
                         env={**env, contract.PACK_KEYS_ENV: "b", "SLURM_ARRAY_JOB_ID": "701"})
    assert sorted(f.name for f in traces.iterdir() if f.suffix == ".exit") == ["b-j701.exit"]


def _files(tmp_path: Path, run_id: str, start: bool, code: int | None) -> Path:
    if start:
        (tmp_path / f"{run_id}.start").write_text("2026-01-01T00:00:00Z\n")
    if code is not None:
        (tmp_path / f"{run_id}.exit").write_text(f"{code}\n")
    return tmp_path


S = SchedulerState


@pytest.mark.parametrize("allocation,start,code,expected", [
    (S.PENDING, False, None, S.PENDING),
    (S.RUNNING, False, None, S.PENDING),  # waiting for the steps before it
    (S.RUNNING, True, None, S.RUNNING),
    (S.RUNNING, True, 0, S.EXITED),  # done while the allocation runs on
    (S.FAILED, True, 0, S.EXITED),  # another step failed the allocation; this one did not
    (S.COMPLETED, True, 3, S.EXITED),
    (S.TIMEOUT, True, 143, S.TIMEOUT),  # killed by the allocation's end, not by itself
    (S.TIMEOUT, True, None, S.TIMEOUT),
    (S.TIMEOUT, False, None, S.CANCELLED),  # never started
    (S.FAILED, False, None, S.CANCELLED),
])
def test_step_observation(tmp_path, allocation, start, code, expected):
    trace_dir = _files(tmp_path, "k-j1", start, code)
    obs = step_observation(Observation(allocation, "1:0", nodelist="n1"), trace_dir, "k-j1")
    assert obs.state == expected
    if expected == S.EXITED:
        assert obs.exit_code == f"{code}:0" and obs.start == "2026-01-01T00:00:00Z"
    if start and expected == S.RUNNING:
        assert obs.start == "2026-01-01T00:00:00Z"  # the hung check counts from the step
    if expected == S.CANCELLED:
        assert "before this layout's step started" in obs.said


def test_pack_keys_only_for_part_of_a_pack(tmp_path):
    manifest = load_manifest(render_sweep(_sweep(tmp_path, PACKED), tmp_path / "run").directory)
    jobs = {j["key"]: j for j in manifest.jobs}
    group = jobs["a"]["group"]
    assert pack_keys(manifest, group, [jobs["a"], jobs["b"], jobs["c"]]) is None
    assert pack_keys(manifest, group, [jobs["c"]]) is None  # c is its pack's only layout
    assert pack_keys(manifest, group, [jobs["b"], jobs["c"]]) == "b:c"
    assert pack_keys(manifest, jobs["alone"]["group"], [jobs["alone"]]) is None
    assert json.loads((tmp_path / "run" / "manifest.json").read_text())["groups"][0]["pack"] == 2


def test_cli_says_allocations_and_dry_run_arrays(tmp_path):
    spec = tmp_path / "packed.yaml"
    spec.write_text(PACKED)
    assert "4 jobs in 2 scripts (3 allocations, up to 2 layouts each)" in flm(
        "sweep", "render", spec, "--out", tmp_path / "run").stdout
    dry = flm("sweep", "submit", spec, "--out", tmp_path / "run", "--dry-run",
              "--db", f"sqlite:///{tmp_path}/flm.db").stdout
    assert "--array=0-1 " in dry and "--array=0-0 " in dry


CONCURRENT = PACKED.replace("pack: 2", "pack: 3\npack_mode: concurrent")


def test_concurrent_pack_fits_the_node_and_keeps_the_layout_time(tmp_path):
    """pack 3 of 2-rank layouts on 4-rank nodes: only 2 fit side by side; the allocation holds
    4 ranks for one layout's time, each step is srun --exact with its own 2."""
    manifest = render_sweep(_sweep(tmp_path, CONCURRENT), tmp_path / "run")
    g = manifest.groups[0]
    assert (g["pack"], g["concurrent"], g["time"]) == (2, True, "00:05:00")
    script = manifest.path(g["script"]).read_text()
    assert "#SBATCH --ntasks=4" in script
    assert "srun --overcommit --ntasks=2 --overlap" in script  # local: cores are shared
    assert 'run_step "$@" &' in script
    check = subprocess.run(["shellcheck", "--shell=bash", "--severity=style",
                            str(manifest.path(g["script"]))], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout


@pytest.mark.parametrize("system,why", [("lumi-g", "binding cpu-masks")])
def test_concurrent_refused_where_steps_would_share_cores(tmp_path, system, why):
    text = f"""\
name: c
model: tiny-gpt
system: {system}
pack: 2
pack_mode: concurrent
global_batch: 8
layouts:
  - {{dp: 8, micro_batch: 1}}
"""
    with pytest.raises(SpecError, match=rf"s.yaml:5: pack_mode concurrent needs .*{why}"):
        _sweep(tmp_path, text)


def test_concurrent_script_runs_steps_side_by_side(tmp_path):
    """Under a stand-in srun that waits for its sibling: both steps must be running at once."""
    manifest = render_sweep(_sweep(tmp_path, CONCURRENT), tmp_path / "run")
    fake = _stand_in_bin(tmp_path)
    # Each step marks itself and waits (at most 5 s) for the other's mark.
    (fake / "srun").write_text(
        '#!/bin/bash\ntouch "$FLM_RUN_ID.here"\nfor _ in $(seq 50); do\n'
        '  [ "$(ls ./*.here | wc -l)" -ge 2 ] && break; sleep 0.1\ndone\n'
        '[ "$(ls ./*.here | wc -l)" -ge 2 ] || exit 9\n'
        'case " $* " in *job_key=b\\ *) exit 3 ;; esac\n')
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "SLURM_JOB_ID": "800",
           "SLURM_ARRAY_JOB_ID": "800", "SLURM_ARRAY_TASK_ID": "0"}
    out = subprocess.run(["bash", str(manifest.path(manifest.groups[0]["script"]))], env=env,
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    codes = {k: (manifest.trace_dir / f"{k}-j800.exit").read_text().strip() for k in "ab"}
    assert codes == {"a": "0", "b": "3"}


def test_concurrent_frontier_pack_fills_a_node(tmp_path):
    """Four 2-GCD layouts side by side on one 8-GCD Frontier node: the allocation asks for 8
    ranks and GPUs, each step srun --exact 2 ranks with the site's closest binding."""
    text = """\
name: fconc
model: tiny-gpt
system: frontier
global_batch: 2
pack: 8
pack_mode: concurrent
resources: {time: "00:30:00", account: abc123}
layouts:
""" + "".join(f"  - {{dp: 2, micro_batch: 1, name: l{i}}}\n" for i in range(5))
    manifest = render_sweep(_sweep(tmp_path, text), tmp_path / "run")
    g = manifest.groups[0]
    assert (g["pack"], g["time"]) == (4, "00:30:00")
    script = manifest.path(g["script"]).read_text()
    # Issue 39: the allocation asks for nodes only, as OLCF's concurrent-step example does, so
    # no step inherits SLURM_GPUS_PER_NODE=8 (and asks for the node's every GPU); each step
    # states its task count, which --gpus-per-task needs (OLCF Frontier user guide).
    assert "#SBATCH --ntasks-per-node=8" in script and "--gpus-per-node" not in script
    assert "0) steps=(0 1 2 3) ;;" in script and "1) steps=(4) ;;" in script
    assert ("srun --nodes=1 --ntasks=2 --ntasks-per-node=2 --cpus-per-task=7 --gpus-per-task=1 "
            "--gpu-bind=closest --exact") in script
    assert 'pids+=("$!")\n    # OLCF' in script and "    sleep 1\n" in script


ONE_GCD = """\
name: onegcd
model: tiny-gpt
system: {system}
global_batch: 1
{pack}resources: {{time: "00:30:00", account: {account}{partition}}}
layouts:
"""
LAYOUTS_30 = "".join(f"  - {{dp: 1, micro_batch: 1, name: l{i}}}\n" for i in range(30))


def _one_gcd(system: str, pack: str = "", partition: str = "") -> str:
    account = "project_465000000" if system == "lumi-g" else "abc123"
    return ONE_GCD.format(system=system, pack=pack, account=account,
                          partition=partition) + LAYOUTS_30


def test_one_gcd_layouts_unpacked_on_whole_nodes_are_warned(tmp_path):
    """Issue 54: 30 one-GCD layouts on Frontier without pack: take 30 whole nodes, billed per
    node; render says the node-hours and the lines that pack them 8 a node."""
    manifest = render_sweep(_sweep(tmp_path, _one_gcd("frontier")), tmp_path / "run")
    lines = [w for w in manifest.data["warnings"] if "whole frontier nodes" in w]
    assert len(lines) == 1, manifest.data["warnings"]
    # 30 x 0.5 h = 15 node-hours; packed 8 a node: 4 allocations x 0.5 h = 2, so 13 idle.
    assert "30 one-node layouts of 1 of a node's 8 GPUs take 30 whole" in lines[0]
    assert "up to 15.0 node-hours at their time limit, 13.0 of them on idle GPUs" in lines[0]
    assert "add `pack: 8` and `pack_mode: concurrent`" in lines[0]
    assert "2.0 node-hours" in lines[0]
    # The lines it names, added, pack them and silence it.
    packed = render_sweep(_sweep(tmp_path, _one_gcd(
        system="frontier", pack="pack: 8\npack_mode: concurrent\n", partition=""), "p.yaml"),
        tmp_path / "packed")
    assert len(packed.groups) == 1 and packed.groups[0]["pack"] == 8
    assert not any("whole frontier nodes" in w for w in packed.data["warnings"])


def test_sub_node_layouts_on_shared_nodes_are_not_warned(tmp_path):
    """LUMI small-g shares nodes and bills the share (docs/sites.md): nothing to warn; on
    standard-g (whole nodes) the warning names no concurrent pack, which LUMI refuses."""
    small = render_sweep(_sweep(tmp_path, _one_gcd(
        system="lumi-g", pack="", partition=", partition: small-g")), tmp_path / "small")
    assert not any("whole lumi-g nodes" in w for w in small.data["warnings"])
    whole = render_sweep(_sweep(tmp_path, _one_gcd(
        system="lumi-g", pack="", partition=", partition: standard-g"), "w.yaml"),
        tmp_path / "whole")
    line = next(w for w in whole.data["warnings"] if "whole lumi-g nodes" in w)
    assert "pack_mode concurrent is refused here" in line and "pack: 8" not in line
