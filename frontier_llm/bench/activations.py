"""Peak bytes of tensors saved for backward, measured with ``saved_tensors_hooks``.

Every tensor autograd saves passes through :meth:`SavedTensorMeter.pack`; the meter counts its
storage once (several saved views of one storage hold one buffer) until the last reference from
the graph is released, and keeps the peak. Parameters (and views of them) are model state, not
activations, and are left out. Tensors saved inside a ``checkpoint`` region are recomputed, not
kept, and ``checkpoint`` hides them from outer hooks, so recomputation shows up as it should.
A checkpointed block's input does pass through the hooks: both the reentrant checkpoint and the
non-reentrant one (``_NoopSaveInputs``) save it with ``save_for_backward`` outside the region.

Op-level selective checkpointing (``recompute: selective-op``, bench/checkpoint_policy.py) keeps
some op outputs in a cache of the checkpoint's own, not as saved tensors, so the hooks never see
them. While the meter is measuring it is the :func:`active_meter`; at the end of each block's
forward the policy module hands it every cached output with :meth:`SavedTensorMeter.hold_while`,
and the meter counts that storage until the cache entry (torch's ``_VersionWrapper``) is dropped,
which happens when the recompute consumes it in backward, or when the graph is freed unused.
Both paths key on the storage, so an output cached and also saved is counted once.
"""

from __future__ import annotations

import contextlib
import weakref

import torch
from torch import nn

from frontier_llm.bench.local_tensors import is_dtensor


def _local(t: torch.Tensor) -> torch.Tensor:
    """The plain tensor holding the data: a DTensor's shard, an async collective's result."""
    while True:
        if is_dtensor(t):  # what TP-parallel modules save: count the local shard
            t = t._local_tensor
        elif type(t) is not torch.Tensor and isinstance(getattr(t, "elem", None), torch.Tensor):
            t = t.elem  # AsyncCollectiveTensor (functional collectives under SP)
        else:
            return t


_ACTIVE: list[SavedTensorMeter] = []  # meters inside measuring(), innermost last


def active_meter() -> SavedTensorMeter | None:
    """The meter measuring now (innermost), if any."""
    return _ACTIVE[-1] if _ACTIVE else None


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

    def _count(self, t: torch.Tensor) -> int | None:
        """Add one reference to ``t``'s storage; its key, or None when it is not counted."""
        if _is_param(t):
            return None
        storage = _local(t).untyped_storage()
        key = storage.data_ptr()
        if key == 0 or storage.nbytes() == 0:
            return None
        entry = self.live.get(key)
        if entry is None:
            self.live[key] = [storage.nbytes(), 1]
            self.current += storage.nbytes()
            self.peak = max(self.peak, self.current)
        else:
            entry[1] += 1
        return key

    def pack(self, t: torch.Tensor):
        key = self._count(t)
        return t if key is None else _Held(self, key, t)

    def hold_while(self, t: torch.Tensor, owner: object) -> None:
        """Count ``t``'s storage as kept for backward until ``owner`` is garbage (the meter
        holds no reference to ``t`` itself)."""
        key = self._count(t)
        if key is not None:
            weakref.finalize(owner, self._release, key)

    @staticmethod
    def unpack(held):
        return held.tensor if isinstance(held, _Held) else held

    def reset_peak(self) -> None:
        self.peak = self.current

    @contextlib.contextmanager
    def counting_under(self):
        """Count what the saved-tensor hooks on top now (torch's non-reentrant recomputation
        hook) keep: each saved tensor goes on to them as a fresh alias, which they store, and
        its storage is counted until that alias is garbage."""
        top = torch._C._autograd._top_saved_tensors_default_hooks(False)
        if top is None:
            yield
            return
        inner_pack, inner_unpack = top

        def pack(t: torch.Tensor):
            if _is_param(t):  # model state (a detached alias would hide it)
                return inner_pack(t)
            # The recomputation hook stores ``t.detach()`` anyway; detaching here hands it an
            # object nobody else holds (a cached table would never be released otherwise).
            alias = t.detach()
            self.hold_while(alias, alias)
            return inner_pack(alias)

        with torch.autograd.graph.saved_tensors_hooks(pack, inner_unpack):
            yield

    @contextlib.contextmanager
    def measuring(self):
        _ACTIVE.append(self)
        try:
            with torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack):
                yield self
        finally:
            _ACTIVE.remove(self)
