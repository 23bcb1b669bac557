"""Sites as data: every rendered script runs to its launch line, with the site's flags.

The scripts run under bash with stand-ins for what only exists on a cluster: ``sbatch`` (checks
the script's directives, then runs it as one array task, as SLURM would), ``module`` (checks its
verb, records the module) and ``srun`` (checks its flags, records that it was reached). These
fakes stand for a GPU cluster, which cannot run here; ``scontrol`` is the real one (slurm-wlm),
which expands a host list offline given any slurm.conf.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from frontier_llm.catalog import load_system, system_names
from frontier_llm.jobs.render import JobScript, Resources, Task, render
from frontier_llm.jobs.sweepdir import render_sweep, with_resources
from frontier_llm.jobs.sweepspec import load_sweep
from frontier_llm.jobs.walltime import OvertimeError
from frontier_llm.specs.site import time_seconds

SWEEPS = Path(__file__).resolve().parents[1] / "sweeps"
SHIPPED = sorted(SWEEPS.glob("*.yaml"))

SBATCH = r"""#!/bin/bash
# stand-in sbatch: every expected directive must be in the script; then run it as task 0
script="${@: -1}"
for want in $STUB_SBATCH_EXPECT; do
    grep -qxF -- "#SBATCH $want" "$script" || { echo "sbatch: no '#SBATCH $want'" >&2; exit 3; }
done
nodes="$(sed -n 's/^#SBATCH --nodes=//p' "$script")"
export SLURM_JOB_ID=4242 SLURM_JOB_NUM_NODES="$nodes" SLURM_ARRAY_TASK_ID=0
export SLURM_JOB_NODELIST="nid[$(printf %06d 1)-$(printf %06d "$nodes")]"
exec bash "$script"
"""
MODULE = r"""#!/bin/bash
# stand-in module: only 'load NAME' and 'reset'
case "$1" in
    load) [ -n "$2" ] || { echo "module: load without a name" >&2; exit 3; } ;;
    reset) ;;
    *) echo "module: unexpected verb $1" >&2; exit 3 ;;
esac
echo "$*" >> "$STUB_DIR/module.log"
"""
SRUN = r"""#!/bin/bash
# stand-in srun: a node set-up step (no --kill-on-bad-exit: mkdir, the MIOpen cache keeper) is
# recorded in srun.setup; on a launch line every expected flag must be there; record the
# arguments and MASTER_ADDR
case " $* " in
    *" --kill-on-bad-exit=0 "*) ;;
    *) printf '%s
' "$*" >> "$STUB_DIR/srun.setup"; exit 0 ;;
esac
for want in $STUB_SRUN_EXPECT; do
    printf '%s\n' "$@" | grep -qxF -- "$want" || { echo "srun: no $want" >&2; exit 3; }
