"""Where a rank runs and how its collectives travel: pure functions of the environment.

* The device: the local rank modulo the devices this rank can see. Under ``--gpu-bind=closest``
  (Frontier) each rank sees one GCD, relabelled 0; with CPU masks and every GCD visible (LUMI),
  or plain ``--gpus-per-node`` (DGX), it sees all of the node's and takes its own.
* The transport: what RCCL/NCCL used between nodes — from its debug log when there is one
  (``NET/OFI``, ``Using network Socket``), else from ``NCCL_NET``, else unknown; gloo on CPUs.
  A run of several nodes whose collectives went over TCP sockets is ``suspect``: RCCL falls back
  to sockets when the network plugin does not load, and its collectives are then 10-20x slower
  (OLCF PyTorch guide, "RCCL Network Plugin").
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

VISIBLE_VARS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
_CHOSEN = re.compile(r"Using network (\S+)")
_NET = re.compile(r"NET/(OFI|Socket|IB)\b")


def device_index(local_rank: int, visible: int) -> int:
    """The index (among the visible devices) this rank drives."""
    if visible < 1:
        raise RuntimeError("this rank sees no GPU (check the job's GPU binding)")
    return local_rank % visible


def visible_count(env: Mapping[str, str]) -> int | None:
    """Devices the visibility variables leave this rank (the fewest when several are set, as
    each filters the one before it); None when none is set (the runtime shows all)."""
    counts = [len([d for d in env[k].split(",") if d.strip()]) for k in VISIBLE_VARS if k in env]
    return min(counts) if counts else None


def engine_local_rank(local_rank: int, device_index: int | None) -> int:
    """``LOCAL_RANK`` for an engine that calls ``set_device(LOCAL_RANK)`` itself (DeepSpeed
    does, in ``init_distributed`` and its engine): the device index this rank chose, not its
    SLURM local id, which under ``--gpu-bind=closest`` names a GCD the rank cannot see."""
    return local_rank if device_index is None else device_index


def visible_devices(env: Mapping[str, str]) -> dict[str, str]:
    """The device-visibility variables the launcher set for this rank."""
    return {k: env[k] for k in VISIBLE_VARS if k in env}


# The job script (and the local executor) name here, space-separated, the variables the sweep
# passes through from the submitting shell (environment.pass_env): names only, never values.
PASS_ENV_VAR = "FLM_PASS_ENV"


def passed_env(env: Mapping[str, str]) -> list[str]:
    """The pass-through variables this rank received: their names, never their values (a
    trace is shared as freely as a log)."""
    return sorted(n for n in env.get(PASS_ENV_VAR, "").split() if n in env)


def node_count(env: Mapping[str, str]) -> int:
    """Nodes of this run's job step (SLURM), else 1."""
    for key in ("SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
        value = env.get(key, "")
        if value.isdigit():
            return int(value)
    return 1


def transport_from_log(text: str) -> str | None:
    """The network NCCL/RCCL reports in its INFO log (``OFI``, ``Socket``, ``IB``), or None.

    The "Using network X" line names the one chosen; without it, a plugin's ``NET/OFI`` line
    (LUMI's PyTorch guide quotes ``NET/OFI Using aws-ofi-rccl``) beats ``NET/Socket``.
    """
    chosen = _CHOSEN.findall(text)
    if chosen:
        return _net_name(chosen[-1])
    names = _NET.findall(text)
    if not names:
        return None
    return next((n for n in names if n != "Socket"), "Socket")


def transport(backend: str, env: Mapping[str, str], log_text: str = "") -> str:
    """The collective transport: gloo, or NCCL/RCCL's network (log, else NCCL_NET)."""
    if backend != "nccl":
        return backend
    given = env.get("NCCL_NET")
    return transport_from_log(log_text) or (_net_name(given) if given else "unknown")


def _net_name(name: str) -> str:
    """The libfabric plugin under any of its names ("AWS Libfabric", OFI) is ``OFI``."""
    return "OFI" if name.lower().startswith(("aws", "libfabric", "ofi")) else name


def is_suspect(transport_name: str, nodes: int) -> bool:
    """A run across nodes over TCP sockets is not a clean measurement."""
    return nodes > 1 and transport_name.lower() == "socket"


# How long a collective may wait for a peer. The slow collective is a communicator's first:
# NCCL/RCCL set-up exchanges every rank's address (bootstrap) and connects the ring and tree
# peers, which grows with the number of ranks; a step's collective moves at most a few GB and
# takes seconds. So the bound grows by a fixed time per doubling of the ranks past one node (as
# a tree adds one level per doubling; stated, not measured: no site publishes set-up times),
# never linearly, and never past PyTorch's own default for NCCL process groups (10 minutes:
# https://docs.pytorch.org/docs/stable/distributed.html#torch.distributed.init_process_group,
# "Default value is 10 minutes for NCCL", read 2026-11-28). 8 ranks: 30 s; 3,072 (384 Frontier
# nodes): 288 s; 75,264 (all 9,408 nodes): 426 s, 6 % of a 2-hour job.
COLLECTIVE_TIMEOUT_BASE_S = 30.0
COLLECTIVE_TIMEOUT_PER_DOUBLING_S = 30.0
COLLECTIVE_TIMEOUT_ANCHOR_RANKS = 8
COLLECTIVE_TIMEOUT_CAP_S = 600.0


# The first rendezvous (every rank connected to rank 0's store) is bounded apart from the hang
# bound: the ranks arrive as fast as they import their environment, which at scale from a
# parallel file system takes minutes (jobs/walltime.py: 204 s predicted at 9,408 Frontier nodes,
# with spread between ranks), and a rank still importing is not hung. PyTorch's own default
# for a non-NCCL process group, 30 minutes (the page cited above), bounds a rank that never
# comes; a rank that died at start is caught sooner by srun --wait (jobs/launchers.py).
RENDEZVOUS_TIMEOUT_S = 1800.0


def rendezvous_timeout_s(world_size: int, env: Mapping[str, str]) -> float:
    """Seconds the ranks wait for each other at start-up: ``FLM_RENDEZVOUS_TIMEOUT`` when set,
    else :data:`RENDEZVOUS_TIMEOUT_S`, never below the collective timeout."""
    given = env.get("FLM_RENDEZVOUS_TIMEOUT")
    if given:
        return float(given)
    return max(RENDEZVOUS_TIMEOUT_S, collective_timeout_s(world_size, env))


def collective_timeout_s(world_size: int, env: Mapping[str, str]) -> float:
    """Seconds a collective waits for a peer: ``FLM_COLLECTIVE_TIMEOUT`` when set, else 30 s
    plus 30 s per doubling of the ranks past 8, at most 600 s (constants above)."""
    given = env.get("FLM_COLLECTIVE_TIMEOUT")
    if given:
        return float(given)
    doublings = max(0.0, math.log2(max(world_size, 1) / COLLECTIVE_TIMEOUT_ANCHOR_RANKS))
    return min(COLLECTIVE_TIMEOUT_CAP_S,
               COLLECTIVE_TIMEOUT_BASE_S + COLLECTIVE_TIMEOUT_PER_DOUBLING_S * doublings)
