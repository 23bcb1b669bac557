"""Job templates: golden files, bash -n, shellcheck, and hostile sweep values kept literal.

Regenerate the golden files after an intended template change with
``FLM_UPDATE_GOLDEN=1 python -m pytest tests/test_jobs_render.py``, then review the diff.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import subprocess
from pathlib import Path

import pytest

from frontier_llm.catalog import load_system
from frontier_llm.errors import SpecError
from frontier_llm.jobs.render import JobScript, Resources, Task, render
from frontier_llm.specs.site import merge

GOLDEN = Path(__file__).parent / "golden"
HOSTILE = "$(touch pwned) `touch pwned2`; rm -rf / ;\nsecond line 'quote' \"dq\" \\ $HOME *"

BENCH = ("--model", "gpt-175b", "--system", "frontier", "--tp", "8", "--pp", "16", "--dp", "8",
         "--micro-batch", "1", "--global-batch", "1024", "--steps", "10", "--warmup", "3",
         "--label", "sweep=frontier-175b-weak", "--label", "job_key=gpt-175b-n128-tp8-pp16")


def _examples() -> dict[str, JobScript]:
    return {
        "frontier": JobScript(
            template="frontier", sweep="frontier-175b-weak", job_name="flm-frontier-175b-weak-g0",
            trace_dir="/lustre/orion/proj/sweeps/frontier-175b-weak/traces",
            log_pattern="/lustre/orion/proj/sweeps/frontier-175b-weak/logs/g0/%a-%A.out",
            resources=Resources(nodes=128, ntasks_per_node=8, cpus_per_task=7, gpus_per_node=8,
                                time="02:00:00", account="ABC123", partition="batch",
                                qos="normal", constraint="nvme"),
            tasks=(Task(0, "gpt-175b-n128-tp8-pp16", BENCH),),
            env=(("TORCH_EXTENSIONS_DIR", "/lustre/orion/proj/torch_ext"),),
            setup=("source /lustre/orion/proj/venv/bin/activate",),
            site=load_system("frontier").site,
        ),
        "lumi-g": JobScript(
            template="frontier", sweep="lumi-22b", job_name="flm-lumi-22b-g0",
            trace_dir="/scratch/project_465000000/lumi-22b/traces",
            log_pattern="/scratch/project_465000000/lumi-22b/logs/g0/%a-%A.out",
            resources=Resources(nodes=2, ntasks_per_node=8, cpus_per_task=7, gpus_per_node=8,
                                time="01:00:00", account="project_465000000",
                                partition="standard-g", mem="0"),
            tasks=(Task(0, "gpt-22b-n2-tp8-pp2", ("--model", "gpt-22b", "--tp", "8")),),
            modules=("LUMI", "partition/G", "aws-ofi-rccl"),
            options={"rccl_plugin_dir": "/project/project_465000000/aws-ofi-rccl/lib"},
            site=load_system("lumi-g").site,
        ),
        # The OLCF sbcast guide's staging of a packed environment to the NVMe.
        "frontier-staged": JobScript(
            template="frontier", sweep="f22b", job_name="flm-f22b-g0",
            trace_dir="/lustre/orion/proj/f22b/traces",
            log_pattern="/lustre/orion/proj/f22b/logs/g0/%a-%A.out",
            resources=Resources(nodes=2, ntasks_per_node=8, cpus_per_task=7, gpus_per_node=8,
                                time="00:30:00", account="ABC123", partition="batch"),
            tasks=(Task(0, "gpt-22b-n2", ("--model", "gpt-22b", "--tp", "8")),),
            setup=('source "$FLM_VENV/bin/activate"',),
            options={"stage_env": "/lustre/orion/proj/flm-env.tar.gz"},
            site=load_system("frontier").site,
        ),
        # LUMI AI guide's container route: AI factory image, bindings module, venv in SquashFS.
        "lumi-g-container": JobScript(
            template="frontier", sweep="lumi-c", job_name="flm-lumi-c-g0",
            trace_dir="/scratch/project_465000000/lumi-c/traces",
            log_pattern="/scratch/project_465000000/lumi-c/logs/g0/%a-%A.out",
            resources=Resources(nodes=2, ntasks_per_node=8, cpus_per_task=7, gpus_per_node=8,
                                time="01:00:00", account="project_465000000",
                                partition="standard-g", mem="0"),
            tasks=(Task(0, "gpt-22b-n2-tp8-pp2", ("--model", "gpt-22b", "--tp", "8")),),
            modules=("lumi-aif-singularity-bindings",),
            env=(("SINGULARITYENV_PREPEND_PATH", "/user-software/bin"),),
            site=merge(load_system("lumi-g").site, {
                "module_paths": ["/appl/local/laifs/modules"],
                "singularity_image": "/appl/local/laifs/containers/lumi-multitorch-full.sif",
                "singularity_binds": ["/scratch/project_465000000/flm-env.sqsh:/user-software:"
                                      "image-src=/"]}),
        ),
        "nvidia": JobScript(
            template="nvidia", sweep="h100-explore", job_name="flm-h100-explore-g1",
            trace_dir="/scratch/sweeps/h100-explore/traces",
            log_pattern="/scratch/sweeps/h100-explore/logs/g1/%a-%A.out",
            resources=Resources(nodes=2, ntasks_per_node=8, cpus_per_task=14, gpus_per_node=8,
                                time="00:30:00", partition="gpu", exclusive=True, mem="0"),
            tasks=(Task(0, "a-tp8-pp2", ("--model", "gpt-22b", "--tp", "8", "--pp", "2"),
                        env=(("CUDA_DEVICE_MAX_CONNECTIONS", "1"),)),
                   Task(1, "b-fsdp", ("--model", "gpt-22b", "--zero", "3"))),
            options={"ib_hca": "mlx5_0,mlx5_1"},
            command=("python", "-m", "frontier_llm.cli", "bench"),
            site=merge(load_system("dgx-h100").site, {
                "launcher": "torchrun",
                "container_image": "/scratch/images/pytorch+flm.sqsh",
                "container_mounts": "/scratch:/scratch"}),
        ),
        "nvidia-srun": JobScript(
            template="nvidia", sweep="a100", job_name="flm-a100-g0",
            trace_dir="/scratch/a100/traces", log_pattern="/scratch/a100/logs/g0/%a-%A.out",
            resources=Resources(nodes=1, ntasks_per_node=8, cpus_per_task=16, gpus_per_node=8),
            tasks=(Task(0, "k", ("--model", "gpt3-1.3b")),),
            site=load_system("dgx-a100").site,
        ),
        "local": JobScript(
            template="local", sweep="tiny-cpu", job_name="flm-tiny-cpu-g0",
            trace_dir="/tmp/sweeps/tiny-cpu/traces",
            log_pattern="/tmp/sweeps/tiny-cpu/logs/g0/%a-%A.out",
            resources=Resources(nodes=1, ntasks_per_node=4, time="00:05:00", overcommit=True),
            tasks=(Task(0, "tiny-gpt-tp2-dp2", ("--model", "tiny-gpt", "--tp", "2", "--dp", "2")),
                   Task(1, "tiny-gpt-pp2-dp2", ("--model", "tiny-gpt", "--pp", "2", "--dp", "2"))),
            site=load_system("cpu-local").site,
        ),
    }


@pytest.mark.parametrize("name", sorted(_examples()))
def test_golden(name):
    text = render(_examples()[name])
    path = GOLDEN / f"{name}.sh"
    if os.environ.get("FLM_UPDATE_GOLDEN"):
        path.write_text(text)
    expected = path.read_text()
    diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True),
                                        f"golden/{name}.sh", "rendered"))
    assert not diff, f"rendered script differs from the golden file:\n{diff}"


def test_render_is_pure():
    job = _examples()["local"]
    assert render(job) == render(job)


@pytest.mark.parametrize("name", sorted(_examples()))
def test_bash_n_and_shellcheck(name, tmp_path):
    script = tmp_path / f"{name}.sh"
    script.write_text(render(_examples()[name]))
    subprocess.run(["bash", "-n", str(script)], check=True)
    out = subprocess.run(["shellcheck", "--shell=bash", "--severity=style", str(script)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def _hostile_job(tmp_path: Path) -> JobScript:
    return JobScript(
        template="local", sweep="hostile", job_name="flm-hostile",
        trace_dir=str(tmp_path / "traces"), log_pattern=str(tmp_path / "logs" / "%a-%A.out"),
        resources=Resources(ntasks_per_node=1),
        tasks=(Task(0, "hostile", ("--label", f"note={HOSTILE}")),),
        env=(("FLM_NOTE", HOSTILE),),
    )


def test_hostile_values_stay_literal_in_the_environment(tmp_path):
    """Run the script's environment part; the values come out exactly as given, nothing ran."""
    text = render(_hostile_job(tmp_path))
    env_part = text.split("# --- environment ---\n", 1)[1].split("# --- end environment ---", 1)[0]
    probe = env_part + 'printf "%s\\0" "$FLM_SWEEP" "$FLM_NOTE"\n'
    out = subprocess.run(["bash", "-c", probe], cwd=tmp_path, capture_output=True, check=True)
    assert out.stdout.split(b"\0")[:2] == [b"hostile", HOSTILE.encode()]
    assert out.stderr == b""
    assert not list(tmp_path.glob("pwned*"))


