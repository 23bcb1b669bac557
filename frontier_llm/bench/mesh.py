"""How a layout becomes a DeviceMesh, and which layouts the native engine refuses.

The mesh has five named dimensions, outermost first: ``pp``, ``dp_replicate``, ``dp_shard``,
``cp``, ``tp``. Tensor parallelism is innermost so that its ranks are consecutive (inside one
node, as Dash et al. 2023 and Narayanan et al. 2021 recommend); context parallelism comes next,
so a cp group has stride tp and stays inside a node as long as tp·cp does (torchtitan's order
``pp, dp_replicate, dp_shard, cp, tp``; Megatron's ``tp-cp-ep-dp-pp``); pipeline stages are
outermost.

The cp ranks of a replica hold the same parameters and see different tokens of the same
sequences, so every data-parallel reduction (gradient all-reduce, ZeRO/FSDP sharding) runs over
dp x cp, the layout's ``shard_ranks`` (torchtitan's flattened ``dp_shard_cp``). The sharding
degrees below are read over those dp·cp ranks; in the table, "dp" means dp·cp:

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

from collections import defaultdict
from dataclasses import dataclass
from typing import Literal

from frontier_llm.errors import UserError
from frontier_llm.specs import axes
from frontier_llm.specs.layout import Engine, Layout
from frontier_llm.specs.model import ModelSpec

DIM_NAMES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
DataParallel = Literal["ddp", "zero1", "fsdp", "hsdp"]


@dataclass(frozen=True)
class MeshDims:
    pp: int
    dp_replicate: int
    dp_shard: int
    tp: int
    data_parallel: DataParallel
    reshard_after_forward: bool
    cp: int = 1
    # Expert parallelism re-folds the dp x cp ranks (specs/axes.py): no mesh dimension of its
    # own, only a coordinate and the groups of bench/engine.py.
    ep: int = 1

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def world_size(self) -> int:
        return axes.world_size(self)

    @property
    def shard_ranks(self) -> int:
        """Ranks holding the same parameters (dp x cp): who reduces gradients together."""
        return axes.shard_ranks(self)

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        return (self.pp, self.dp_replicate, self.dp_shard, self.cp, self.tp)

    @property
    def shard_dims(self) -> tuple[str, ...]:
        """The mesh dimensions FSDP2 shards over: ``dp_shard`` and ``cp`` (flattened when
        cp > 1), as torchtitan's ``dp_shard_cp``."""
        return ("dp_shard", "cp") if self.cp > 1 else ("dp_shard",)

    @property
    def reduce_dims(self) -> tuple[str, ...]:
        """The dimensions a replicated (DDP / ZeRO-1) gradient is averaged over: every rank
        holding the same parameters."""
        return ("dp_replicate", "cp") if self.cp > 1 else ("dp_replicate",)

    def coords(self, rank: int) -> dict[str, int]:
        """Mesh coordinates of a global rank (row-major over DIM_NAMES)."""
        out = {"ep": axes.coords(rank, self)["ep"]}
        for name, size in reversed(list(zip(DIM_NAMES, self.shape, strict=True))):
            out[name] = rank % size
            rank //= size
        out["dp"] = out["dp_replicate"] * self.dp_shard + out["dp_shard"]
        return out

    def rank_of(self, pp: int, dp_replicate: int, dp_shard: int, tp: int, cp: int = 0,
                ep: int | None = None) -> int:
        """The rank at these mesh coordinates; ``ep`` is implied by the others and ignored (it
        is accepted so that :meth:`coords`' output can be passed back)."""
        return (((pp * self.dp_replicate + dp_replicate) * self.dp_shard + dp_shard) * self.cp
                + cp) * self.tp + tp


