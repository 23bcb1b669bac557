"""Adam on each rank's local tensors, with ZeRO-1 sharding and fp32 master weights.

One optimizer for every layout keeps the numbers comparable with the single-process reference:
the update is Adam exactly as ``torch.optim.Adam`` computes it (no weight decay), applied to the
local tensor of each parameter (a DTensor's shard under tensor parallelism or FSDP2, the plain
tensor otherwise). Its state is what the ZeRO paper (Rajbhandari et al. 2020) counts:

* fp32 training: ``exp_avg`` + ``exp_avg_sq``, 8 bytes per parameter;
* bf16/fp16 training (Megatron mixed precision): an fp32 master copy too, 12 bytes per parameter.

``shard_group`` given (ZeRO-1): the rank's local parameters are viewed as one flat vector of N
elements cut into ``world`` equal slices of ceil(N/world); each data-parallel rank keeps state
only for its slice, updates it, and an all-gather brings everyone the updated parameters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist

from frontier_llm.bench.local_tensors import local


def allreduce_mean(tensors: Sequence[torch.Tensor], group: dist.ProcessGroup,
                   bucket_bytes: int = 64 * 2**20) -> None:
    """Average ``tensors`` in place over ``group`` in flat buckets (gloo has no AVG op)."""
    world = dist.get_world_size(group)
    if world == 1:
        return
    bucket: list[torch.Tensor] = []
    size = 0

    def flush() -> None:
        nonlocal bucket, size
        if not bucket:
            return
        flat = torch.cat([t.reshape(-1) for t in bucket])
        dist.all_reduce(flat, group=group)
        flat.div_(world)
        offset = 0
        for t in bucket:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()
        bucket, size = [], 0

    for t in tensors:
        if bucket and (t.dtype != bucket[0].dtype or size + t.numel() * t.element_size()
                       > bucket_bytes):
            flush()
        bucket.append(t)
        size += t.numel() * t.element_size()
    flush()


class LocalAdam:
    """Adam over local tensors; ``shard_group`` shards its state ZeRO-1 style."""

    def __init__(self, params: Sequence[torch.nn.Parameter], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8,
                 shard_group: dist.ProcessGroup | None = None) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.lr, self.betas, self.eps = lr, betas, eps
        self.group = shard_group
        self.steps = 0
        locals_ = self._locals()
        self.mixed = any(t.dtype != torch.float32 for t in locals_)
        with torch.no_grad():
            if shard_group is None:
                self.master = [t.float().clone() for t in locals_] if self.mixed else None
                self.exp_avg = [torch.zeros_like(t, dtype=torch.float32) for t in locals_]
                self.exp_avg_sq = [torch.zeros_like(t, dtype=torch.float32) for t in locals_]
            else:
                world = dist.get_world_size(shard_group)
                self.rank = dist.get_rank(shard_group)
                self.numel = sum(t.numel() for t in locals_)
                self.shard = math.ceil(self.numel / world)
                lo = self.rank * self.shard
                # Padded to world * shard so every rank's slice has the same length. In fp32 the
                # parameters themselves are the master weights: the slice is cut afresh each step.
                self.master = ([self._flat(locals_, torch.float32)[lo:lo + self.shard].clone()]
                               if self.mixed else None)
                self.exp_avg = [torch.zeros(self.shard, device=locals_[0].device)]
                self.exp_avg_sq = [torch.zeros(self.shard, device=locals_[0].device)]

    def _locals(self) -> list[torch.Tensor]:
        # Looked up at every use: FSDP2 may swap which tensor a parameter's shard lives in.
        return [local(p.detach()) for p in self.params]

    def _flat(self, tensors: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        world = dist.get_world_size(self.group)
        flat = torch.zeros(world * self.shard, dtype=dtype, device=tensors[0].device)
        offset = 0
        for t in tensors:
            flat[offset:offset + t.numel()].copy_(t.reshape(-1))
            offset += t.numel()
        return flat

    def state_tensors(self) -> list[torch.Tensor]:
        """The optimizer state this rank holds: master copy, exp_avg, exp_avg_sq."""
        return [*self.exp_avg, *self.exp_avg_sq, *(self.master or [])]

    def state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds (master copy, exp_avg, exp_avg_sq)."""
        return sum(t.numel() * t.element_size() for t in self.state_tensors())

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def _grads(self, locals_: list[torch.Tensor]) -> list[torch.Tensor]:
        return [torch.zeros_like(t) if p.grad is None else local(p.grad)
                for p, t in zip(self.params, locals_, strict=True)]

    @torch.no_grad()
    def _adam(self, params: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
        b1, b2 = self.betas
        grads = [g.float() if g.dtype != torch.float32 else g for g in grads]
        torch._foreach_lerp_(self.exp_avg, grads, 1 - b1)
        torch._foreach_mul_(self.exp_avg_sq, b2)
        torch._foreach_addcmul_(self.exp_avg_sq, grads, grads, 1 - b2)
        bias1 = 1 - b1 ** self.steps
        bias2 = 1 - b2 ** self.steps
        denom = torch._foreach_sqrt(self.exp_avg_sq)
        torch._foreach_div_(denom, math.sqrt(bias2))
        torch._foreach_add_(denom, self.eps)
        torch._foreach_addcdiv_(params, self.exp_avg, denom, -self.lr / bias1)

    @torch.no_grad()
    def step(self) -> None:
        self.steps += 1
        locals_ = self._locals()
        grads = self._grads(locals_)
        if self.group is None:
            if self.master is None:
                self._adam(locals_, grads)
            else:
                self._adam(self.master, grads)
                torch._foreach_copy_(locals_, self.master)
            return
        lo = self.rank * self.shard
        flat_grad = self._flat(grads, torch.float32)[lo:lo + self.shard]
        master = self.master or [self._flat(locals_, torch.float32)[lo:lo + self.shard]]
        self._adam(master, [flat_grad])
        gathered = torch.empty(self.shard * dist.get_world_size(self.group),
                               dtype=torch.float32, device=flat_grad.device)
        dist.all_gather_into_tensor(gathered, master[0], group=self.group)
        offset = 0
        for t in locals_:
            t.copy_(gathered[offset:offset + t.numel()].view_as(t))
            offset += t.numel()


class AdamGroups:
    """Several :class:`LocalAdam` as one optimizer: parameters whose ZeRO-1 state is sharded
    over different groups (dense ones over dp x cp, routed experts over expert-dp)."""

    def __init__(self, parts: Sequence[LocalAdam]) -> None:
        self.parts = list(parts)

    def state_tensors(self) -> list[torch.Tensor]:
        return [t for part in self.parts for t in part.state_tensors()]

    def state_bytes(self) -> int:
        return sum(part.state_bytes() for part in self.parts)

    def zero_grad(self) -> None:
        for part in self.parts:
            part.zero_grad()

    def step(self) -> None:
        for part in self.parts:
            part.step()