def test_hostile_values_reach_the_command_as_one_argument(tmp_path):
    """Run the whole script with a stand-in for srun/flm that prints its arguments."""
    job = _hostile_job(tmp_path)
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    # The only fakes: srun (no cluster needed for this check) prints its argv NUL-separated.
    (fake_bin / "srun").write_text('#!/bin/bash\nprintf "%s\\0" "$@"\n')
    (fake_bin / "scontrol").write_text("#!/bin/bash\necho localhost\n")
    for f in fake_bin.iterdir():
        f.chmod(0o755)
    script = tmp_path / "job.sh"
    script.write_text(render(job))
    env = {**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}", "SLURM_JOB_ID": "7"}
    out = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True,
                         check=True)
    assert out.stderr == b""
    argv = out.stdout.split(b"\0")
    assert f"note={HOSTILE}".encode() in argv
    run_id = argv[argv.index(b"--run-id") + 1]
    assert run_id == b"hostile-j7"
    assert not list(tmp_path.glob("pwned*"))


def test_the_script_computes_the_contract_as_python_does(tmp_path):
    """Run id, master port, the missing-task exit status and the banner, computed by the
    rendered script (a stand-in srun prints what it was given) and by jobs/contract.py."""
    from frontier_llm.errors import ExitCode
    from frontier_llm.jobs import contract

    job = _hostile_job(tmp_path)
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "srun").write_text('#!/bin/bash\nprintf "%s\\0" "$MASTER_PORT" "$FLM_RUN_ID"\n')
    (fake_bin / "scontrol").write_text("#!/bin/bash\necho localhost\n")
    for f in fake_bin.iterdir():
        f.chmod(0o755)
    script = tmp_path / "job.sh"
    script.write_text(render(dataclasses.replace(job, options={"master_port": "31000"})))
    env = {**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}", "SLURM_JOB_ID": "54321",
           "SLURM_ARRAY_JOB_ID": "54300", "SLURM_ARRAY_TASK_ID": "0"}
    out = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True,
                         check=True)
    banner, printed = out.stdout.decode().split("\n", 1)
    port, run_id = printed.split("\0")[:2]
    assert int(port) == contract.master_port(31000, 54321) == 31000 + 54321 % 1768
    assert run_id == contract.run_id("hostile", "54300")
    assert banner.startswith(f"{contract.BANNER_PREFIX}0 job hostile run {run_id} ")
    assert (Path(job.trace_dir) / f"{run_id}{contract.TOKEN_FILE}").read_text() == "\n"
    # A requeued attempt (SLURM_RESTART_COUNT=2): a run id and a log of its own, with the
    # submit token the job was given written beside its trace.
    Path(job.log_pattern).parent.mkdir()  # the sweep's folder has it (render_sweep)
    again = subprocess.run(["bash", str(script)], cwd=tmp_path, capture_output=True, check=True,
                           env={**env, "SLURM_RESTART_COUNT": "2", "FLM_SUBMIT_TOKEN": "t0k"})
    assert again.stdout == b""
    attempt_log = Path(job.log_pattern).parent / contract.attempt_log_name(0, "54300", 2)
    port, run_id = attempt_log.read_text().split("\n", 1)[1].split("\0")[:2]
    assert run_id == contract.run_id("hostile", "54300", 2) == "hostile-j54300-r2"
    assert contract.restart_of(run_id, "hostile", "54300") == 2
    assert (Path(job.trace_dir) / f"{run_id}{contract.TOKEN_FILE}").read_text() == "t0k\n"
    log = subprocess.run(["bash", str(script)], cwd=tmp_path, capture_output=True, text=True,
                         env={**env, "SLURM_ARRAY_TASK_ID": "9"})
    assert log.returncode == ExitCode.USAGE
    assert "no task 9" in log.stderr


