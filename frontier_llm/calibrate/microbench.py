"""The microbenchmarks, run inside every rank of a calibration job.

Matrix multiplications: the block GEMMs of :mod:`.shapes` in the training dtype, each timed as
the mean of a loop of calls after a warm-up (the device synchronized around the loop on a GPU).

Collectives (``torch.distributed``: NCCL/RCCL on GPUs, gloo on CPUs): all-reduce, all-gather,
reduce-scatter and send-receive over message sizes from ``min_bytes`` to ``max_bytes`` (×4 steps)
for each group shape of :func:`group_shapes`: inside a GPU package, inside a node, across nodes.
Every group of a shape runs at once (as a layout's TP or DP groups do); a point's time is the
mean over a loop of calls (as nccl-tests time them), the slowest rank's. ``nbytes`` follows the
cost model (:mod:`frontier_llm.costmodel.comm`): the all-reduced buffer, the gathered (or
pre-scatter) buffer, one point-to-point message (half a ping-pong).

MPI baseline: under an MPI launcher (``mpiexec``, ``srun --mpi=pmi2``) the same operations run
through ``mpi4py`` on host buffers of the same groups, so a collective library can be compared
with the system's MPI.

Rank 0 writes one JSON file: ``{"provenance": {...}, "matmul": [...], "collectives": [...]}``.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from frontier_llm import __version__
from frontier_llm.calibrate.shapes import Gemm

OPS = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")
KiB, MiB, GiB = 1024, 1024**2, 1024**3
# What a CPU run measures up to by default: gloo on loopback moves about 1 GB/s, so a 1 GiB
# all-reduce of several ranks sharing a few cores takes seconds per call; 16 MiB already sits
# well inside the bandwidth-bound regime that the fit needs (docs/calibrate.md).
CPU_MAX_BYTES = 16 * MiB
GPU_MAX_BYTES = 1 * GiB


@dataclass(frozen=True)
class GroupShape:
    """A partition of the world into equal groups that all sit in one link tier."""

    tier: str  # package | node | network
    groups: tuple[tuple[int, ...], ...]

    @property
    def size(self) -> int:
        return len(self.groups[0])

    def group_of(self, rank: int) -> int | None:
        for i, g in enumerate(self.groups):
            if rank in g:
                return i
        return None


def message_sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """Powers of 4 from ``min_bytes`` up to ``max_bytes`` (both kept)."""
    out, n = [], int(min_bytes)
    while n < max_bytes:
        out.append(n)
        n *= 4
    out.append(int(max_bytes))
    return sorted(set(out))


def reps_for(nbytes: int) -> int:
    """Calls per timed loop: many for latency-bound sizes, few for large ones (same on every
    rank, so the loops pair up)."""
    if nbytes <= 64 * KiB:
        return 20
    if nbytes <= 1 * MiB:
        return 10
    if nbytes <= 16 * MiB:
        return 5
    return 3


def group_shapes(hosts: list[str], gpus_per_package: int = 1) -> list[GroupShape]:
    """The group shapes worth measuring for ranks on ``hosts`` (rank i runs on hosts[i]).

    package: consecutive ranks of one package (when packages hold more than one GPU);
    node: pairs and whole nodes; network: one rank per node (every local rank at once), and the
    whole world when nodes hold several ranks. A shape is kept only when every group stays in
    its tier, so a tier is never fitted on timings of another.
    """
    world = len(hosts)
    by_host: dict[str, list[int]] = {}
    for r, h in enumerate(hosts):
        by_host.setdefault(h, []).append(r)
    nodes = list(by_host.values())
    per_node = min(len(n) for n in nodes)
    shapes: list[GroupShape] = []

    def chunks(size: int) -> tuple[tuple[int, ...], ...] | None:
        out = []
        for ranks in nodes:
            if len(ranks) % size:
                return None
            out += [tuple(ranks[i:i + size]) for i in range(0, len(ranks), size)]
        return tuple(out)

    if gpus_per_package > 1 and per_node >= gpus_per_package:
        g = chunks(gpus_per_package)
        if g:
            shapes.append(GroupShape("package", g))
    for size in sorted({2, per_node}):
        if size < 2 or size > per_node or (size <= gpus_per_package and gpus_per_package > 1):
            continue
        g = chunks(size)
        if g:
            shapes.append(GroupShape("node", g))
    if len(nodes) > 1 and all(len(n) == per_node for n in nodes):
        across = tuple(tuple(n[i] for n in nodes) for i in range(per_node))
        shapes.append(GroupShape("network", across))
        if per_node > 1:
            shapes.append(GroupShape("network", (tuple(range(world)),)))
    return shapes


@dataclass
class WorkerConfig:
    gemms: list[Gemm]
    dtype: str
    min_bytes: int
    max_bytes: int
    gpus_per_package: int = 1
    ops: tuple[str, ...] = OPS
    mpi: bool = True
    matmul_budget_s: float = 0.2  # seconds of calls per GEMM (after warm-up)


_TORCH_DTYPES = {"fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def _sync(torch, device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_gemms(gemms: list[Gemm], dtype: str, device, budget_s: float) -> list[dict]:
    """Mean seconds per call of each GEMM (loops sized to about ``budget_s``)."""
    import torch

    tdtype = getattr(torch, _TORCH_DTYPES[dtype])
    if dtype == "tf32":
        torch.backends.cuda.matmul.allow_tf32 = True
    rows = []
    for g in gemms:
        a = torch.randn(g.m, g.k, dtype=tdtype, device=device)
        b = torch.randn(g.k, g.n, dtype=tdtype, device=device)
        torch.matmul(a, b)
        _sync(torch, device)
        t0 = time.perf_counter()
        torch.matmul(a, b)
        _sync(torch, device)
        once = max(time.perf_counter() - t0, 1e-7)
        reps = int(min(1000, max(3, budget_s / once)))
        t0 = time.perf_counter()
        for _ in range(reps):
            torch.matmul(a, b)
        _sync(torch, device)
        dt = (time.perf_counter() - t0) / reps
        rows.append({**asdict(g), "dtype": dtype, "reps": reps, "time_s": dt,
                     "flops": g.flops, "flops_per_s": g.flops / dt})
    return rows


def _torch_op(dist, op: str, nbytes: int, group, n: int, me: int, peer: int | None, torch,
              device):
    """A closure running ``op`` once on buffers of the cost model's size convention."""
    elems = max(n, nbytes // 4)
    elems -= elems % n
    if op == "all_reduce":
        buf = torch.ones(elems, device=device)
        return lambda: dist.all_reduce(buf, group=group)
    if op == "all_gather":
        out = torch.empty(elems, device=device)
        part = torch.ones(elems // n, device=device)
        return lambda: dist.all_gather_into_tensor(out, part, group=group)
    if op == "reduce_scatter":
        inp = torch.ones(elems, device=device)
        part = torch.empty(elems // n, device=device)
        return lambda: dist.reduce_scatter_tensor(part, inp, group=group)
    buf = torch.ones(elems, device=device)
    if peer is None:
        return lambda: None

    def pingpong():
        # Lower rank sends first; a round trip is two messages (time halved below).
        if me < peer:
            dist.send(buf, peer)
            dist.recv(buf, peer)
        else:
            dist.recv(buf, peer)
            dist.send(buf, peer)
    return pingpong


def _mpi_op(MPI, comm, op: str, nbytes: int, n: int, me: int, peer: int | None):
    import numpy as np

    elems = max(n, nbytes // 4)
    elems -= elems % n
    if op == "all_reduce":
        buf, out = np.ones(elems, np.float32), np.empty(elems, np.float32)
        return lambda: comm.Allreduce(buf, out, op=MPI.SUM)
    if op == "all_gather":
        part, out = np.ones(elems // n, np.float32), np.empty(elems, np.float32)
        return lambda: comm.Allgather(part, out)
    if op == "reduce_scatter":
        inp, part = np.ones(elems, np.float32), np.empty(elems // n, np.float32)
        return lambda: comm.Reduce_scatter_block(inp, part, op=MPI.SUM)
    buf = np.ones(elems, np.float32)
    if peer is None:
        return lambda: None

    def pingpong():
        if me < peer:
            comm.Send(buf, dest=peer)
            comm.Recv(buf, source=peer)
        else:
            comm.Recv(buf, source=peer)
            comm.Send(buf, dest=peer)
    return pingpong


def _pair_peer(group: tuple[int, ...], rank: int) -> int | None:
    """Send-receive pairs inside a group: (g0, g1), (g2, g3), ...; None for an odd last rank."""
    i = group.index(rank)
    j = i + 1 if i % 2 == 0 else i - 1
    return group[j] if j < len(group) else None


def time_collectives(cfg: WorkerConfig, rank: int, hosts: list[str], device,
                     progress=None) -> list[dict]:
    """Rows of (library, op, tier, group_size, nbytes, time_s) for gloo/NCCL and MPI."""
    import warnings

    import torch
    import torch.distributed as dist

    # torch 2.13 renames all_gather_into_tensor / reduce_scatter_tensor (same operation); the
    # old names keep working on every torch this project supports, so the notice is noise here.
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.distributed")
    shapes = group_shapes(hosts, cfg.gpus_per_package)
    sizes = message_sizes(cfg.min_bytes, cfg.max_bytes)
    backend = dist.get_backend()
    mpi = _mpi_world(len(hosts)) if cfg.mpi else None
    rows: list[dict] = []
    slowest = torch.zeros(1, dtype=torch.float64, device=device)
    for shape in shapes:
        # Every rank creates every group, in the same order (torch.distributed's rule).
        handles = [dist.new_group(list(g)) for g in shape.groups]
        gi = shape.group_of(rank)
        group, members = handles[gi], shape.groups[gi]
        sub = mpi[1].Split(color=gi, key=rank) if mpi else None
        for op in cfg.ops:
            for nbytes in sizes:
                reps = reps_for(nbytes)
                for library in (backend, "mpi") if mpi else (backend,):
                    peer = _pair_peer(members, rank) if op == "send_recv" else None
                    if library == "mpi":
                        mpeer = members.index(peer) if peer is not None else None
                        fn = _mpi_op(mpi[0], sub, op, nbytes, len(members),
                                     members.index(rank), mpeer)
                    else:
                        fn = _torch_op(dist, op, nbytes, group, len(members), rank, peer, torch,
                                       device)
                    fn()  # warm-up: connection set-up and first-touch
                    _sync(torch, device)
                    dist.barrier()
                    t0 = time.perf_counter()
                    for _ in range(reps):
                        fn()
                    _sync(torch, device)
                    dt = (time.perf_counter() - t0) / reps
                    if op == "send_recv":
                        dt /= 2  # a ping-pong is two messages
                        if peer is None:
                            dt = 0.0
                    slowest.fill_(dt)
                    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
                    rows.append({"library": library, "op": op, "tier": shape.tier,
                                 "group_size": shape.size, "groups": len(shape.groups),
                                 "nbytes": int(nbytes), "reps": reps,
                                 "time_s": float(slowest.item())})
            if progress and rank == 0:
                progress(f"{shape.tier} x{shape.size} {op} done")
        if sub is not None:
            sub.Free()
    return rows


def _mpi_world(world: int):
    """(MPI module, COMM_WORLD) when this process runs under an MPI launcher with the same
    world as torch.distributed; None otherwise (no MPI baseline then)."""
    launched = any(k in os.environ for k in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"))
    if not launched:
        return None
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    comm = MPI.COMM_WORLD
    return (MPI, comm) if comm.Get_size() == world else None


def versions(backend: str) -> dict[str, str]:
    import numpy
    import torch

    out = {"python": platform.python_version(), "torch": torch.__version__,
           "numpy": numpy.__version__, "frontier_llm": __version__, "backend": backend}
    if torch.cuda.is_available():
        out["cuda"] = str(torch.version.cuda or "")
        out["hip"] = str(getattr(torch.version, "hip", "") or "")
        try:
            v = torch.cuda.nccl.version()
            out["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception:
            pass
    try:
        import mpi4py

        out["mpi4py"] = mpi4py.__version__
        if any(k in os.environ for k in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")):
            from mpi4py import MPI

            out["mpi"] = MPI.Get_library_version().strip().splitlines()[0]
    except ImportError:
        pass
    return out


def run_worker(cfg: WorkerConfig, out_path: Path, model_name: str, system_name: str,
               progress=None) -> int:
    """The body of one rank: join the job, measure, rank 0 writes ``out_path``; exit code."""
    import torch
    import torch.distributed as dist

    from frontier_llm.bench.launch import detect
    from frontier_llm.bench.run import _teardown, collective_timeout_s

    renv = detect()
    if renv is None:
        raise RuntimeError("flm calibrate worker runs inside a launcher (mpiexec, srun, "
                           "torchrun or flm calibrate run)")
    rank, world = renv.rank, renv.world_size
    cuda = torch.cuda.is_available()
    if cuda:
        from frontier_llm.bench import placement

        index = placement.device_index(renv.local_rank, torch.cuda.device_count())
        torch.cuda.set_device(index)
        device, backend = torch.device("cuda", index), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    started = datetime.now(UTC).isoformat(timespec="seconds")
    from datetime import timedelta

    dist.init_process_group(backend, init_method=f"tcp://{renv.master_addr}:{renv.master_port}",
                            rank=rank, world_size=world,
                            timeout=timedelta(seconds=max(120.0, collective_timeout_s(world))),
                            device_id=device if cuda else None)
    code = 0
    try:
        hosts: list = [None] * world
        dist.all_gather_object(hosts, socket.gethostname())
        # Every rank times the GEMMs at once, as in training (they share the node's memory
        # and, on a CPU, its cores); rank 0's figures are kept.
        matmul = time_gemms(cfg.gemms, cfg.dtype, device, cfg.matmul_budget_s)
        if progress and rank == 0:
            progress(f"{len(matmul)} GEMMs timed")
        coll = time_collectives(cfg, rank, hosts, device, progress)
        if rank == 0:
            device_name = torch.cuda.get_device_name(device) if cuda else platform.processor() \
                or platform.machine()
            doc = {
                "schema": "flm-calibration/1",
                "provenance": {
                    "started_at": started,
                    "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
                    "hosts": sorted(set(hosts)), "rank_hosts": hosts,
                    "node_count": len(set(hosts)), "world_size": world,
                    "launcher": renv.launcher, "slurm_job_id": renv.slurm_job_id,
                    "device": device_name, "cpu_count": os.cpu_count(),
                    "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                    "dtype": cfg.dtype, "model": model_name, "system": system_name,
                    "min_bytes": cfg.min_bytes, "max_bytes": cfg.max_bytes,
                    "versions": versions(backend),
                },
                "matmul": matmul,
                "collectives": coll,
            }
            out_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = out_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(doc, indent=1))
            os.replace(tmp, out_path)  # atomic: a reader never sees half a file
    except Exception as exc:
        import sys

        print(f"flm calibrate worker rank {rank}: {type(exc).__name__}: {exc}", file=sys.stderr)
        code = 1
    _finalize_mpi()
    return _teardown(code, clean=code == 0)


def _finalize_mpi() -> None:
    """End MPI cleanly before the rank's os._exit (Hydra reports ranks that skip Finalize)."""
    import sys

    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.COMM_WORLD.Barrier()
        mpi.Finalize()

