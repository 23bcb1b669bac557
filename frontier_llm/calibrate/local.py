"""Start a calibration's ranks on this machine.

With ``mpiexec`` on the PATH and ``mpi4py`` importable (the ``mpich`` wheel provides both), the
ranks start under MPI, so the microbenchmark also times the MPI baseline; otherwise they start
as plain processes with the torchrun variables (no MPI baseline, and the file says so by having
no ``mpi`` rows).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys

from frontier_llm.bench.launch import free_port


def mpi_available() -> bool:
    return shutil.which("mpiexec") is not None and importlib.util.find_spec("mpi4py") is not None


def spawn(worker_argv: list[str], nproc: int, use_mpi: bool, timeout_s: float) -> int:
    """Run ``flm calibrate worker ARGV`` as ``nproc`` ranks; the worst exit code."""
    base = [sys.executable, "-m", "frontier_llm.cli", "calibrate", "worker", *worker_argv]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    port = str(free_port())
    if use_mpi:
        # MPI discovers the ranks; gloo meets at this address (frontier_llm.bench.launch).
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, FLM_LAUNCHER="mpiexec")
        try:
            return subprocess.run(["mpiexec", "-n", str(nproc), *base], env=env,
                                  timeout=timeout_s, check=False).returncode
        except subprocess.TimeoutExpired:
            return 124
    procs = []
    for rank in range(nproc):
        renv = dict(env, RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank),
                    LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                    FLM_LAUNCHER="local")
        procs.append(subprocess.Popen(base, env=renv))
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=timeout_s))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append(124)
    return max(codes)
