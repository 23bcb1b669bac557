"""Who am I? Rank discovery under torchrun, srun and mpiexec, and local spawning otherwise.

* torchrun (and ``flm bench``'s own local spawner, and the ``deepspeed`` launcher run with
  ``--no_local_rank``): ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
  ``MASTER_PORT``.
* srun: ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``; the master is the first host of
  the step's node list (``scontrol show hostnames``, else a built-in expansion of the list, else
  an ``mpi4py`` broadcast); the port derives from the job and step ids, so concurrent jobs on one
  node do not collide. Only inside an srun step (``SLURM_STEP_ID`` set): a batch script's own
  shell is one process even when the job has many tasks.
* mpiexec (MPICH ``PMI_RANK``/``PMI_SIZE``, Open MPI ``OMPI_COMM_WORLD_*``): rank 0's hostname and
  a free port are broadcast with ``mpi4py`` (MPI discovers, gloo/NCCL communicate).

Precedence, innermost launcher first, because an outer launcher's variables are inherited and
stale inside an inner one:

1. the torchrun variables: only a launcher that started this very process sets ``RANK`` (torchrun
   or the deepspeed launcher under srun see the one-task step's ``SLURM_NTASKS=1``; DeepSpeed's
   MPICH runner maps ``PMI_RANK`` to ``RANK`` itself);
2. MPI's variables over SLURM's: ``mpiexec`` in a batch job (MPICH's Hydra, Open MPI's prte)
   starts one proxy per node with ``srun``, so its ranks inherit that proxy step's
   ``SLURM_PROCID=0``/``SLURM_NTASKS=1`` (one step task per node) and only ``PMI_*`` tell the
   world. When the MPI world *is* the srun step (``srun --mpi=pmi2`` sets both, equal) the
   launcher is srun, and its node list gives the master without MPI.
Outside all of these, :func:`spawn_local` starts ``--nproc`` copies of the command with the
torchrun variables set, watches them, and ends the survivors when one fails.
"""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any

from frontier_llm.child import flm


@dataclass(frozen=True)
class RankEnv:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    launcher: str
    slurm_job_id: str | None = None


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand a SLURM node list (``nid[001-003,007],login1``) without scontrol."""
    hosts: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", nodelist):
        m = re.fullmatch(r"(.*?)\[([^\]]*)\](.*)", part)
        if not m:
            hosts.append(part)
            continue
        prefix, ranges, suffix = m.groups()
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            for i in range(int(lo), int(hi or lo) + 1):
                hosts.append(f"{prefix}{str(i).zfill(len(lo))}{suffix}")
    return hosts


def first_host(nodelist: str) -> str:
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                             text=True, timeout=20, check=True).stdout.split()
        if out:
            return out[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return expand_nodelist(nodelist)[0]


# Local ranks meet on a port below the kernel's ephemeral range: a port the kernel handed out
# (bind to 0) is free only until rank 0 listens on it, and in between any outgoing connection of
# the machine (another run's gloo mesh) may take it, so rank 0 fails with EADDRINUSE and its
# peers wait out the rendezvous timeout (the likely cause of a CI run losing 120 s so).
_LOCAL_PORTS = range(10000, 20000)  # below SLURM jobs' 20000+ (jobs.contract.DEFAULT_MASTER_PORT)
_EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"


def _ephemeral_range() -> range:
    try:
        with open(_EPHEMERAL_RANGE) as fh:
            low, high = (int(x) for x in fh.read().split())
        return range(low, high + 1)
    except (OSError, ValueError):
        return range(32768, 61000)  # Linux's default (kernel ip-sysctl documentation)


def free_port(attempts: int = 64) -> int:
    """A TCP port nobody listens on now, outside the ephemeral range where it can."""
    ephemeral = _ephemeral_range()
    candidates = [p for p in _LOCAL_PORTS if p not in ephemeral]
    for port in random.sample(candidates, min(attempts, len(candidates))):
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # every candidate taken: let the kernel choose
        s.bind(("", 0))
        return s.getsockname()[1]


def _mpi_master(rank: int) -> tuple[str, int]:
    from mpi4py import MPI  # optional dependency: pip install "frontier_llm[mpi]"

    data = (socket.gethostname(), free_port()) if rank == 0 else None
    return MPI.COMM_WORLD.bcast(data, root=0)


_MPI_KEYS = (  # (rank, size, local rank) per MPI implementation
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
    ("PMIX_RANK", "PMIX_SIZE", "PMIX_LOCAL_RANK"),
)


def _mpi_world(env) -> tuple[int, int, int] | None:
    """(rank, size, local rank) from an MPI launcher's variables, or None."""
    for rank_key, size_key, local_key in _MPI_KEYS:
        if rank_key in env and size_key in env:
            return int(env[rank_key]), int(env[size_key]), int(env.get(local_key, 0))
    return None


