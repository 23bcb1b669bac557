"""NativeEngine: one rank of a PyTorch-native TP x CP x PP x (FSDP | DDP | ZeRO-1) training run.

Build order (TorchTitan's): mesh -> this rank's pipeline stage modules with deterministic weights
-> tensor/sequence parallel -> FSDP2 -> pipeline schedule -> optimizer. ``step()`` runs one
optimizer step over the rank's share of the global batch and returns the loss this rank saw
(last pipeline stage only; ``None`` elsewhere).

:func:`reference_losses` is the single-process, no-parallelism run every layout must match.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from frontier_llm.bench.activations import SavedTensorMeter
from frontier_llm.bench.context_parallel import CPContext
from frontier_llm.bench.data import TokenSource, cp_shard
from frontier_llm.bench.local_tensors import is_dtensor, local, local_bytes
from frontier_llm.bench.mesh import DIM_NAMES, MeshDims, check_layout, expert_groups
from frontier_llm.bench.model import DTYPES, GPT, apply_cp, build_model, loss_fn
from frontier_llm.bench.moe import (
    EPContext,
    apply_ep,
    ep_experts,
    is_expert_param,
    set_aux_scale,
    take_stats,
)
from frontier_llm.bench.optim import AdamGroups, LocalAdam, allreduce_mean
from frontier_llm.bench.pipeline import build_schedule, stage_io
from frontier_llm.bench.trace_moe import step_record
from frontier_llm.specs.layout import DType, Layout
from frontier_llm.specs.model import ModelSpec

LR = 1e-3


@dataclass
class RankState:
    """Model-state bytes this rank holds (its local shards)."""

    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int


class NativeEngine:
    """Build and train one rank's part of the model (call after init_process_group)."""

    name = "native"

    def __init__(self, spec: ModelSpec, layout: Layout, *, rank: int, world_size: int,
                 device: torch.device, seed: int = 0, data: str | None = None,
                 bucket_bytes: int | None = None,
                 grad_sync_each_microbatch: bool = False) -> None:
        from torch.distributed.device_mesh import init_device_mesh

        self.spec, self.layout, self.device, self.seed = spec, layout, device, seed
        self.bucket_bytes = bucket_bytes
        # FSDP2 gradient accumulation: reduce-scatter after every micro-batch (torchtitan's
        # way) instead of only after the last (flm bench's default); specs/engine_rules.py
        # GRAD_SYNC_EACH, priced by the cost model's ``grad_sync``.
        self.grad_sync_each_microbatch = grad_sync_each_microbatch
        self.dims: MeshDims = check_layout(spec, layout, world_size)
        self.coords = self.dims.coords(rank)
        self.rank = rank
        d = self.dims
        self.mesh = init_device_mesh(device.type, d.shape, mesh_dim_names=DIM_NAMES)
        # Same seed on the ranks of one TP group: dropout on replicated activations must agree.
        torch.manual_seed(seed + 7919 * self.coords["dp"] + 104729 * self.coords["pp"]
                          + 1299709 * self.coords["cp"])
        self.data = TokenSource(spec.vocab, spec.seq_len, seed, data)
        self.meter = SavedTensorMeter()
        # Context parallelism: this rank's share of each sequence and its cp group, which every
        # attention layer gathers K/V over (bench/context_parallel.py).
        self.cpc = (CPContext(self.mesh["cp"].get_group(), d.cp, self.coords["cp"], spec.seq_len)
                    if d.cp > 1 else None)
        shard_mesh = self._shard_mesh() if d.data_parallel in ("fsdp", "hsdp") else None
        # Expert parallelism: this rank's ep group (whose experts it splits with) and expert-dp
        # group (the ranks holding the same experts), from specs/axes.py's ep coordinate.
        self.ep_ctx, self.edp_group = self._expert_groups() if layout.ep > 1 else (None, None)
        expert_mesh = self._expert_mesh() if shard_mesh is not None else None

        num_stages = layout.chunks
        self.stage_indices = layout.rank_chunks(self.coords["pp"])
        self.modules: list[GPT] = []
        for g in self.stage_indices:
            m = build_model(
                spec, seed=seed, dtype=layout.dtype, device=device,
                layer_ids=layout.chunk_layer_ids(spec, g),
                first=g == 0,
                last=g == num_stages - 1, flash=layout.flash_attention,
                recompute=layout.recompute,
                experts=ep_experts(spec.num_experts, layout.ep, self.coords["ep"]),
            )
            if layout.dtype == DType.FP8:
                # torchao's float8 linears, before TP and FSDP wrap them (torchtitan's order).
                from frontier_llm.bench.float8 import apply_float8

                apply_float8(m, str(layout.fp8_recipe), fsdp=shard_mesh is not None)
            if self.cpc is not None:
                apply_cp(m, self.cpc)
            if self.ep_ctx is not None:
                apply_ep(m, self.ep_ctx)
            # The pipeline schedule divides the gradients by the micro-batches itself; otherwise
            # each micro-batch's loss is divided (_fwd_bwd), and so is the aux loss's gradient.
            set_aux_scale(m, 1.0 if layout.pp > 1 else 1.0 / layout.num_microbatches)
            if layout.tp > 1 or shard_mesh is not None:
                # DTensor's modules: loaded by the layouts that shard only (local_tensors.py).
                from frontier_llm.bench.parallelize import apply_fsdp, apply_tp
            if layout.tp > 1:
                apply_tp(m, self.mesh["tp"], layout.sequence_parallel)
            if shard_mesh is not None:
                apply_fsdp(m, shard_mesh, d.reshard_after_forward, expert_mesh=expert_mesh)
            m.train()
            if shard_mesh is not None and d.data_parallel == "fsdp" and not d.reshard_after_forward:
                # ZeRO-2 holds whole parameters from forward to backward: measure them there.
                m.register_forward_hook(lambda *_: self._measure_params())
            self.modules.append(m)
        self.has_first = 0 in self.stage_indices
        self.has_last = num_stages - 1 in self.stage_indices
        self.schedule = None
        # A cp rank holds s/cp tokens; sequence parallelism passes each TP rank's s/cp/tp of
        # them between stages. Every stage uses the same cp split.
        seq_cp = spec.seq_len // d.cp
        seq_local = seq_cp // layout.tp if layout.sequence_parallel else seq_cp
        # Each chunk's (input, output) of one micro-batch, as meta tensors.
        self.stage_shapes = [stage_io(g, num_stages, layout.micro_batch, seq_local, spec,
                                      DTYPES[layout.dtype], layout.tp, seq_tokens=seq_cp)
                             for g in self.stage_indices]
        if layout.pp > 1:
            self.schedule = build_schedule(
                layout.schedule, self.modules, self.stage_indices, num_stages,
                layout.num_microbatches, self.loss_fn, device, self.mesh["pp"].get_group(),
                io=self.stage_shapes,
            )
        # Replicated parameters (DDP / ZeRO-1): gradients averaged over dp x cp.
        self.dp_group = (self._flat(d.reduce_dims).get_group()
                         if d.data_parallel in ("ddp", "zero1") and d.shard_ranks > 1 else None)
        self.tied_group = self._tied_group() if spec.tied_embeddings and layout.pp > 1 else None
        self.expert_ids = {id(p) for m in self.modules for n, p in m.named_parameters()
                           if is_expert_param(n)}
        self.optimizer = self._optimizer()
        self.params_peak = 0
        self.grads_bytes = 0
        # One record per step of what the MoE blocks did (bench/trace_moe.py); empty if dense.
        self.moe_steps: list[dict] = []

    def loss_fn(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Cross entropy; under TP the vocab-parallel one over each rank's slice of the logits
        (needs the ``loss_parallel`` context, which :meth:`_forward_backward` holds open)."""
        if self.layout.tp == 1:
            return loss_fn(logits, targets)
        from torch.distributed.tensor import DTensor, Shard

        dt = DTensor.from_local(logits, self.mesh["tp"], [Shard(-1)], run_check=False)
        loss = F.cross_entropy(dt.flatten(0, 1).float(), targets.flatten(0, 1))
        return loss.to_local() if isinstance(loss, DTensor) else loss

    # -- building blocks -------------------------------------------------------------------
    def _flat(self, dims: tuple[str, ...]):
        """The 1-D mesh over ``dims`` (flattened when several: torchtitan's ``dp_shard_cp``)."""
        if len(dims) == 1:
            return self.mesh[dims[0]]
        return self.mesh[dims]._flatten("_".join(dims))

    def _shard_mesh(self):
        """FSDP2's mesh: dp_shard x cp (flattened), with dp_replicate in front for HSDP; None
        when no rank shares this rank's parameters."""
        d = self.dims
        if d.shard_ranks == 1:
            return None
        shard = self._flat(d.shard_dims)
        if d.data_parallel != "hsdp":
            return shard
        if d.cp == 1:
            return self.mesh["dp_replicate", "dp_shard"]
        import warnings

        # Slicing a flattened dimension out of the root mesh is what torchtitan does for its
        # dp_replicate x dp_shard_cp mesh; torch announces a future bookkeeping change for it.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Slicing a flattened dim")
            return self.mesh["dp_replicate", shard.mesh_dim_names[0]]

    def _expert_mesh(self):
        """FSDP2's mesh for routed experts split over ep: the expert-dp ranks, who hold the
        same experts (None: ep 1, every expert is a dense parameter; or expert-dp 1, nothing to
        shard them over)."""
        if self.ep_ctx is None or self.edp_group is None:
            return None
        d, ep = self.dims, self.ep_ctx.ep
        if d.data_parallel == "hsdp":
            # HSDP (mesh.check_moe: cp 1, ep dividing dp_shard): an ep group lies inside one
            # shard group, so the ranks holding the same experts are a (dp_replicate,
            # dp_shard / ep) grid: experts replicated over dp_replicate like the dense
            # parameters, sharded over the rest (torchtitan's dp_replicate x dp_shard_mod_ep).
            grid = self.mesh._unflatten("dp_shard", (d.dp_shard // ep, ep),
                                        ("edp_shard", "ep_in_dp"))
            return grid["dp_replicate", "edp_shard"]
        if d.data_parallel == "fsdp" and hasattr(self.mesh, "_unflatten"):
            # The dp x cp ranks (dp_shard, flattened with cp when cp > 1: cp fastest) split
            # into (expert-dp, ep), ep fastest: the same groups as expert_groups', cut from the
            # world mesh so that FSDP2 can compose it with a tensor-parallel expert's tp
            # dimension (it refuses meshes of different roots). Every rank makes the new
            # dimensions' groups here, together.
            return self._flat(d.shard_dims)._unflatten(0, (d.shard_ranks // ep, ep),
                                                       ("edp", "ep_in_dp"))["edp"]
        from torch.distributed.device_mesh import DeviceMesh

        # A mesh of its own (torch without _unflatten): enough where experts are plain tensors.
        return DeviceMesh.from_group(self.edp_group, self.device.type,
                                     mesh_dim_names=("edp",))

    def _optimizer(self) -> LocalAdam | AdamGroups:
        """Adam over this rank's parameters; ZeRO-1 shards its state over the ranks holding
        the same parameters: dp x cp for dense ones, expert-dp for experts split over ep
        (Megatron-Core's distributed optimizer shards expert parameters over its
        expert-data-parallel group: megatron/core/optimizer/__init__.py, core_r0.12.0)."""
        zero1 = self.dims.data_parallel == "zero1"
        group = self.dp_group if zero1 else None
        if self.ep_ctx is None or not zero1:
            # One Adam over every parameter where no state is sharded: its foreach step makes
            # one set of temporaries for them all (two optimizers would make two smaller sets,
            # a step peak the cost model's optimizer term does not price).
            return LocalAdam(self.parameters(), lr=LR, shard_group=group)
        dense = [p for p in self.parameters() if id(p) not in self.expert_ids]
        experts = [p for p in self.parameters() if id(p) in self.expert_ids]
        return AdamGroups([LocalAdam(dense, lr=LR, shard_group=group),
                           LocalAdam(experts, lr=LR,
                                     shard_group=self.edp_group if zero1 else None)])

    def parameters(self) -> list[nn.Parameter]:
        seen: dict[int, nn.Parameter] = {}
        for m in self.modules:
            for p in m.parameters():
                seen.setdefault(id(p), p)
        return list(seen.values())

    def _expert_groups(self) -> tuple[EPContext, dist.ProcessGroup | None]:
        """This rank's ep context and expert-dp group (None when no other rank holds its
        experts). Every rank creates every group, in the same order (new_group is
        collective)."""
        ep_ranks, edp_ranks = expert_groups(self.layout)
        ctx = None
        for ranks in ep_ranks:
            group = dist.new_group(ranks)
            if self.rank in ranks:
                ctx = EPContext(group, len(ranks), ranks.index(self.rank))
        mine = None
        for ranks in edp_ranks:
            group = dist.new_group(ranks) if len(ranks) > 1 else None
            if self.rank in ranks:
                mine = group
        assert ctx is not None and ctx.rank == self.coords["ep"], (ctx, self.coords)
        return ctx, mine

    def _tied_group(self) -> dist.ProcessGroup | None:
        """Megatron's embedding group: first and last pipeline rank of each (dp, tp) position.

        Every rank must create every group (new_group is collective), in the same order.
        """
        d = self.dims
        mine = None
        for dr, ds, c, t in itertools.product(range(d.dp_replicate), range(d.dp_shard),
                                              range(d.cp), range(d.tp)):
            ranks = [d.rank_of(0, dr, ds, t, c), d.rank_of(d.pp - 1, dr, ds, t, c)]
            group = dist.new_group(ranks)
            if self.rank in ranks:
                mine = group
        return mine

    def _tied_params(self) -> list[nn.Parameter]:
        out = []
        for m in self.modules:
            if m.tok_embeddings is not None:
                out.append(m.tok_embeddings.weight)
            if m.output is not None and m.tok_embeddings is None:
                out.append(m.output.weight)
        return out

    # -- one training step -----------------------------------------------------------------
    def _forward_backward(self, inputs: torch.Tensor, targets: torch.Tensor) -> float | None:
        if self.layout.tp == 1:
            return self._fwd_bwd(inputs, targets)
        from torch.distributed.tensor.parallel import loss_parallel

        with loss_parallel():
            return self._fwd_bwd(inputs, targets)

    def _fwd_bwd(self, inputs: torch.Tensor, targets: torch.Tensor) -> float | None:
        lay = self.layout
        n = lay.num_microbatches
        if self.schedule is None:
            model = self.modules[0]
            fsdp = hasattr(model, "set_requires_gradient_sync")
            total = torch.zeros((), device=self.device)
            for i, (x, y) in enumerate(zip(inputs.split(lay.micro_batch),
                                           targets.split(lay.micro_batch), strict=True)):
                if fsdp:
                    # Reduce-scatter gradients once, after the last micro-batch (unsharded
                    # gradients held between), unless every micro-batch syncs.
                    model.set_requires_gradient_sync(self.grad_sync_each_microbatch
                                                     or i == n - 1)
                loss = self.loss_fn(model(x), y) / n
                loss.backward()
                total += loss.detach()
            return float(total)
        losses: list[torch.Tensor] = []
        kwargs = {}
        if self.has_last:
            kwargs = {"target": targets, "losses": losses}
        args = (inputs,) if self.has_first else ()
        self.schedule.step(*args, **kwargs)
        if self.has_last:
            return float(torch.stack([t.detach().float() for t in losses]).mean())
        return None

    def _measure_params(self) -> None:
        """Parameter storage held now; called at rest (after the optimizer step) and, for zero2,
        after each forward. Under zero3/HSDP FSDP2's one-unit-at-a-time all-gathers are
        communication buffers, not held state, and are not counted."""
        self.params_peak = max(self.params_peak, local_bytes(self.parameters()))

    def _settle_grads(self) -> list[torch.Tensor]:
        """Gradients in their parameter's placement.

        DTensor's embedding backward leaves the vocab-parallel embedding's gradient replicated
        (every rank computes all V rows); keeping only the local rows (a slice, no
        communication) is what Megatron's vocab-parallel embedding holds.
        """
        grads = []
        for p in self.parameters():
            g = p.grad
            if g is None:
                continue
            if is_dtensor(g) and g.placements != p.placements:
                p.grad = g = g.redistribute(p.device_mesh, p.placements)
            grads.append(g)
        return grads

    def gradients(self, step: int, measure_activations: bool = False) -> float | None:
        """Forward and backward over this rank's slice of global batch ``step`` with every
        gradient reduced where it belongs: what the optimizer step then applies."""
        loss = run_batch(self, step, measure_activations, self._forward_backward)
        self.reduce_gradients()
        return loss

    def reduce_gradients(self) -> None:
        """Every gradient reduced where it belongs, after forward and backward (flm memcheck
        runs its own forward and backward, then this)."""
        grads = self._settle_grads()
        kw = {"bucket_bytes": self.bucket_bytes} if self.bucket_bytes else {}
        # Routed experts split over ep are reduced over expert-dp below; with ep 1 every
        # rank holds every expert and they are dense parameters like the rest.
        split = self.ep_ctx is not None
        if self.dp_group is not None:
            dense = [local(p.grad) for p in self.parameters()
                     if p.grad is not None and not (split and id(p) in self.expert_ids)]
            allreduce_mean(dense, self.dp_group, **kw)
        if split:
            # Under FSDP2 the experts' own units have reduce-scattered them over expert-dp.
            self._reduce_expert_grads(kw, over_edp=self.dp_group is not None)
        if self.tied_group is not None:
            for p in self._tied_params():
                if p.grad is not None:
                    dist.all_reduce(local(p.grad), group=self.tied_group)
        self.grads_bytes = max(self.grads_bytes, local_bytes(grads))
        if self.spec.is_moe:
            self.moe_steps.append(step_record(take_stats(self.modules)))

    def _reduce_expert_grads(self, kw: dict, over_edp: bool) -> None:
        """A routed expert's gradient already sums what every rank of its ep group sent it
        (the all-to-alls' backward); summed over expert-dp too it covers all dp x cp ranks'
        losses, whose mean the global loss is: divide by ep here, by expert-dp in the mean
        (``over_edp``: this averages; otherwise FSDP2's reduce-scatter over expert-dp did)."""
        grads = [local(p.grad) for p in self.parameters()
                 if p.grad is not None and id(p) in self.expert_ids]
        torch._foreach_div_(grads, float(self.ep_ctx.ep))
        if over_edp and self.edp_group is not None:
            allreduce_mean(grads, self.edp_group, **kw)

    def step(self, step: int, measure_activations: bool = False) -> float | None:
        """One optimizer step over this rank's slice of global batch ``step``."""
        loss = self.gradients(step, measure_activations)
        self.optimizer.step()
        self.optimizer.zero_grad()
        if self.layout.dtype == DType.FP8:
            from frontier_llm.bench.float8 import precompute_scales

            precompute_scales(self.modules, str(self.layout.fp8_recipe),
                              self.dims.data_parallel in ("fsdp", "hsdp"))
        self._measure_params()
        return loss

    # -- what this rank holds --------------------------------------------------------------
    def state_bytes(self) -> RankState:
        return RankState(params_bytes=self.params_peak, grads_bytes=self.grads_bytes,
                         optimizer_bytes=self.optimizer.state_bytes())

    @property
    def activations_peak_bytes(self) -> int:
        return self.meter.peak


def run_batch(engine, step: int, measure_activations: bool,
              forward_backward: Callable[[torch.Tensor, torch.Tensor], float | None]
              ) -> float | None:
    """Forward and backward over ``engine``'s slice of global batch ``step`` (its data-parallel
    rank's sequences, on its device), under its saved-activation meter when
    ``measure_activations``: the part of a training step every engine shares."""
    lay = engine.layout
    inputs, targets = engine.data.rank_batch(step, lay.global_batch, lay.dp, engine.coords["dp"])
    if lay.cp > 1:
        # This cp rank's share of every sequence (chunks r and 2cp-1-r): each rank's loss is
        # the mean over its own tokens, equal in number on every cp rank, so the mean over the
        # dp x cp ranks that the gradient reduction takes is the global batch's mean.
        inputs = cp_shard(inputs, lay.cp, engine.coords["cp"])
        targets = cp_shard(targets, lay.cp, engine.coords["cp"])
    inputs, targets = inputs.to(engine.device), targets.to(engine.device)
    if not measure_activations:
        return forward_backward(inputs, targets)
    engine.meter.reset_peak()
    with engine.meter.measuring():
        return forward_backward(inputs, targets)


def reference_losses(spec: ModelSpec, layout: Layout, steps: int, seed: int = 0,
                     data: str | None = None) -> list[float]:
    """Losses of the single-process run (no parallelism) on the same global batches."""
    torch.manual_seed(seed)
    model = build_model(spec, seed=seed, dtype=layout.dtype, flash=layout.flash_attention)
    model.train()
    opt = LocalAdam(list(model.parameters()), lr=LR)
    source = TokenSource(spec.vocab, spec.seq_len, seed, data)
    chunks = layout.global_batch // layout.micro_batch
    set_aux_scale(model, 1.0 / chunks)
    out = []
    for step in range(steps):
        inputs, targets = source.rank_batch(step, layout.global_batch, 1, 0)
        total = 0.0
        for x, y in zip(inputs.split(layout.micro_batch), targets.split(layout.micro_batch),
                        strict=True):
            loss = loss_fn(model(x), y) / chunks
            loss.backward()
            total += float(loss.detach())
        opt.step()
        opt.zero_grad()
        out.append(total)
    return out
