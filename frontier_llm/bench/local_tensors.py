"""What a rank stores for a tensor that may be a DTensor, without importing DTensor.

``torch.distributed.tensor`` costs each rank about 0.7 s of start-up (as much again as half of
``import torch``), and a layout with no tensor parallelism and no FSDP never makes a DTensor. A
DTensor can exist only once its module is loaded, so asking ``sys.modules`` answers "is this a
DTensor?" for every layout, and only the layouts that shard pay for the import
(``engine.NativeEngine`` loads :mod:`.parallelize` when it applies TP or FSDP2).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

import torch


def is_dtensor(t: object) -> bool:
    mod = sys.modules.get("torch.distributed.tensor")
    return mod is not None and isinstance(t, mod.DTensor)


def local(t: torch.Tensor) -> torch.Tensor:
    """The tensor this rank stores for ``t`` (a DTensor's local shard, else ``t``)."""
    return t._local_tensor if is_dtensor(t) else t


def local_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes this rank stores for ``tensors`` (each storage counted once)."""
    seen: set[tuple] = set()
    total = 0
    for t in tensors:
        if t is None:
            continue
        loc = local(t)
        key = loc.untyped_storage().data_ptr() if loc.numel() else id(loc)
        view_key = (key, loc.storage_offset(), tuple(loc.shape))
        if view_key in seen:
            continue
        seen.add(view_key)
        total += loc.numel() * loc.element_size()
    return total
