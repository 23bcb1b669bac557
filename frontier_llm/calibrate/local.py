"""Start a calibration's ranks on this machine.

With ``mpiexec`` on the PATH and ``mpi4py`` importable (the ``mpich`` wheel provides both), the
ranks start under MPI, so the microbenchmark also times the MPI baseline; otherwise they start
as plain processes with the torchrun variables (no MPI baseline, and the file says so by having
no ``mpi`` rows).

:func:`measure` is the same from Python, without the command line: it starts
``python -m frontier_llm.calibrate.local CONFIG`` ranks (the ``__main__`` below) on a
:class:`~frontier_llm.calibrate.microbench.WorkerConfig` written as JSON, so a caller can size
the measurement (a shorter GEMM loop, fewer message sizes) and follow its progress.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from frontier_llm.bench.launch import free_port
from frontier_llm.calibrate.microbench import WorkerConfig
from frontier_llm.child import flm, python_module


def mpi_available() -> bool:
    return shutil.which("mpiexec") is not None and importlib.util.find_spec("mpi4py") is not None


def _rank_env(env: dict[str, str], rank: int, nproc: int, port: str) -> dict[str, str]:
    return dict(env, RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank),
                LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                FLM_LAUNCHER="local")


def _end(procs: list[subprocess.Popen]) -> None:
    """Kill the ranks still running and reap them: an interrupted caller (Ctrl-C) must not
    leave ranks behind waiting for a peer that is gone."""
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait()


def spawn(worker_argv: list[str], nproc: int, use_mpi: bool, timeout_s: float) -> int:
    """Run ``flm calibrate worker ARGV`` as ``nproc`` ranks; the worst exit code."""
    base = flm(["calibrate", "worker", *worker_argv])
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
    procs = [subprocess.Popen(base, env=_rank_env(env, rank, nproc, port))
             for rank in range(nproc)]
    codes = []
    try:
        for p in procs:
            try:
                codes.append(p.wait(timeout=timeout_s))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append(124)
    finally:
        _end(procs)
    return max(codes)


# How long the other ranks get to end on their own once one has failed.
FAILED_RANK_GRACE_S = 10.0


def measure(cfg: WorkerConfig, nproc: int, out: Path, model: str, system: str,
            timeout_s: float = 300.0, log: Path | None = None,
            on_progress: Callable[[str], None] | None = None) -> int:
    """Run the microbenchmark as ``nproc`` local processes (no MPI baseline); rank 0 writes
    ``out`` (atomically). ``on_progress`` gets rank 0's progress lines as they come ("24 GEMMs
    timed", "node x2 all_reduce done", ...); every rank's output goes to ``log``. Returns the
    worst exit code: 124 on timeout; when a rank fails, its own code, the others ended
    ``FAILED_RANK_GRACE_S`` later. Interrupted (Ctrl-C), it kills its ranks and re-raises:
    ``out`` is then either absent or a whole file from an earlier run."""
    out = Path(out)
    log = Path(log) if log else out.with_suffix(".log")
    config = out.with_name(out.name + ".config.json")
    config.write_text(json.dumps({"cfg": {**asdict(cfg), "gemms": [asdict(g) for g in cfg.gemms]},
                                  "out": str(out), "model": model, "system": system}))
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    port = str(free_port())
    argv = python_module("frontier_llm.calibrate.local", [str(config)])
    seen = 0
    with open(log, "w") as fh:
        procs = [subprocess.Popen(argv, env=_rank_env(env, rank, nproc, port), stdout=fh,
                                  stderr=subprocess.STDOUT) for rank in range(nproc)]
        try:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                # Every rank polled (any() would stop at the first one still running).
                states = [p.poll() for p in procs]
                if None not in states:
                    break
                time.sleep(0.2)
                if on_progress:
                    seen = _progress(log, seen, on_progress)
                if any(c not in (None, 0) for c in states):
                    # A rank that failed leaves its peers waiting in a collective until the
                    # timeout: its error is the result, and they have nothing to add.
                    deadline = min(deadline, time.monotonic() + FAILED_RANK_GRACE_S)
            codes = [124 if p.poll() is None else p.returncode for p in procs]
        finally:
            _end(procs)
    if on_progress:
        _progress(log, seen, on_progress)
    failed = [c for c in codes if c not in (0, 124)]
    return max(failed or codes)


_MARK = "flm-calibrate-progress: "


def _progress(log: Path, seen: int, emit: Callable[[str], None]) -> int:
    lines = log.read_text(errors="replace").splitlines()
    for line in lines[seen:]:
        if line.startswith(_MARK):
            emit(line[len(_MARK):])
    return len(lines)


def _main(config_path: str) -> int:
    from frontier_llm.calibrate.microbench import run_worker
    from frontier_llm.calibrate.shapes import Gemm

    doc = json.loads(Path(config_path).read_text())
    raw = dict(doc["cfg"])
    raw["gemms"] = [Gemm(**g) for g in raw["gemms"]]
    raw["ops"] = tuple(raw["ops"])
    cfg = WorkerConfig(**raw)
    return run_worker(cfg, Path(doc["out"]), doc["model"], doc["system"],
                      progress=lambda line: print(_MARK + line, flush=True))


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1]))