done
printf '%s\n' "$@" > "$STUB_DIR/srun.args"
echo "$MASTER_ADDR" >> "$STUB_DIR/srun.reached"
"""

# What each site's documentation asks of the allocation (sbatch) and of the launch (srun);
# sources in the system YAMLs and docs/sites.md.
EXPECT = {
    "frontier": ("--account=ABC123 --partition=batch --network=disable_rdzv_get "
                 "--cpus-per-task=7 --signal=B:USR1@300",
                 "--cpus-per-task=7 --gpus-per-task=1 --gpu-bind=closest --kill-on-bad-exit=0"),
    "cpu-local": ("", "--overcommit --kill-on-bad-exit=0"),
}


@pytest.fixture
def stubs(tmp_path):
    bin_dir = tmp_path / "stub-bin"
    bin_dir.mkdir()
    for name, text in (("sbatch", SBATCH), ("module", MODULE), ("srun", SRUN)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    conf = tmp_path / "slurm.conf"  # lets the real scontrol expand host lists offline
    conf.write_text("ClusterName=flmstub\nSlurmctldHost=localhost\nNodeName=localhost CPUs=1\n"
                    "PartitionName=p Nodes=localhost Default=YES\n")
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "activate").write_text("")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_CONF": str(conf),
           "STUB_DIR": str(tmp_path), "FLM_VENV": str(venv.parent)}
    for k in ("SLURM_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_NODELIST", "SBATCH_ACCOUNT"):
        env.pop(k, None)
    return env


def _submit(script: Path, env: dict, sbatch_expect: str, srun_expect: str,
            ) -> subprocess.CompletedProcess:
    run_env = {**env, "STUB_SBATCH_EXPECT": sbatch_expect, "STUB_SRUN_EXPECT": srun_expect}
    return subprocess.run(["sbatch", "--parsable", str(script)], env=run_env,
                          capture_output=True, text=True, timeout=60)


def _shellcheck(script: Path) -> None:
    out = subprocess.run(["shellcheck", "--shell=bash", "--severity=style", str(script)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_shipped_sweep_reaches_srun_with_the_site_flags(path, tmp_path, stubs):
    sweep = load_sweep(path)
    if sweep.site.account_required:
        sweep = with_resources(sweep, account="ABC123")
    manifest = render_sweep(sweep, tmp_path / "out")  # walltime check included
    for job in manifest.jobs:  # every predicted job fits its time limit, start-up and margin in
        assert job.get("predicted_runtime_s", 0) <= time_seconds(job["time"]), job["key"]
    sbatch_expect, srun_expect = EXPECT[sweep.system.name]
    modules = list(sweep.site.modules or ())
    for group in manifest.groups:
        script = manifest.path(group["script"])
        _shellcheck(script)
        (tmp_path / "srun.reached").unlink(missing_ok=True)
        (tmp_path / "module.log").unlink(missing_ok=True)
        out = _submit(script, stubs, sbatch_expect, srun_expect)
        assert out.returncode == 0, out.stderr
        # One srun step per layout of the allocation (a packed sweep runs several in turn).
        assert (tmp_path / "srun.reached").read_text() == "nid000001\n" * group["pack"]
        loaded = (tmp_path / "module.log").read_text().split("\n") if modules else [""]
        assert [m.removeprefix("load ") for m in loaded if m] == modules
        args = (tmp_path / "srun.args").read_text().splitlines()
        assert args[args.index("--run-id") + 1].endswith("-j4242")
        if group["nodes"] > 1 and sweep.system.name == "frontier":
            assert "export NCCL_NET='AWS Libfabric'" in script.read_text()


def _frontier_job(nodes: int, tmp_path: Path) -> JobScript:
    return JobScript(
        template="frontier", sweep="big", job_name="flm-big",
        trace_dir=str(tmp_path / "traces"), log_pattern=str(tmp_path / "%A.out"),
        resources=Resources(nodes=nodes, ntasks_per_node=8, cpus_per_task=7, gpus_per_node=8,
                            time="12:00:00", account="ABC123", partition="batch"),
        tasks=(Task(0, "gpt-1t-n400", ("--model", "gpt-1t")),),
        setup=('source "$FLM_VENV/bin/activate"',),
        site=load_system("frontier").site,
    )


@pytest.mark.slow
def test_a_400_node_frontier_job_reaches_srun_every_time(tmp_path, stubs):
    """400 nodes: the host list is ~5.6 KB, more than one pipe buffer; a ``| head -n 1`` would
    let scontrol die of SIGPIPE under pipefail in many tries (issue 12)."""
    script = tmp_path / "big.sh"
    script.write_text(render(_frontier_job(400, tmp_path)))
    expect = EXPECT["frontier"]
    for _ in range(50):
        out = _submit(script, stubs, *expect)
        assert out.returncode == 0, out.stderr
    assert (tmp_path / "srun.reached").read_text() == "nid000001\n" * 50


OLD_LINE = ('MASTER_ADDR="$(scontrol show hostnames "${SLURM_JOB_NODELIST:-localhost}" '
            '| head -n 1)"')


@pytest.mark.slow
def test_a_full_frontier_job_reaches_srun_and_the_old_pipe_would_not(tmp_path, stubs):
    """9472 nodes (the largest bin): ~130 KB of host names, over the 64 KiB pipe buffer, so
    the old ``| head -n 1`` line dies of SIGPIPE here every time (at 400 nodes it is a race that
    this machine rarely loses); the rendered script must still reach srun."""
    text = render(_frontier_job(9472, tmp_path))
    script = tmp_path / "full.sh"
    script.write_text(text)
    for _ in range(3):
        out = _submit(script, stubs, *EXPECT["frontier"])
        assert out.returncode == 0, out.stderr
    assert (tmp_path / "srun.reached").read_text() == "nid000001\n" * 3
    # The control: the same script with the pipe put back does not reach srun.
    lines = text.splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if line.startswith("MASTER_ADDR="))
    lines[first:first + 3] = [OLD_LINE + "\n"]
    old = tmp_path / "old.sh"
    old.write_text("".join(lines))
    out = _submit(old, stubs, *EXPECT["frontier"])
    assert out.returncode == 141, (out.returncode, out.stderr)
    assert (tmp_path / "srun.reached").read_text() == "nid000001\n" * 3


def test_scontrol_really_expands_400_hosts(stubs):
    out = subprocess.run(["scontrol", "show", "hostnames", "nid[000001-000400]"], env=stubs,
                         capture_output=True, text=True, check=True).stdout.split()
    assert len(out) == 400 and out[0] == "nid000001" and out[-1] == "nid000400"


@pytest.mark.parametrize("name", ["lumi-g", "dgx-a100", "dgx-h100"])
def test_other_sites_reach_their_launch_line(name, tmp_path, stubs):
    """LUMI-G binds with CPU masks and shows every GCD; DGX gives srun its CPUs per task."""
    site = load_system(name).site
    job = JobScript(
        template=site.template, sweep="s", job_name="j", trace_dir=str(tmp_path / "t"),
        log_pattern=str(tmp_path / "%A.out"),
        resources=Resources(nodes=2, ntasks_per_node=8, cpus_per_task=site.cpus_per_task,
                            gpus_per_node=8, time="01:00:00", account="project_1",
                            partition=site.partition, mem=site.mem, exclusive=site.exclusive),
        tasks=(Task(0, "k", ("--model", "gpt-22b")),), site=site)
    script = tmp_path / "job.sh"
    script.write_text(render(job))
    _shellcheck(script)
    if name == "lumi-g":
        sbatch = "--partition=standard-g --mem=0 --account=project_1"
        srun = ("--cpus-per-task=7 --gpus-per-node=8 --cpu-bind=mask_cpu:"
                + ",".join(site.cpu_masks))
        text = script.read_text()
        assert "--gpu-bind" not in text
        for line in ("FI_CXI_DISABLE_CQ_HUGETLB=1", "NCCL_NET='AWS Libfabric'",
                     "FI_MR_CACHE_MONITOR=userfaultfd", "FI_CXI_DISABLE_HOST_REGISTER=1",
                     "FI_CXI_DEFAULT_CQ_SIZE=131072"):
            assert f"export {line}\n" in text, line
    else:
        sbatch = "--exclusive --mem=0"
        srun = (f"--cpus-per-task={site.cpus_per_task} --gpus-per-node=8 "
                "--distribution=block:block --cpu-bind=cores")
    srun += " --kill-on-bad-exit=0"
    out = _submit(script, stubs, sbatch, srun)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "srun.reached").exists()


def test_every_catalog_site_cites_its_sources():
    for name in system_names():
        site = load_system(name).site
        # This machine's CPU systems are not real sites, and a system that only describes
        # published hardware for the cost model (grand-teton-h100: Meta's hosts) has none.
        if site is None or site.template == "local":
            continue
        given = {k for k, v in site.sources}
        for key in ("launcher", "binding", "cpus_per_task"):
            assert key in given, f"{name}: site.{key} has no source"
        assert all(v for _, v in site.sources), name
        # each queue cites its own section (a refusal quotes it: issue 39, extended cited the
        # debug QoS's anchor), and every issue-39 key a site sets has a source
        assert all(rule.source for _, rule in site.queues), name
        for key in ("parallel_fs", "shared_partitions", "threads_per_core", "numa_binding",
                    "sbatch_gpus", "mem", "sub_node_mem_per_gpu"):
            if key in {f for f, _ in site.sources} or getattr(site, key) not in (None, (), True):
                assert key in given, f"{name}: site.{key} has no source"


def test_mpiexec_launcher_starts_every_rank_from_the_batch_shell():
    from frontier_llm.jobs.launchers import LaunchJob, launcher_for
    from frontier_llm.specs.site import merge

    site = merge(load_system("dgx-a100").site, {"launcher": "mpiexec"})
    launcher = launcher_for(LaunchJob(nodes=2, ranks_per_node=8, gpus_per_node=8,
                                      cpus_per_task=16, command=("flm", "bench"), site=site))
    assert launcher.command().startswith("mpiexec -n 16 -ppn 8 \\\n    flm bench \"$@\"")
    assert launcher.sbatch_shape().ntasks_per_node == 8


# --- issue 39: full-machine jobs, packed jobs and paths (third pass) ---------------------------

GOLDEN_SITES = Path(__file__).parent / "golden" / "sites"
FRONTIER_NODES = 9408  # Frontier's compute nodes (OLCF Frontier user guide, system overview)


def _golden(name: str, text: str) -> None:
    """``text`` against tests/golden/sites/NAME (FLM_UPDATE_GOLDEN=1 rewrites it), with the
    rendering installation's bin folder (child.installation_bin) as one fixed path."""
    from frontier_llm.child import installation_bin

    if installation_bin():
        text = text.replace(installation_bin(), "/home/user/venv/bin")
    path = GOLDEN_SITES / name
    if os.environ.get("FLM_UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"{name} differs from its golden file"


def _render_text(tmp_path: Path, text: str, out: str = "out", name: str = "s.yaml"):
    path = tmp_path / name
    path.write_text(text)
    sweep = load_sweep(path)
    manifest = render_sweep(sweep, tmp_path / out)
    return manifest, [manifest.path(g["script"]).read_text() for g in manifest.groups]


def test_a_full_frontier_job_bounds_a_hang_well_inside_two_hours(tmp_path, stubs):
    """9,408 nodes, 2 hours: srun --wait (collective timeout + 1 + 60 s grace) was 7,617 s,
    past the job's end, so one hung GCD held all 9,408 nodes to the limit; now 486 s."""
    job = dataclasses.replace(_frontier_job(FRONTIER_NODES, tmp_path), resources=Resources(
        nodes=FRONTIER_NODES, ntasks_per_node=8, cpus_per_task=7, gpus_per_node=8,
        time="02:00:00", account="ABC123", partition="batch"))
    text = render(job)
    _golden("frontier-9408-nodes.sh", text.replace(str(tmp_path), "/lustre/orion/proj"))
    wait = int(re.search(r"--wait=(\d+)", text).group(1))
    assert wait == int(30 + 30 * math.log2(FRONTIER_NODES)) + 1 + 60 and wait < 0.1 * 7200
    # Frontier srun lines state their task count (OLCF: --gpus-per-task needs -n)
    assert f"--ntasks={FRONTIER_NODES * 8} --ntasks-per-node=8" in text
    script = tmp_path / "full.sh"
    script.write_text(text)
    out = _submit(script, stubs, *EXPECT["frontier"])
    assert out.returncode == 0, out.stderr
    args = (tmp_path / "srun.args").read_text().splitlines()
    assert f"--wait={wait}" in args and f"--ntasks={FRONTIER_NODES * 8}" in args


ONE_GCD = """\
name: onegcd
model: tiny-gpt
system: frontier
nodes: [1]
gpus_per_node: 1
global_batch: 8
pack: 8
pack_mode: concurrent
resources: {time: "00:30:00", account: ABC123}
space: {tp: [1], pp: [1], micro_batch: [1, 2, 4, 8], recompute: [none, full], fits_only: false}
"""


def test_a_one_gcd_pack_8_sweep_written_with_nodes_is_packed(tmp_path, stubs):
    """nodes: [1] + gpus_per_node: 1 ignored pack: 8 (the sweep's one GPU per node was taken
    for the node's room): every layout took a whole 8-GCD node. Now 8 share one node, and no
    step can inherit the allocation's GPUs (the allocation asks for none, as OLCF's example)."""
    manifest, texts = _render_text(tmp_path, ONE_GCD)
    layouts = len(manifest.jobs)
    assert layouts == 8 and [g["pack"] for g in manifest.groups] == [8]
    text = texts[0]
    _golden("frontier-one-gcd-pack.sh", text.replace(str(tmp_path), "/lustre/orion/proj"))
    assert "#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=8\n" in text
    assert "--gpus-per-node" not in text  # nothing for a step to inherit
    assert ("srun --nodes=1 --ntasks=1 --ntasks-per-node=1 --cpus-per-task=7 --gpus-per-task=1 "
            "--gpu-bind=closest --exact") in text
    assert not manifest.data["warnings"][:-1]  # only the --out warning (tmp is not Lustre)
    script = tmp_path / "pack.sh"
    script.write_text(text)
    out = _submit(script, stubs, "--account=ABC123 --network=disable_rdzv_get --nodes=1",
                  "--ntasks=1 --gpus-per-task=1 --gpu-bind=closest --exact")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "srun.reached").read_text().count("\n") == 8