def mesh_dims(layout: Layout) -> MeshDims:
    """The mesh for ``layout``; UserError when its sharding has no PyTorch-native equivalent."""
    # Degrees over every rank holding the same parameters (dp x cp); the cp ranks of a replica
    # always sit inside one shard group (dp_shard x cp), never split across replicas.
    sh, dp, cp, n = layout.sharding, layout.dp, layout.cp, layout.shard_ranks
    deg = {c: getattr(sh, c).degree(n) for c in ("params", "grads", "optim")}
    # Every degree but dp, which the sharding splits into replicate x shard below.
    base = {str(a): axes.degree(layout, a) for a in axes.AXES if a is not axes.Axis.DP}
    if n == 1 or deg == {"params": 1, "grads": 1, "optim": 1}:
        return MeshDims(dp_replicate=dp, dp_shard=1, data_parallel="ddp",
                        reshard_after_forward=False, **base)
    if deg == {"params": 1, "grads": 1, "optim": n}:
        return MeshDims(dp_replicate=dp, dp_shard=1, data_parallel="zero1",
                        reshard_after_forward=False, **base)
    if deg == {"params": 1, "grads": n, "optim": n}:
        return MeshDims(dp_replicate=1, dp_shard=dp, data_parallel="fsdp",
                        reshard_after_forward=False, **base)
    if deg == {"params": n, "grads": n, "optim": n}:
        return MeshDims(dp_replicate=1, dp_shard=dp, data_parallel="fsdp",
                        reshard_after_forward=layout.reshard_after_forward, **base)
    k = deg["params"]
    if deg["grads"] == k and deg["optim"] == k and k % cp == 0:
        return MeshDims(dp_replicate=n // k, dp_shard=k // cp, data_parallel="hsdp",
                        reshard_after_forward=layout.reshard_after_forward, **base)
    raise UserError(
        f"sharding {sh.describe()} has no PyTorch-native equivalent in the native engine: it "
        "runs zero0, zero1, zero2, zero3 and HSDP (params, grads and optimizer all partial:k"
        + (f", k a multiple of cp {cp}: a cp group shares one shard group)" if cp > 1 else ")")
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
    dims = mesh_dims(layout)
    if model.is_moe:
        check_moe(model, layout, dims)
    check_expert_tp(layout)
    return dims


def check_expert_tp(layout: Layout) -> None:
    """flm bench runs the experts at tp only: its MoE block splits each expert's MLP over the
    tp ranks like a dense one (bench/moe.py) and :func:`expert_groups` cuts ep groups from the
    dp x cp ranks of one tp index, so an etp other than tp (stored non-zero: specs/axes.py)
    has no mesh here."""
    if layout.etp:
        raise UserError(f"etp {layout.etp} with tp {layout.tp}: flm bench's native engine "
                        "splits every expert over the tp ranks and forms its expert-parallel "
                        "groups from dp x cp only (no expert-tp mesh of its own): leave --etp "
                        "out (etp = tp), or predict the fold with flm predict --engine megatron")


def check_moe(model: ModelSpec, layout: Layout, dims: MeshDims) -> None:
    """What flm bench's MoE block (bench/moe.py) does not run, each refused with its reason.

    Runs: sequence parallelism (the block gathers the sequence over tp before routing,
    bench/parallelize.py ``moe_sequence_parallel``), recompute of every kind (a recomputed
    block replays its routing uncounted, bench/moe.py ``block_runs``) and, with ep > 1,
    zero0, zero1, FSDP2 (zero2 / zero3) and HSDP where ep divides the shard group: dense
    parameters sharded over dp x cp, routed experts over expert-dp (bench/engine.py
    ``_expert_mesh``, ``_optimizer``); and cp (the aux loss's counts summed over the cp group,
    bench/moe.py ``MoE._aux_loss``)."""
    if layout.cp > 1 and model.capacity_factor is not None:
        # Capacity is a share of the tokens an expert sees per micro-batch; a cp rank routes
        # part of each sequence, so it would drop by its own count and order (Megatron-Core's
        # too), not by the whole micro-batch's as one process does.
        raise UserError(f"cp {layout.cp} with capacity_factor {model.capacity_factor}: flm "
                        "bench's native engine drops tokens at capacity over whole sequences "
                        "only (use cp 1, or a dropless model)")
    if layout.ep > 1 and dims.data_parallel == "hsdp" and (
            dims.cp > 1 or dims.dp_shard % layout.ep):
        # HSDP shards experts over (dp_replicate, dp_shard / ep), the ranks holding the same
        # experts when each ep group lies inside one shard group (bench/engine.py
        # _expert_mesh); otherwise expert-dp is no such grid.
        raise UserError(f"ep {layout.ep} with sharding {layout.sharding.describe()}: flm "
                        "bench's native engine runs HSDP (partial:k) with expert parallelism "
                        f"where ep divides the shard group (k {dims.dp_shard * dims.cp}) at cp "
                        "1 only")


def expert_groups(layout: Layout) -> tuple[list[list[int]], list[list[int]]]:
    """(ep groups, expert-dp groups) as rank lists, every group of the world in one order.

    Within one pipeline stage and tp index, the ranks ordered by their dp x cp index (cp
    fastest) are cut into runs of ep consecutive ranks, the ep groups (specs/axes.py
    ``coords``: a rank's ep index is its place in its run); the ranks at the same place of every
    run hold the same experts and reduce their gradients together (expert-dp)."""
    ep = int(axes.degree(layout, axes.Axis.EP))
    replicas: dict[tuple[int, int], list[tuple[int, int, int]]] = defaultdict(list)
    for rank in range(int(axes.world_size(layout))):
        c = axes.coords(rank, layout)
        replicas[(c["pp"], c["tp"])].append((c["dp"], c["cp"], rank))
    ep_groups: list[list[int]] = []
    edp_groups: list[list[int]] = []
    for key in sorted(replicas):
        ranks = [r for *_, r in sorted(replicas[key])]
        ep_groups += [ranks[i:i + ep] for i in range(0, len(ranks), ep)]
        edp_groups += [ranks[j::ep] for j in range(ep)]
    return ep_groups, edp_groups
