"""Sites as data: every rendered script runs to its launch line, with the site's flags.

The scripts run under bash with stand-ins for what only exists on a cluster: ``sbatch`` (checks
the script's directives, then runs it as one array task, as SLURM would), ``module`` (checks its
verb, records the module) and ``srun`` (checks its flags, records that it was reached). These
fakes stand for a GPU cluster, which cannot run here; ``scontrol`` is the real one (slurm-wlm),
which expands a host list offline given any slurm.conf.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from frontier_llm.catalog import load_system, system_names
from frontier_llm.jobs.render import JobScript, Resources, Task, render
from frontier_llm.jobs.sweepdir import render_sweep, with_resources
from frontier_llm.jobs.sweepspec import load_sweep
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


def test_mpiexec_launcher_starts_every_rank_from_the_batch_shell():
    from frontier_llm.jobs.launchers import LaunchJob, launcher_for
    from frontier_llm.specs.site import merge

    site = merge(load_system("dgx-a100").site, {"launcher": "mpiexec"})
    launcher = launcher_for(LaunchJob(nodes=2, ranks_per_node=8, gpus_per_node=8,
                                      cpus_per_task=16, command=("flm", "bench"), site=site))
    assert launcher.command().startswith("mpiexec -n 16 -ppn 8 \\\n    flm bench \"$@\"")
    assert launcher.sbatch_shape().ntasks_per_node == 8