@pytest.mark.parametrize("field,value", [("account", "a\nb"), ("partition", "p\n#SBATCH -x"),
                                          ("time", "1\r")])
def test_newlines_in_directives_are_refused(field, value):
    with pytest.raises(SpecError, match=f"{field} must be one line"):
        Resources(**{field: value})


def test_bad_names_refused():
    with pytest.raises(SpecError, match="job key"):
        Task(0, "../escape", ())
    with pytest.raises(SpecError, match="sweep name"):
        JobScript(template="local", sweep=HOSTILE, job_name="j", trace_dir="/t",
                  log_pattern="/l", resources=Resources(), tasks=(Task(0, "k", ()),))
    with pytest.raises(SpecError, match="not a valid shell name"):
        JobScript(template="local", sweep="s", job_name="j", trace_dir="/t", log_pattern="/l",
                  resources=Resources(), tasks=(Task(0, "k", ()),), env=(("A B", "x"),))
    job = _examples()["nvidia"]
    with pytest.raises(SpecError, match=r"site\.launcher must be one of srun, torchrun, mpiexec"):
        merge(job.site, {"launcher": "mpirun"})
    bad = JobScript(**{**job.__dict__, "options": {"launcher": "torchrun"}})
    with pytest.raises(SpecError, match="unknown template option 'launcher'"):
        render(bad)
    with pytest.raises(SpecError, match="template must be one of"):
        render(JobScript(**{**job.__dict__, "template": "nope"}))


