"""Context parallelism in the native engine: all-gather attention over the cp group.

Each sequence is cut into 2·cp chunks and cp rank r holds chunks r and 2·cp-1-r
(``bench/data.py``: :func:`~frontier_llm.bench.data.cp_shard`). Everything but attention is
per-token and runs on the local tokens unchanged. Attention needs every earlier token's K and
V, so per layer each rank all-gathers K and V (after RoPE, which takes the tokens' global
positions) over its cp group into global sequence order, and its local queries attend to the
whole sequence under a causal mask built from global positions. This is Llama 3's scheme (Dubey
et al. 2024, §3.3.2: "all-gather based CP ... all-gather the K and V tensors, and then compute
attention output for the local Q tensor chunk") and the "allgather" rotate method of PyTorch's
``torch.distributed.tensor.experimental.context_parallel`` that torchtitan uses by default.

Why all-gather rather than a ring (ring attention, Megatron's p2p CP): with grouped-query
attention K and V are kv_heads/heads of Q's size (1/8 for Llama 3 70B), so gathering them
whole is cheap next to the attention it feeds; one collective per tensor instead of cp-1
dependent point-to-point steps is simpler and works with any mask (document masks, arbitrary
attention patterns), which the ring's per-block online softmax makes hard; Llama 3 chose it for
those reasons and accepts not overlapping the gather with compute. The cost: each rank holds the
full-sequence K and V of a layer (saved for backward), cp times the local K/V.

The backward of the gather is a reduce-scatter: every rank's queries contributed gradient to
every rank's keys and values, and the sum over the cp group of the slices that belong to a rank
is that rank's dK/dV. On CPUs (gloo) both are gloo collectives; on GPUs they are NCCL/RCCL
all-gather and reduce-scatter over the cp group, which the mesh keeps inside a node when tp·cp
fits in one (``bench/mesh.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from frontier_llm.bench.data import cp_positions

# torch 2.13 renamed the tensor collectives (``*_single``) and warns on the old names; the GPU
# machines' torch (docs/gpu.md) has only the old ones.
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@dataclass
class CPContext:
    """What a rank's attention needs to take part in context parallelism."""

    group: dist.ProcessGroup
    cp: int
    rank: int  # this rank's index in the cp group
    seq_len: int  # the whole sequence (global)
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def local_len(self) -> int:
        return self.seq_len // self.cp

    @property
    def ranges(self) -> tuple[range, range]:
        """The two global position ranges of this rank's tokens."""
        return cp_positions(self.seq_len, self.cp, self.rank)

    def positions(self, device: torch.device) -> torch.Tensor:
        """Global positions of this rank's tokens, in local order (int64)."""
        key = ("pos", device)
        if key not in self._cache:
            a, b = self.ranges
            self._cache[key] = torch.tensor([*a, *b], dtype=torch.long, device=device)
        return self._cache[key]

    def allowed(self, device: torch.device) -> torch.Tensor:
        """(local_len, seq_len) boolean: local query i may attend global key j (j <= pos i).

        One table shared by every layer (like the causal mask at cp 1)."""
        key = ("mask", device)
        if key not in self._cache:
            keys = torch.arange(self.seq_len, device=device)
            self._cache[key] = keys[None, :] <= self.positions(device)[:, None]
        return self._cache[key]

    def additive(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """:meth:`allowed` as the additive mask (0 / -inf) fused attention kernels take.

        Handing SDPA this one shared table rather than the boolean one keeps a single copy for
        every layer: given a boolean mask, SDPA converts it to this form on each call and saves
        that conversion for backward, an s/cp x s table per layer."""
        key = ("additive", device, dtype)
        if key not in self._cache:
            mask = torch.zeros(self.allowed(device).shape, dtype=dtype, device=device)
            self._cache[key] = mask.masked_fill_(~self.allowed(device), float("-inf"))
        return self._cache[key]

    def blocked(self, device: torch.device) -> torch.Tensor:
        """The complement of :meth:`allowed` (what the explicit path fills with -inf)."""
        key = ("blocked", device)
        if key not in self._cache:
            self._cache[key] = ~self.allowed(device)
        return self._cache[key]

    def local_rows(self, table: torch.Tensor) -> torch.Tensor:
        """Rows of a per-position table (RoPE cos/sin, learned positions) for this rank's
        tokens: two contiguous slices, so a replicated DTensor weight stays one."""
        a, b = self.ranges
        return torch.cat((table[a.start:a.stop], table[b.start:b.stop]), dim=0)

    def gather(self, x: torch.Tensor, dim: int = 2) -> torch.Tensor:
        """The global sequence of ``x`` (this rank's share along ``dim``), in global order;
        its backward sums each rank's slice of the gradient back to it."""
        return _GatherSequence.apply(x, self, dim)


def _to_global_order(gathered: list[torch.Tensor], cp: int, dim: int) -> torch.Tensor:
    """Rank-ordered shares (each: chunk r then chunk 2cp-1-r) to the sequence's own order."""
    halves = [g.chunk(2, dim=dim) for g in gathered]
    ordered = [halves[j][0] for j in range(cp)] + [halves[2 * cp - 1 - j][1]
                                                   for j in range(cp, 2 * cp)]
    return torch.cat(ordered, dim=dim)


def _to_rank_order(x: torch.Tensor, cp: int, dim: int) -> torch.Tensor:
    """The inverse of :func:`_to_global_order`: rank r's share (chunks r, 2cp-1-r) r-th."""
    chunks = x.chunk(2 * cp, dim=dim)
    return torch.cat([t for r in range(cp) for t in (chunks[r], chunks[2 * cp - 1 - r])],
                     dim=dim)


class _GatherSequence(torch.autograd.Function):
    """All-gather along the sequence over the cp group; backward: reduce-scatter (sum).

    Saves nothing itself: the gathered output is what the attention saves for backward, and
    the saved-activation meter counts it there."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, cpc: CPContext, dim: int) -> torch.Tensor:
        ctx.cpc, ctx.dim = cpc, dim
        # Collectives take the gathered axis first: move the sequence there.
        local = x.movedim(dim, 0).contiguous()
        out = local.new_empty((cpc.cp * local.shape[0], *local.shape[1:]))
        _ALL_GATHER(out, local, group=cpc.group)
        full = _to_global_order(list(out.chunk(cpc.cp, dim=0)), cpc.cp, 0)
        return full.movedim(0, dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        cpc, dim = ctx.cpc, ctx.dim
        ranked = _to_rank_order(grad.movedim(dim, 0), cpc.cp, 0).contiguous()
        out = ranked.new_empty((ranked.shape[0] // cpc.cp, *ranked.shape[1:]))
        _REDUCE_SCATTER(out, ranked, group=cpc.group)
        return out.movedim(0, dim), None, None
