"""How a layout becomes a DeviceMesh, and which layouts the native engine refuses.

The mesh has four named dimensions, outermost first: ``pp``, ``dp_replicate``, ``dp_shard``,
``tp``. Tensor parallelism is innermost so that its ranks are consecutive (inside one node, as
Dash et al. 2023 and Narayanan et al. 2021 recommend); pipeline stages are outermost.

The data-parallel degree splits into ``dp_replicate x dp_shard`` by the layout's sharding:

=================  ==============================================  ============  ========
sharding           PyTorch                                         dp_replicate  dp_shard
=================  ==============================================  ============  ========
zero0              replicated data parallel, gradient all-reduce   dp            1
zero1              + optimizer state sharded (flat ZeRO-1 Adam)    dp            1
zero2              FSDP2 ``fully_shard(reshard_after_forward=False)``  1         dp
zero3 / full       FSDP2 ``fully_shard``                           1             dp
partial:k          HSDP: FSDP2 over a 2-D (dp/k, k) mesh           dp/k          k
=================  ==============================================  ============  ========

Everything here runs before any process group exists, so a bad layout costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from frontier_llm.errors import UserError
from frontier_llm.specs.layout import Engine, Layout
from frontier_llm.specs.model import ModelSpec

DIM_NAMES = ("pp", "dp_replicate", "dp_shard", "tp")
DataParallel = Literal["ddp", "zero1", "fsdp", "hsdp"]


@dataclass(frozen=True)
class MeshDims:
    pp: int
    dp_replicate: int
    dp_shard: int
    tp: int
    data_parallel: DataParallel
    reshard_after_forward: bool

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.tp

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.pp, self.dp_replicate, self.dp_shard, self.tp)

    def coords(self, rank: int) -> dict[str, int]:
        """Mesh coordinates of a global rank (row-major over DIM_NAMES)."""
        out = {}
        for name, size in reversed(list(zip(DIM_NAMES, self.shape, strict=True))):
            out[name] = rank % size
            rank //= size
        out["dp"] = out["dp_replicate"] * self.dp_shard + out["dp_shard"]
        return out

    def rank_of(self, pp: int, dp_replicate: int, dp_shard: int, tp: int) -> int:
        return ((pp * self.dp_replicate + dp_replicate) * self.dp_shard + dp_shard) * self.tp + tp


def mesh_dims(layout: Layout) -> MeshDims:
    """The mesh for ``layout``; UserError when its sharding has no PyTorch-native equivalent."""
    sh, dp = layout.sharding, layout.dp
    deg = {c: getattr(sh, c).degree(dp) for c in ("params", "grads", "optim")}
    base = {"pp": layout.pp, "tp": layout.tp}
    if dp == 1 or deg == {"params": 1, "grads": 1, "optim": 1}:
        return MeshDims(dp_replicate=dp, dp_shard=1, data_parallel="ddp",
                        reshard_after_forward=False, **base)
    if deg == {"params": 1, "grads": 1, "optim": dp}:
        return MeshDims(dp_replicate=dp, dp_shard=1, data_parallel="zero1",
                        reshard_after_forward=False, **base)
    if deg == {"params": 1, "grads": dp, "optim": dp}:
        return MeshDims(dp_replicate=1, dp_shard=dp, data_parallel="fsdp",
                        reshard_after_forward=False, **base)
    if deg == {"params": dp, "grads": dp, "optim": dp}:
        return MeshDims(dp_replicate=1, dp_shard=dp, data_parallel="fsdp",
                        reshard_after_forward=layout.reshard_after_forward, **base)
    k = deg["params"]
    if deg["grads"] == k and deg["optim"] == k:
        return MeshDims(dp_replicate=dp // k, dp_shard=k, data_parallel="hsdp",
                        reshard_after_forward=layout.reshard_after_forward, **base)
    raise UserError(
        f"sharding {sh.describe()} has no PyTorch-native equivalent in the native engine: it "
        "runs zero0, zero1, zero2, zero3 and HSDP (params, grads and optimizer all partial:k)"
    )


def check_layout(model: ModelSpec, layout: Layout, world_size: int | None = None
                 ) -> MeshDims:
    """Refuse, with the rule named, any layout the engine cannot run truthfully."""
    layout.check_model(model)
    if world_size is not None:
        layout.check_world(world_size)
    # The native engine's own rules (whole K/V heads, an exactly split vocabulary, no fp16,
    # a micro-batch per stage under 1F1B)
    # are engine_rules' and were applied above, by Layout and check_model.
    if layout.engine != Engine.NATIVE:
        raise UserError(
            f"flm bench runs engine native only (got engine {layout.engine}): plan and predict "
            "other engines with flm plan / flm predict --engine"
        )
    return mesh_dims(layout)