def test_frontier_script_has_the_frontier_recipe():
    text = render(_examples()["frontier"])
    for needle in ("--gpus-per-task=1 --gpu-bind=closest", "--cpus-per-task=7",
                   "module load rocm/7", "module load rccl-net-plugin", "MIOPEN_USER_DB_PATH",
                   "NCCL_SOCKET_IFNAME=hsn0", "#SBATCH --network=disable_rdzv_get",
                   "export NCCL_NET='AWS Libfabric'", "export FI_CXI_RDZV_PROTO=alt_read",
                   "#SBATCH --signal=B:USR1@300", "--kill-on-bad-exit=0 --wait=", "exec srun"):
        assert needle in text, needle
    assert "rocm/5" not in text
    assert re.search(r"MIOPEN_USER_DB_PATH=.*SLURM_JOB_ID", text)


def test_the_staged_environment_is_unpacked_in_one_step_with_the_nodes_cores(tmp_path):
    """Staging ran three blocking srun steps (mkdir, a single-threaded tar -xzf, conda-unpack),
    each waiting on every node. Now one step per node with the node's 56 cores and pigz (the
    OLCF sbcast guide's -c56 tar --use-compress-program=pigz). Its shell is run here for real
    on a packed folder: made, untarred, and its conda-unpack run from the activated copy."""
    import shlex
    import tarfile

    text = render(_examples()["frontier-staged"])
    start = text.index("sbcast -pf")
    steps = [ln for ln in text[start:text.index('export FLM_VENV="$stage"')].splitlines()
             if ln.startswith("srun ")]
    assert len(steps) == 1 and "--ntasks-per-node=1 --cpus-per-task=56 bash -c" in steps[0]
    assert "pigz" in steps[0]
    packed = tmp_path / "src"
    (packed / "bin").mkdir(parents=True)
    (packed / "bin" / "activate").write_text(f'PATH="{tmp_path}/stage/bin:$PATH"\n')
    unpack = packed / "bin" / "conda-unpack"
    unpack.write_text('#!/bin/bash\ntouch "$(dirname "$0")/../unpacked"\n')
    unpack.chmod(0o755)
    stage = tmp_path / "stage"
    with tarfile.open(f"{stage}.tar.gz", "w:gz") as tar:
        for p in packed.rglob("*"):
            tar.add(p, arcname=str(p.relative_to(packed)), recursive=False)
    body = shlex.split(steps[0])
    inner = body[body.index("-c") + 1]
    done = subprocess.run(["bash", "-c", inner, "flm", str(stage)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (stage / "unpacked").exists() and (stage / "bin" / "activate").exists()
