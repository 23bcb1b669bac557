"""Device memory outside the model's tensors: the reserve (docs/costmodel.md, "The reserve").

Three physical quantities, each from its own source, replace the fixed 5 GB the catalog assumed:

- **Context** (``SystemSpec.memory_context_bytes``): the CUDA/HIP context and the modules it
  loads, which no allocator statistic counts. PyTorch measured it on its own process: 287,047,680
  bytes with lazy module loading and 666,632,192 bytes eager (pytorch/pytorch#86509, the PR that
  made ``CUDA_MODULE_LOADING=LAZY`` PyTorch's default); a training step loads the kernels of
  cuBLAS, cuDNN, NCCL and flash attention, so the catalog takes the eager figure.
- **Collective buffers** (:func:`collective_bytes`): NCCL (and RCCL, its fork) gives every
  connection of every channel of a communicator one buffer per protocol, allocated with
  ``cudaMalloc`` outside PyTorch's allocator: SIMPLE ``NCCL_BUFFSIZE`` = 4 MiB (``DEFAULT_BUFFSIZE
  (1 << 22)``), LL128 120·640·8·8 = 4,915,200 bytes and LL 8·512·8·16 = 524,288 bytes
  (NVIDIA/nccl ``src/init.cc``, ``DEFAULT_*BUFFSIZE``; the NCCL user guide's environment
  variables page gives ``NCCL_BUFFSIZE``'s default, 4194304). 9,633,792 bytes a connection, as
  measured: NCCL's proxy maps 9,641,984 bytes (the same buffers page-rounded) per connection
  (tonyd2wild/DeepSeek-V4.1-Flash-vLLM-DGX-Spark#8, a bpftrace of ``sendProxyConnect``). A rank
  holds one connection per channel of each communicator its engine runs collectives on
  (its ring neighbour); the system file states the channels (``collective_channels``).
- **Fragmentation** (``SystemSpec.allocator_fragmentation``): the caching allocator reserves
  more than it has allocated at its peak (freed blocks cached per stream and size class);
  ``max_memory_reserved / max_memory_allocated`` of a training process, measured at 16,726 /
  15,006 MB and 19,354 / 17,402 MB (pytorch/pytorch#40989, ``torch.cuda.memory_summary``):
  +11.5 % and +11.2 %, the share the catalog takes of the allocated peak.

The allocator's own peak (``max_memory_reserved``, what torchtitan logs) is the allocated peak
plus fragmentation; the device's is that plus the context and the collective buffers.
"""

from __future__ import annotations

import numpy as np

from frontier_llm.costmodel.layouts import LayoutTable
from frontier_llm.specs.layout import Engine
from frontier_llm.specs.system import SystemSpec

# NVIDIA/nccl src/init.cc: DEFAULT_BUFFSIZE, DEFAULT_LL128_BUFFSIZE, DEFAULT_LL_BUFFSIZE.
NCCL_SIMPLE_BYTES = 1 << 22
NCCL_LL128_BYTES = 120 * 640 * 8 * 8
NCCL_LL_BYTES = 8 * 512 * 8 * 16
CONNECTION_BYTES = NCCL_SIMPLE_BYTES + NCCL_LL128_BYTES + NCCL_LL_BYTES


def communicators(t: LayoutTable) -> np.ndarray:
    """Communicators a rank runs collectives on, each a process group of more than one rank:
    one per parallel dimension (tp, cp, pp, the dp x cp sharding group, ep), the world group
    when it is none of them, and Megatron-LM's two extra groups (the embedding group of the
    first and last stage, which all-reduces the tied embedding's gradient when pp > 1; the
    model-parallel group of tp x pp ranks, over which it reduces the gradient norm)."""
    dims = [t.tp, t.cp, t.pp, t.shard_ranks, t.ep]
    n = sum((np.asarray(d) > 1).astype(int) for d in dims)
    biggest = np.maximum.reduce([np.asarray(d) for d in dims])
    n = n + (t.world_size > biggest)
    megatron = t.engine == Engine.MEGATRON.code
    extra = (t.pp > 1).astype(int) + ((t.tp > 1) & (t.pp > 1)).astype(int)
    return n + np.where(megatron, extra, 0)


def collective_bytes(system: SystemSpec, t: LayoutTable) -> np.ndarray:
    """NCCL/RCCL buffers a rank holds: channels x one connection x :data:`CONNECTION_BYTES`
    per communicator (none over gloo: ``collective_channels`` 0)."""
    return communicators(t) * system.collective_channels * float(CONNECTION_BYTES)


def reserve_terms(system: SystemSpec, t: LayoutTable, allocated: np.ndarray
                  ) -> dict[str, np.ndarray]:
    """The reserve's three terms beside an allocated peak (bytes per rank), and any fixed
    further reserve the system file states (``memory_reserved_bytes``, 0 in the catalog)."""
    n = len(t)
    return {
        "context": np.full(n, system.memory_context_bytes + system.memory_reserved_bytes,
                           dtype=float),
        "collective": np.asarray(collective_bytes(system, t), dtype=float),
        "fragmentation": system.allocator_fragmentation * np.asarray(allocated, dtype=float),
    }