def _srun_step(env) -> tuple[int, int, int] | None:
    """(rank, size, local rank) of this srun step's task, or None outside a step."""
    if "SLURM_STEP_ID" not in env or "SLURM_PROCID" not in env:
        return None
    world = int(env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS", 1))
    return int(env["SLURM_PROCID"]), world, int(env.get("SLURM_LOCALID", 0))


def detect(env: os._Environ | dict | None = None) -> RankEnv | None:
    """The launcher this process runs under, or None when it runs alone (precedence: see the
    module's docstring)."""
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID")
    if "RANK" in env and "WORLD_SIZE" in env and "MASTER_ADDR" in env:
        # The deepspeed launcher sets the torchrun variables plus its CROSS_RANK/CROSS_SIZE;
        # DeepSpeed's MPICH runner starts ranks with mpirun and maps PMI_RANK to RANK.
        mpi = _mpi_world(env)
        launcher = env.get("FLM_LAUNCHER") or (
            "torchrun" if "TORCHELASTIC_RUN_ID" in env
            else "deepspeed" if "CROSS_RANK" in env
            else "mpiexec" if mpi is not None and mpi[:2] == (int(env["RANK"]),
                                                               int(env["WORLD_SIZE"]))
            else "env"
        )
        return RankEnv(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0)),
                       env["MASTER_ADDR"], int(env.get("MASTER_PORT", 29500)), launcher, job)
    mpi, step = _mpi_world(env), _srun_step(env)
    # Hydra marks the srun it starts its proxies with; without the mark, an MPI world equal
    # to the step's is srun's own PMI (srun --mpi=pmi2).
    srun_is_mpi = (mpi is not None and step is not None and mpi[:2] == step[:2]
                   and "SLURM_EXTERNAL_LAUNCHER" not in env)
    if step is not None and (mpi is None or srun_is_mpi):
        rank, world, local = step
        job_s = job or "0"
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", "localhost")
        addr = env.get("MASTER_ADDR") or first_host(nodelist)
        step_id = env["SLURM_STEP_ID"]
        step_n = int(step_id) if step_id.isdigit() else 0
        job_n = int(job_s) if job_s.isdigit() else 0
        port = int(env.get("MASTER_PORT") or 20000 + (job_n * 31 + step_n) % 20000)
        return RankEnv(rank, world, local, addr, port, "srun", job_s)
    if mpi is not None:
        rank, world, local = mpi
        if "MASTER_ADDR" in env:
            addr, port = env["MASTER_ADDR"], int(env.get("MASTER_PORT", 29500))
        else:
            addr, port = _mpi_master(rank)
        return RankEnv(rank, world, local, addr, port, "mpiexec", job)
    return None


def spawn_local(argv: list[str], nproc: int, grace_s: float = 15.0) -> list[int]:
    """Run ``python -m frontier_llm.cli bench ARGV`` as ``nproc`` local ranks; their exit codes.

    When a rank fails, the others get ``grace_s`` to notice (collective errors, rank 0 writing
    the failed trace) and are then terminated, so a hung rank can not hold the run.
    """
    port = free_port()
    procs: list[subprocess.Popen] = []
    failed_at: float | None = None
    previous = _stop_on_sigterm()
    try:
        for rank in range(nproc):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank),
                       LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port), FLM_LAUNCHER="local")
            env.setdefault("OMP_NUM_THREADS", "1")
            procs.append(subprocess.Popen(
                flm(["bench", *argv]), env=env
            ))
        while None in (states := [p.poll() for p in procs]):
            # Every rank polled: any() would stop at rank 0, still running, and never see
            # rank 1 fail.
            now = time.monotonic()
            if failed_at is None and any(c not in (None, 0) for c in states):
                failed_at = now
            if failed_at is not None:
                # Rank 0 writes the trace; once it is gone the survivors have nothing to add.
                limit = 2.0 if procs[0].returncode is not None else grace_s
                if now - failed_at > limit:
                    _terminate(procs)
                    break
            time.sleep(0.05)
    except KeyboardInterrupt:
        _terminate(procs)
        raise
    except _Stopped:
        # A SIGTERM to the job's process group (a time limit, a cancel, the local executor)
        # reached the ranks too: they record it. Give them that moment, then stop and reap
        # them, so that no rank outlives its launcher.
        _wait_all(procs, 3.0)
        _terminate(procs)
        # Then end as the signal would have ended us: whoever sent it (flm sweep cancel, the
        # local executor) reads "killed by SIGTERM", not an exit status of our choosing.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        raise SystemExit(128 + signal.SIGTERM) from None  # not reached
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return [p.wait() for p in procs]


class _Stopped(BaseException):
    """SIGTERM reached the launcher (BaseException: no ``except Exception`` swallows it)."""


def _raise_stopped(signum: int, frame: object) -> None:
    raise _Stopped


def _stop_on_sigterm() -> Any:
    """Turn SIGTERM into :class:`_Stopped` while the ranks run; the handler it replaced (None
    off the main thread, where Python cannot set one)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _raise_stopped)


def _wait_all(procs: list[subprocess.Popen], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.05)


def _terminate(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 5
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