def test_a_pack_that_packs_nothing_is_warned_in_one_line(tmp_path):
    """pack: 8 concurrent of 2-node layouts: each still takes its own allocation; said."""
    text = ONE_GCD.replace("nodes: [1]\ngpus_per_node: 1\n", "nodes: [2]\n").replace(
        "global_batch: 8", "global_batch: 16")
    manifest, _ = _render_text(tmp_path, text)
    assert all(g["pack"] == 1 for g in manifest.groups)
    pack_lines = [w for w in manifest.data["warnings"] if w.startswith("pack: 8")]
    assert pack_lines and all("\n" not in w and "span 2 nodes" in w for w in pack_lines)
    # and through the CLI, on stderr
    out = subprocess.run([sys.executable, "-m", "frontier_llm.cli", "sweep", "render",
                          str(tmp_path / "s.yaml"), "--out", str(tmp_path / "cli")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "warning: pack: 8 packed nothing in g000-n2x8" in out.stderr


def test_miopen_cache_is_made_on_every_node_and_removed_at_the_end(tmp_path, stubs):
    """The cache was made on the batch node only and never removed. The keeper step's own
    shell is run here for real: SIGTERM (what SLURM sends a step at the job's end) removes it."""
    text = render(_frontier_job(2, tmp_path))
    keeper = next(ln for ln in text.splitlines() if "--overlap bash -c" in ln)
    assert 'srun --nodes="${SLURM_JOB_NUM_NODES:-1}" --ntasks-per-node=1 mkdir -p' in text
    script = tmp_path / "job.sh"
    script.write_text(text)
    out = _submit(script, stubs, *EXPECT["frontier"])
    assert out.returncode == 0, out.stderr
    setup = (tmp_path / "srun.setup").read_text()
    assert "--ntasks-per-node=1 mkdir -p /tmp/miopen-" in setup and "--overlap bash -c" in setup
    body = shlex.split(keeper.rstrip(" &"))
    inner = body[body.index("-c") + 1]
    cache = tmp_path / "miopen-cache"
    cache.mkdir()
    (cache / "db.txt").write_text("x")
    proc = subprocess.Popen(["bash", "-c", inner, "flm", str(cache)])
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0 and not cache.exists()


TRAINER_175B = """\
name: t175
model: gpt-175b
system: frontier
workload: megatron-deepspeed
workload_command: [python, /lustre/orion/proj/Megatron-DeepSpeed/pretrain_gpt.py,
                   --train-iters, "2000"]
resources: {time: "00:30:00", account: ABC123}
layouts:
  - {tp: 8, pp: 16, dp: 1, micro_batch: 1, global_batch: 1024, recompute: full, name: a}
"""


def test_a_layouts_trainer_sweep_gets_the_walltime_check(tmp_path):
    """Issue 36: 2,000 iterations of 175B in 30 minutes rendered silently for layouts: sweeps
    (no prediction); the steps come from the trainer's own flag (jobs/workload.py)."""
    path = tmp_path / "s.yaml"
    path.write_text(TRAINER_175B)
    sweep = load_sweep(path)
    assert sweep.jobs[0].prediction["step_time_s"] > 0
    with pytest.raises(OvertimeError) as err:
        render_sweep(sweep, tmp_path / "out")
    text = str(err.value)
    assert "\n" not in text and "walltime: layout a (16 nodes)" in text
    assert "2000 steps x" in text and not (tmp_path / "out").exists()
    path.write_text(TRAINER_175B.replace('"2000"', '"1"').replace("00:30:00", "02:00:00"))
    assert render_sweep(load_sweep(path), tmp_path / "ok").jobs[0]["predicted_runtime_s"] > 0


def test_model_files_are_read_from_the_sweep_folder_not_the_checkout(tmp_path):
    """A model YAML beside the sweep became an absolute checkout path every rank read (on
    Frontier, NFS home); the sweep folder now holds a copy and the jobs name it."""
    (tmp_path / "mine.yaml").write_text(
        (Path(__file__).resolve().parents[1] / "frontier_llm" / "catalog" / "models" /
         "tiny-gpt.yaml").read_text())
    text = ONE_GCD.replace("model: tiny-gpt", "model: mine.yaml")
    manifest, texts = _render_text(tmp_path, text)
    copy = str(manifest.directory / "inputs" / "mine.yaml")
    assert Path(copy).read_text() == (tmp_path / "mine.yaml").read_text()
    assert all(j["model_ref"] == copy and copy in j["argv"] for j in manifest.jobs)
    assert str(tmp_path / "mine.yaml") not in texts[0] and copy in texts[0]


def test_workload_command_paths_are_checked_where_the_job_runs(tmp_path):
    """A relative path in workload_command runs from --out (sbatch --chdir) and was never
    checked: found beside the sweep file it is made absolute, found nowhere it is warned."""
    (tmp_path / "train.py").write_text("")
    text = TRAINER_175B.replace("/lustre/orion/proj/Megatron-DeepSpeed/pretrain_gpt.py",
                                "train.py").replace('"2000"', '"1"').replace("00:30:00",
                                                                             "02:00:00")
    manifest, texts = _render_text(tmp_path, text)
    assert f"flm-rank python {tmp_path / 'train.py'} " in texts[0]
    assert not any("workload_command names" in w for w in manifest.data["warnings"])
    manifest, texts = _render_text(tmp_path, text.replace("train.py", "missing.py"), out="o2")
    lines = [w for w in manifest.data["warnings"] if "workload_command names missing.py" in w]
    assert len(lines) == 1 and "\n" not in lines[0]


def test_out_off_the_parallel_file_system_is_warned(tmp_path):
    manifest, _ = _render_text(tmp_path, ONE_GCD)
    (line,) = [w for w in manifest.data["warnings"] if w.startswith("--out")]
    assert "not on frontier's parallel file system (/lustre/orion)" in line
    assert "#nfs-filesystem" in line
    from frontier_llm.jobs.render_warnings import out_warning

    assert out_warning(Path("/lustre/orion/abc/scratch/u/run"), ("/lustre/orion",), "f") is None
    assert out_warning(Path("/lustre/orionX/run"), ("/lustre/orion",), "f") is not None


@pytest.mark.parametrize("partition, ranks, exclusive", [
    ("small-g", 8, True), ("dev-g", 8, True), ("small-g", 4, False), ("standard-g", 8, False)])
def test_lumi_shared_partition_jobs_filling_a_node_are_exclusive(tmp_path, partition, ranks,
                                                                 exclusive):
    """LUMI-G's binding applies only to a full-node allocation; on small-g/dev-g that takes
    --exclusive (LUMI user guide, LUMI-G jobs); standard-g nodes are whole anyway."""
    text = (f"name: lx\nmodel: tiny-gpt\nsystem: lumi-g\nglobal_batch: 8\n"
            f"resources: {{time: '00:30:00', account: project_1, partition: {partition}}}\n"
            f"layouts:\n  - {{dp: {ranks}, micro_batch: 1}}\n")
    _, texts = _render_text(tmp_path, text)
    assert ("#SBATCH --exclusive\n" in texts[0]) == exclusive


def test_dgx_ranks_count_cores_and_torchrun_workers_are_bound():
    """-c 14 with --cpu-bind=cores assumed physical cores: --threads-per-core=1 makes it so;
    torchrun's 8 workers were unbound in their node-wide task: --numa-binding=node."""
    from frontier_llm.jobs.launchers import LaunchJob, launcher_for
    from frontier_llm.specs.site import merge

    site = load_system("dgx-h100").site
    srun = launcher_for(LaunchJob(nodes=2, ranks_per_node=8, gpus_per_node=8, cpus_per_task=14,
                                  command=("flm", "bench"), site=site)).command()
    assert "--threads-per-core=1 --cpu-bind=cores" in srun  # before: its implied bind is lost
    torchrun = launcher_for(LaunchJob(
        nodes=2, ranks_per_node=8, gpus_per_node=8, cpus_per_task=14, command=("flm", "bench"),
        site=merge(site, {"launcher": "torchrun"}))).command()
    assert "--threads-per-core=1" in torchrun and "--numa-binding=node" in torchrun


def test_the_1t_weak_sweep_submits_no_predicted_oom_layout():
    """No job's memory interval lies wholly above the GCD (the planner's ``exceeds``); a
    ``tight`` one is kept, as the planner keeps it."""
    from frontier_llm.planner.plan import memory_bounds

    sweep = load_sweep(SWEEPS / "frontier-1t-weak.yaml")
    low, _ = memory_bounds(np.array([j.prediction["peak_memory_bytes"] for j in sweep.jobs]))
    assert sweep.jobs and (low <= sweep.system.memory_bytes).all()


def test_docs_agree_on_kill_on_bad_exit():
    """docs/sites.md and docs/sweeps.md said different things of srun's --kill-on-bad-exit."""
    docs = Path(__file__).resolve().parents[1] / "docs"
    for page in ("sites.md", "sweeps.md"):
        text = docs.joinpath(page).read_text()
        assert "--kill-on-bad-exit=0" in text, page
        assert "--kill-on-bad-exit=1" not in text and "--kill-on-bad-exit " not in text, page


@pytest.mark.parametrize("partition, ranks, masks, mem", [
    ("small-g", 1, False, "--mem-per-gpu=60G"), ("dev-g", 4, False, "--mem-per-gpu=60G"),
    ("small-g", 8, True, "--mem=0"), ("standard-g", 8, True, "--mem=0")])
def test_lumi_jobs_smaller_than_a_node_get_no_node_masks_and_memory_per_gcd(
        tmp_path, partition, ranks, masks, mem):
    """A 1-GCD small-g job got the whole node's CPU masks (Slurm: "CPU binding outside of job
    step allocation"; LUMI: binding applies to full-node allocations only) and --mem=0, the
    node's whole memory, which LUMI bills as 8 GCDs. Now such a job asks --mem-per-gpu=60G (the
    LUMI AI guide's small-g scripts) and no mask; a full node keeps both."""
    text = (f"name: lm\nmodel: tiny-gpt\nsystem: lumi-g\nglobal_batch: 8\n"
            f"resources: {{time: '00:30:00', account: project_1, partition: {partition}}}\n"
            f"layouts:\n  - {{dp: {ranks}, micro_batch: 1}}\n")
    _, texts = _render_text(tmp_path, text)
    script = texts[0]
    assert ("mask_cpu:" in script) == masks
    assert f"#SBATCH {mem}\n" in script
    if not masks:
        assert "--mem=0" not in script and f"--gpus-per-node={ranks}" in script


BIG_OOM = """\
name: oomy
model: gpt-175b
system: frontier
global_batch: {gb}
resources: {{time: "02:00:00", account: ABC123}}
layouts:
  - {{tp: 8, pp: 1, dp: {dp}, micro_batch: 1}}
"""


@pytest.mark.parametrize("dp", [1, 9408])
def test_a_layout_predicted_over_memory_is_refused_at_render_at_any_scale(tmp_path, dp):
    """gpt-175b with tp 8 and no pipeline needs 430 GB a 64 GiB (69 GB) GCD: listed in
    ``layouts:`` it rendered silently, on 9,408 nodes hundreds of node-hours an attempt.
    Refused in one line naming it; --allow-oom (flm sweep render) writes it."""
    from frontier_llm.cli import main
    from frontier_llm.errors import UserError

    path = tmp_path / "oomy.yaml"
    path.write_text(BIG_OOM.format(gb=dp * 8, dp=dp))
    with pytest.raises(UserError, match=r"1 of its 1 layouts are predicted not to fit in a "
                                        r"GPU's 69 GB, the worst .* GB, even at the low end of its "
                                        r"memory interval \(" + str(dp) + " nodes"):
        render_sweep(load_sweep(path), tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert main(["sweep", "render", str(path), "--out", str(tmp_path / "o2"),
                 "--allow-oom", "--allow-overtime"]) == 0


def test_job_dir_placeholder_is_not_warned_as_a_missing_file():
    """flm recommends ``--save {job_dir}/checkpoints``; the path check warned that
    ``{job_dir}/checkpoints`` was in neither --out nor beside the sweep file. A word holding
    the placeholder is a path the job makes, so it is left as it is; a real missing one still
    warns."""
    from frontier_llm.jobs.render_warnings import command_paths

    words, warnings = command_paths(
        ("python", "/abs/train.py", "--save", "{job_dir}/checkpoints", "data/missing.bin"),
        Path("/nonexistent/out"), Path("/nonexistent/sweeps"))
    assert "{job_dir}/checkpoints" in words
    assert len(warnings) == 1 and "data/missing.bin" in warnings[0]


def test_a_trainer_jobs_early_signal_leaves_the_miopen_cache(tmp_path):
    """A trainer job's --signal=TERM@N reaches every step before the limit, the cache keeper
    among them, which removed the MIOpen cache while the trainer was still saving. The keeper's
    own shell, run here for real: the first SIGTERM leaves the cache, the second (the job's
    end) removes it; and when the batch shell removes the cache after the trainer (its
    after-trainer step), the keeper leaves by itself."""
    path = tmp_path / "t.yaml"
    path.write_text(TRAINER_175B.replace('"2000"', '"1"').replace("00:30:00", "02:00:00"))
    text = render_sweep(load_sweep(path), tmp_path / "out")
    script = text.path(text.groups[0]["script"]).read_text()
    assert "#SBATCH --signal=TERM@" in script
    keeper = next(ln for ln in script.splitlines() if "--overlap bash -c" in ln)
    after = script.index('--overlap rm -rf "$MIOPEN_USER_DB_PATH"')
    assert script.index("rc=\"${PIPESTATUS[0]}\"") < after < script.index('"${after[@]}"')
    body = shlex.split(keeper.rstrip(" &"))
    inner = body[body.index("-c") + 1]
    cache = tmp_path / "miopen-cache"
    cache.mkdir()
    proc = subprocess.Popen(["bash", "-c", inner, "flm", str(cache)])
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)  # the trainer's early signal
    time.sleep(1)
    assert proc.poll() is None and cache.exists()
    proc.send_signal(signal.SIGTERM)  # the job's end
    assert proc.wait(timeout=10) == 0 and not cache.exists()
    cache.mkdir()
    proc = subprocess.Popen(["bash", "-c", inner, "flm", str(cache)])
    time.sleep(0.5)
    cache.rmdir()  # the batch shell's step after the trainer
    assert proc.wait(timeout=15) == 0


def test_a_large_sweep_without_staging_is_told_what_a_start_costs(tmp_path):
    """Node-local staging was opt-in with no word at scale: at 9,408 Frontier nodes a start from
    Lustre is predicted at 204 s against 97 s staged, about 280 node-hours each time. Such a
    sweep now gets a warning; a staged one, a small one, or a site without node-local storage
    does not."""
    from frontier_llm.jobs.render_warnings import staging_warning

    line = staging_warning([("a", 16), ("b", FRONTIER_NODES)], "/mnt/bb", False, "frontier")
    assert line is not None and "layout b (9,408 nodes)" in line
    assert "204 s, 97 s staged" in line and ": 280 node-hours every start" in line
    assert staging_warning([("b", FRONTIER_NODES)], "/mnt/bb", True, "frontier") is None
    assert staging_warning([("a", 64)], "/mnt/bb", False, "frontier") is None
    assert staging_warning([("b", FRONTIER_NODES)], None, False, "lumi-g") is None
    text = BIG_OOM.format(gb=2048, dp=1).replace("gpt-175b", "gpt-22b").replace(
        "{tp: 8, pp: 1, dp: 1, micro_batch: 1}", "{tp: 8, pp: 1, dp: 2048, micro_batch: 1}")
    path = tmp_path / "big.yaml"
    path.write_text(text)
    manifest = render_sweep(load_sweep(path), tmp_path / "out", allow_overtime=True)
    assert any(w.startswith("start-up: layout") for w in manifest.data["warnings"])


# --- issue 54: the ROCm prerequisites of flash attention, stated where the job asks for it ------

def _attention_sweep(system: str, flash: bool) -> str:
    account = "project_465000000" if system == "lumi-g" else "abc123"
    return f"""\
name: attn
model: tiny-gpt
system: {system}
global_batch: 8
resources: {{time: "00:30:00", account: {account}}}
layouts:
  - {{dp: 8, micro_batch: 1, flash_attention: {str(flash).lower()}}}
"""


@pytest.mark.parametrize("system,needs", [
    ("frontier", ["rocm/7.1.1", "craype-accel-amd-gfx90a",
                  "ROCm/flash-attention at v2.8.4.1-cktile", "--use-flash-attn-v2",
                  "--attention-backend flash", "pytorch_frontier.rst at commit 2745903"]),
    ("lumi-g", ["lumi-multitorch-full-*", "/appl/local/laifs/containers/", "--use-flash-attn-v2",
                "LUMI-AI-Guide at commit a7e3387"])])
def test_flash_attention_scripts_state_the_sites_rocm_prerequisites(tmp_path, system, needs):
    """A Frontier or LUMI script whose layouts use flash attention says, as comments, what the
    site's documentation says it needs installed (ROCm torch, the ROCm flash-attn build) and
    where that is written; a layout without flash attention gets no such lines."""
    _, (text,) = _render_text(tmp_path, _attention_sweep(system, True))
    comments = " ".join(line[2:] for line in text.splitlines() if line.startswith("# "))
    assert f"Flash attention on {system}:" in comments
    for word in needs:
        assert word in comments, word
    _, (plain,) = _render_text(tmp_path, _attention_sweep(system, False), "plain", "p.yaml")
    assert "Flash attention on" not in plain
