"""Peak bytes of tensors saved for backward, measured with ``saved_tensors_hooks``.

Every tensor autograd saves passes through :meth:`SavedTensorMeter.pack`; the meter counts its
storage once (several saved views of one storage hold one buffer) until the last reference from
the graph is released, and keeps the peak. Parameters (and views of them) are model state, not
activations, and are left out. Tensors saved inside a ``checkpoint`` region are recomputed, not
kept, and ``checkpoint`` hides them from outer hooks, so recomputation shows up as it should.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

try:  # DTensor is what TP-parallel modules save; count the local shard.
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover
    DTensor = ()  # type: ignore[assignment]


def _local(t: torch.Tensor) -> torch.Tensor:
    """The plain tensor holding the data: a DTensor's shard, an async collective's result."""
    while True:
        if isinstance(t, DTensor):
            t = t._local_tensor
        elif type(t) is not torch.Tensor and isinstance(getattr(t, "elem", None), torch.Tensor):
            t = t.elem  # AsyncCollectiveTensor (functional collectives under SP)
        else:
            return t


def _is_param(t: torch.Tensor) -> bool:
    return isinstance(t, nn.Parameter) or isinstance(getattr(t, "_base", None), nn.Parameter)


class _Held:
    __slots__ = ("key", "meter", "tensor")

    def __init__(self, meter: SavedTensorMeter, key: int, tensor: torch.Tensor) -> None:
        self.meter, self.key, self.tensor = meter, key, tensor

    def __del__(self) -> None:
        self.meter._release(self.key)


class SavedTensorMeter:
    """Live and peak bytes of saved-for-backward storages (per rank)."""

    def __init__(self) -> None:
        self.live: dict[int, list[int]] = {}  # storage ptr -> [bytes, references]
        self.current = 0
        self.peak = 0
        self.by_kind: dict[str, int] = {}

    def _release(self, key: int) -> None:
        entry = self.live.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            self.current -= entry[0]
            del self.live[key]

    def pack(self, t: torch.Tensor):
        if _is_param(t):
            return t
        loc = _local(t)
        storage = loc.untyped_storage()
        key = storage.data_ptr()
        if key == 0 or storage.nbytes() == 0:
            return t
        entry = self.live.get(key)
        if entry is None:
            self.live[key] = [storage.nbytes(), 1]
            self.current += storage.nbytes()
            self.peak = max(self.peak, self.current)
        else:
            entry[1] += 1
        return _Held(self, key, t)

    @staticmethod
    def unpack(held):
        return held.tensor if isinstance(held, _Held) else held

    def reset_peak(self) -> None:
        self.peak = self.current

    @contextlib.contextmanager
    def measuring(self):
        with torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack):
            yield self
