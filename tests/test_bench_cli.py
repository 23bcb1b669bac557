"""`flm bench` end to end: refusals, failures, out of memory, token files and the launchers
(its own local spawner, torchrun, mpiexec and srun on the real one-node SLURM)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from frontier_llm.bench.data import write_token_file
from frontier_llm.bench.launch import free_port
from frontier_llm.bench.trace import read_trace

FLM = [sys.executable, "-m", "frontier_llm.cli"]
TINY = ["--model", "tiny-gpt", "--dtype", "fp32", "--steps", "3", "--warmup", "1"]


def env(**extra: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "PMI_", "OMPI_")) and k not in (
               "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")}
    return {**out, "OMP_NUM_THREADS": "1", **extra}


def bench(tmp_path: Path, *argv: str, timeout: float = 240, prefix: list[str] | None = None,
          environ: dict | None = None) -> tuple[subprocess.CompletedProcess, float]:
    cmd = [*(prefix or FLM), "bench", *argv, "--trace-dir", str(tmp_path), "--run-id", "run"]
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=environ or env())
    return proc, time.monotonic() - start


@pytest.mark.parametrize("argv, rule", [
    (["--tp", "3"], "heads (4) is not divisible by tp (3)"),
    (["--tp", "2", "--dp", "2", "--global-batch", "2", "--nproc", "3"],
     "does not match the 3 GPUs/ranks"),
    (["--pp", "2", "--virtual-stages", "3", "--global-batch", "2"],
     "leaves a chunk without layers"),
])
def test_bad_layout_is_refused_before_any_rank_starts(tmp_path, argv, rule):
    proc, _ = bench(tmp_path, "--model", "tiny-gpt", *argv)
    assert proc.returncode == 2
    assert rule in proc.stderr and "Traceback" not in proc.stderr
    assert not any(tmp_path.iterdir())  # no rank ran: no trace, no heartbeat, no status file


@pytest.mark.slow
def test_refused_inside_torchrun_before_the_process_group(tmp_path):
    """Each rank refuses before init_process_group: nothing waits for a peer."""
    proc, took = bench(tmp_path, "--model", "tiny-gpt", "--tp", "4", prefix=[
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
        "-m", "frontier_llm.cli"])
    assert proc.returncode != 0 and "does not match the 2 GPUs/ranks" in proc.stderr
    assert not (tmp_path / "run.trace.json").exists()
    assert took < 60


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["crash", "hang"])
def test_failing_rank_ends_the_run_within_60s_with_a_failed_trace(tmp_path, fault):
    # The peer of a hung rank gives up after the collective timeout: 10 s here rather than the
    # default 30 s (the mechanism is the same, the suite 20 s shorter).
    proc, took = bench(tmp_path, *TINY, "--dp", "2", "--global-batch", "2", "--fault", fault,
                       "--fault-step", "2", timeout=120,
                       environ={**env(), "FLM_COLLECTIVE_TIMEOUT": "10"})
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert took < 60
    trace = read_trace(tmp_path / "run.trace.json")
    assert trace["status"] == "failed" and trace["error"]
    assert [s["step"] for s in trace["steps"]] == [0, 1]  # what ran before the fault
    beat = json.loads((tmp_path / "run.heartbeat.json").read_text())
    assert beat["step"] == 2 and beat["total_steps"] == 4
    assert not list(tmp_path.glob(".run.rank*"))  # status files cleaned up


@pytest.mark.slow
def test_memory_limit_ends_in_an_oom_trace(tmp_path):
    proc, _ = bench(tmp_path, "--model", "small-gpt", "--dtype", "fp32", "--micro-batch", "16",
                    "--global-batch", "16", "--steps", "2", "--warmup", "0",
                    "--memory-limit", "350M")
    assert proc.returncode == 3, proc.stderr[-2000:]
    trace = read_trace(tmp_path / "run.trace.json")
    assert trace["status"] == "oom"
    assert "allocate" in trace["error"]


@pytest.mark.slow
def test_token_file_and_labels(tmp_path):
    data = write_token_file(tmp_path / "tokens.bin", np.random.default_rng(0).integers(
        0, 256, 5000), vocab=256)
    proc, _ = bench(tmp_path, *TINY, "--data", str(data), "--label", "sweep=s",
                    "--label", "job_key=k1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    trace = read_trace(tmp_path / "run.trace.json")
    assert trace["labels"] == {"sweep": "s", "job_key": "k1"}
    assert trace["status"] == "completed" and trace["summary"]["steps_measured"] == 3
    e = trace["environment"]  # gloo on CPUs: the transport is gloo; no binding, one node
    assert (e["transport"], e["binding"], e["nodes"], e["visible_devices"]) == (
        "gloo", "none", 1, {})
    assert [s["warmup"] for s in trace["steps"]] == [True, False, False, False]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["status"] == "completed" and summary["tokens_per_s"] > 0
    s = trace["summary"]
    assert s["mfu"] == pytest.approx(s["model_tflops_per_gpu"] * 1e12 / 50e9)


@pytest.mark.slow
def test_under_torchrun(tmp_path):
    proc, _ = bench(tmp_path, *TINY, "--tp", "2", "--global-batch", "2", prefix=[
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
        "-m", "frontier_llm.cli"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    trace = read_trace(tmp_path / "run.trace.json")
    assert trace["environment"]["launcher"] == "torchrun"
    assert trace["status"] == "completed" and len(trace["memory"]) == 2


@pytest.mark.slow
def test_under_mpiexec(tmp_path):
    """MPI discovers (mpi4py broadcasts rank 0's address), gloo communicates."""
    mpiexec = Path(sys.executable).with_name("mpiexec")
    prefix = [str(mpiexec) if mpiexec.exists() else "mpiexec", "-n", "2", *FLM]
    proc, _ = bench(tmp_path, *TINY, "--dp", "2", "--global-batch", "2", prefix=prefix)
    assert proc.returncode == 0, proc.stderr[-2000:]
    trace = read_trace(tmp_path / "run.trace.json")
    assert trace["environment"]["launcher"] == "mpiexec" and len(trace["memory"]) == 2


@pytest.mark.slow
@pytest.mark.slurm
def test_under_srun(tmp_path, slurm_cluster):
    prefix = ["srun", "--overcommit", "-n", "2", "-t", "5", *FLM]
    environ = {**env(), "SLURM_CONF": str(slurm_cluster.conf)}
    proc, _ = bench(tmp_path, *TINY, "--pp", "2", "--global-batch", "2", prefix=prefix,
                    environ=environ)
    assert proc.returncode == 0, proc.stderr[-2000:]
    trace = read_trace(tmp_path / "run.trace.json")
    assert trace["environment"]["launcher"] == "srun"
    assert trace["environment"]["slurm_job_id"]
    assert {m["pp_stage"] for m in trace["memory"]} == {0, 1}


@pytest.mark.slow
@pytest.mark.slurm
def test_under_mpiexec_inside_a_slurm_job(tmp_path, slurm_cluster):
    """MPICH's Hydra starts its proxy with srun inside a job: each rank sees a one-task step
    (SLURM_NTASKS=1) and must take its world from PMI_* instead."""
    mpiexec = Path(sys.executable).with_name("mpiexec")
    cmd = shlex.join([str(mpiexec) if mpiexec.exists() else "mpiexec", "-n", "2", *FLM,
                      "bench", *TINY, "--dp", "2", "--global-batch", "2",
                      "--trace-dir", str(tmp_path), "--run-id", "run"])
    environ = {**env(), "SLURM_CONF": str(slurm_cluster.conf)}
    proc = subprocess.run(["sbatch", "--wait", "--overcommit", "-n", "2", "-t", "5",
                           "-o", str(tmp_path / "job.out"), "--wrap", cmd],
                          capture_output=True, text=True, timeout=300, env=environ)
    out = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert proc.returncode == 0, (proc.stderr + out)[-2000:]
    trace = read_trace(tmp_path / "run.trace.json")
    e = trace["environment"]
    assert (e["launcher"], e["world_size"], trace["status"], len(trace["memory"])) == (
        "mpiexec", 2, "completed", 2)
    assert e["slurm_job_id"] and e["slurm_job_id"] in proc.stdout  # "Submitted batch job N"


@pytest.mark.slow
def test_sigterm_from_the_scheduler_is_a_timeout_trace(tmp_path):
    """SLURM ends a job at its time limit with SIGTERM: the rank writes a `timeout` trace."""
    environ = env(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                  MASTER_PORT=str(free_port()))
    proc = subprocess.Popen([*FLM, "bench", "--model", "tiny-gpt", "--dtype", "fp32",
                             "--steps", "100000", "--trace-dir", str(tmp_path), "--run-id", "run"],
                            env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    beat = tmp_path / "run.heartbeat.json"
    deadline = time.monotonic() + 120
    while not beat.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.terminate()
    assert proc.wait(timeout=60) == 1
    trace = read_trace(tmp_path / "run.trace.json")
    assert trace["status"] == "timeout" and "SIGTERM" in trace["error"]
    assert trace["steps"] and trace["environment"]["launcher"] == "env"
