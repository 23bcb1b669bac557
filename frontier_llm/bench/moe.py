"""The Mixture-of-Experts MLP of flm bench's native engine, and expert parallelism over ranks.

One MoE block's MLP (``ModelSpec.moe_block``): a router (a hidden -> num_experts projection
without bias, softmax over every expert, the ``top_k`` largest kept and their weights
renormalised to sum to one, as Mixtral does: Jiang et al. 2024 §2.1), ``num_experts`` routed
experts (each an MLP of width ``expert_ffn_hidden``, SwiGLU or GeLU like the dense one) and
``shared_experts`` that every token passes through (Dai et al. 2024, DeepSeekMoE).

Routing is dropless unless the model gives a ``capacity_factor``; then each expert computes at
most ``ceil(capacity_factor x tokens x top_k / num_experts)`` of a micro-batch's assignments
(Megatron-Core's ``get_capacity``, megatron/core/transformer/moe/moe_utils.py, core_r0.12.0)
and the rest are dropped (their expert output is zero; the residual carries the token), first
choices before second ones and earlier tokens first within a choice (GShard's policy, Lepikhin
et al. 2020 §2.2, the top-1 case of which is Switch's).

The load-balancing loss is Switch Transformers' eq. 4 (Fedus et al. 2022):
``router_aux_loss x num_experts x sum_i f_i P_i`` over one micro-batch's tokens, ``f_i`` the
fraction of the top-k assignments routed to expert i and ``P_i`` the mean router probability of
expert i (Megatron-Core's ``switch_load_balancing_loss_func``, same file: counts over tokens x
top_k). Its gradient joins the language-model loss's through :class:`_AuxLossGrad`, the way
Megatron-Core's ``MoEAuxLossAutoScaler`` (megatron/core/transformer/moe/moe_utils.py; router.py
in its first MoE releases) does: the loss value the trace records stays the cross entropy, and
the aux loss is recorded beside it.

Expert parallelism (:func:`apply_ep`): each of the ep ranks of a group keeps ``num_experts / ep``
consecutive experts; a micro-batch's assignments, sorted by expert, go to the experts' ranks by
an all-to-all (``all_to_all_single`` with uneven splits, which gloo runs on CPU in torch 2.13),
are computed there and come back by the reverse all-to-all. Both exchanges are autograd
functions whose backward is the opposite exchange of the gradients (Megatron-Core's
``all_to_all`` in megatron/core/tensor_parallel/mappings.py does the same). Without ep the
same code runs with no exchange, which is what makes a layout equal its single-process
reference.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from frontier_llm.specs.model import ModelSpec


@dataclass
class MoEStats:
    """What one MoE block did since the last :func:`take_stats`: seconds in the dispatch and
    combine all-to-alls (forward and the backward of each), the assignments each expert computed
    (this rank's tokens, all experts), the assignments capacity dropped, and the coefficient-
    weighted aux loss summed over micro-batches (times the block's gradient scale)."""

    dispatch_s: float = 0.0
    combine_s: float = 0.0
    tokens: list[int] = field(default_factory=list)
    dropped: int = 0
    aux_loss: float = 0.0
    # On GPUs the exchanges run asynchronously on the device: (kind, start, end) CUDA events,
    # read once the step has synchronised (:meth:`settle`).
    events: list = field(default_factory=list)

    def settle(self) -> MoEStats:
        """Add the device-timed exchanges' seconds (waiting for each to have ended)."""
        for kind, start, end in self.events:
            end.synchronize()
            _add_time(self, kind, start.elapsed_time(end) / 1e3)
        self.events = []
        return self


@dataclass(frozen=True)
class EPContext:
    """This rank's expert-parallel group: ``ep`` ranks, this one's index ``rank`` in it."""

    group: dist.ProcessGroup
    ep: int
    rank: int


class _Exchange(torch.autograd.Function):
    """all-to-all of rows: ``send[i]`` rows to group rank i, ``recv[i]`` rows from it; its
    backward sends the gradients back the opposite way. Time spent is added to ``stats``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, send: list[int], recv: list[int], group,
                stats: MoEStats, kind: str) -> torch.Tensor:
        ctx.send, ctx.recv, ctx.group, ctx.stats, ctx.kind = send, recv, group, stats, kind
        return _all_to_all(x, send, recv, group, stats, kind)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        g = _all_to_all(grad, ctx.recv, ctx.send, ctx.group, ctx.stats, ctx.kind)
        return g, None, None, None, None, None


def _all_to_all(x: torch.Tensor, send: list[int] | None, recv: list[int] | None, group,
                stats: MoEStats, kind: str) -> torch.Tensor:
    """``x``'s rows exchanged (``None`` splits: equal ones), timed into ``stats``."""
    out = x.new_empty((sum(recv), *x.shape[1:]) if recv is not None else x.shape)
    with _timed(stats, kind, x):
        dist.all_to_all_single(out, x.contiguous(), recv, send, group=group)
    return out


@contextlib.contextmanager
def _timed(stats: MoEStats, kind: str, x: torch.Tensor):
    """Time a collective on ``x``: wall clock on CPU (gloo returns when it is done); on a GPU,
    events on the current stream, which the blocking collective makes wait for its end."""
    if x.is_cuda:
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record()
        yield
        end.record()
        stats.events.append((kind, start, end))
        return
    t0 = time.perf_counter()
    yield
    _add_time(stats, kind, time.perf_counter() - t0)


def _add_time(stats: MoEStats, kind: str, seconds: float) -> None:
    if kind == "dispatch":
        stats.dispatch_s += seconds
    else:
        stats.combine_s += seconds


class _AuxLossGrad(torch.autograd.Function):
    """Identity on the block's output whose backward also starts the aux loss's gradient
    (``scale``: 1 / micro-batches where the language-model loss is divided by them)."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, aux: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(aux)
        ctx.scale = scale
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (aux,) = ctx.saved_tensors
        return grad, torch.full_like(aux, ctx.scale), None


def capacity(spec: ModelSpec, tokens: int) -> int | None:
    """Assignments one expert computes per micro-batch of ``tokens`` (None: dropless)."""
    if spec.capacity_factor is None:
        return None
    return math.ceil(spec.capacity_factor * tokens * spec.top_k / spec.num_experts)


def switch_aux_loss(probs: torch.Tensor, counts: torch.Tensor, top_k: int,
                    tokens: int | None = None) -> torch.Tensor:
    """Switch Transformers eq. 4 without its coefficient: ``E x sum_i f_i P_i`` (``probs``
    (T, E) router probabilities, ``counts`` (E,) top-k assignments per expert over ``tokens``
    tokens, default T: under context parallelism the whole sequences', P_i this rank's)."""
    local, experts = probs.shape
    f = counts.to(probs.dtype) / ((local if tokens is None else tokens) * top_k)
    return experts * (f * probs.mean(0)).sum()


def route(probs: torch.Tensor, top_k: int, cap: int | None
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(expert, token, weight, counts) of the kept assignments, sorted by expert (first choices
    before second ones within an expert), and the router's assignments per expert before any
    drop. Weights are the top-k probabilities renormalised over the token's k (Mixtral)."""
    top_p, top_e = probs.topk(top_k, dim=-1)
    weights = top_p / top_p.sum(-1, keepdim=True)
    experts_n = probs.shape[1]
    # Slot-major: every token's first choice, then every token's second (GShard's priority).
    expert = top_e.t().reshape(-1)
    token = torch.arange(probs.shape[0], device=probs.device).repeat(top_k)
    weight = weights.t().reshape(-1)
    counts = torch.bincount(expert, minlength=experts_n)
    if cap is not None:
        onehot = F.one_hot(expert, experts_n)
        place = (onehot.cumsum(0) * onehot).sum(-1) - 1  # the assignment's place at its expert
        keep = place < cap
        expert, token, weight = expert[keep], token[keep], weight[keep]
    order = torch.argsort(expert, stable=True)
    return expert[order], token[order], weight[order], counts


def ep_experts(num_experts: int, ep: int, ep_rank: int) -> range:
    """The routed experts ep rank ``ep_rank`` of ``ep`` holds: num_experts / ep consecutive
    ones (Megatron-Core's ``local_expert_indices``)."""
    local = num_experts // ep
    return range(ep_rank * local, (ep_rank + 1) * local)


class MoE(nn.Module):
    """An MoE block's MLP holding the routed experts ``experts`` (default all: one process or
    ep 1), routing over an ep group once :func:`apply_ep` gives it one."""

    def __init__(self, spec: ModelSpec, expert_mlp, experts: range | None = None) -> None:
        super().__init__()
        self.spec = spec
        self.dropout = spec.dropout
        self.router = nn.Linear(spec.hidden, spec.num_experts, bias=False)
        width = spec.expert_ffn_hidden
        # Keyed by global expert index: names, and so the initial weights, are the same in
        # every layout.
        held = range(spec.num_experts) if experts is None else experts
        self.experts = nn.ModuleDict({str(e): expert_mlp(spec, width) for e in held})
        self.shared = nn.ModuleDict({str(j): expert_mlp(spec, width)
                                     for j in range(spec.shared_experts)})
        self.ep: EPContext | None = None
        # Context parallelism (model.apply_cp): the cp group whose ranks hold the other parts
        # of this rank's sequences.
        self.cp_group: dist.ProcessGroup | None = None
        self.aux_scale = 1.0
        self.stats = MoEStats(tokens=[0] * spec.num_experts)
        # Set by an activation-checkpointed block around each run of it (:func:`block_runs`):
        # "forward" for the first, "recompute" for its replay in backward; None outside one.
        self.phase: str | None = None

    @property
    def local_experts(self) -> list[int]:
        """Global indices of the experts this rank holds, in order."""
        return sorted(int(e) for e in self.experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spec, shape = self.spec, x.shape
        tokens = x.reshape(-1, shape[-1])
        probs = self.router(tokens).float().softmax(dim=-1)
        expert, token, weight, counts = route(probs, spec.top_k,
                                              capacity(spec, tokens.shape[0]))
        kept = torch.bincount(expert, minlength=spec.num_experts)
        y = self._experts(tokens[token], kept)
        out = torch.zeros_like(tokens).index_add(0, token, y * weight.to(y.dtype)[:, None])
        for mlp in self.shared.values():
            out = out + mlp(tokens)
        # A recompute replays the forward's routing (the same inputs, the generator restored):
        # its assignments and aux loss were counted once already. Its exchanges do run again
        # (Megatron-Core's recomputed token dispatcher does too) and their seconds count.
        first = self.phase != "recompute"
        if first:
            self._record(kept, counts)
        # Reentrant full recompute runs the forward without autograd ("forward" phase) and
        # starts the aux loss's gradient from the recompute, where the graph is built; the
        # non-reentrant (selective-op) one keeps the forward's graph, the recompute's copy
        # never being differentiated. Either way the gradient starts once.
        if spec.router_aux_loss and self.training and (torch.is_grad_enabled()
                                                       or self.phase == "forward"):
            aux = spec.router_aux_loss * self._aux_loss(probs, counts)
            if first:
                self.stats.aux_loss += float(aux.detach()) * self.aux_scale
            if torch.is_grad_enabled():
                out = _AuxLossGrad.apply(out, aux, self.aux_scale)
        return F.dropout(out.view(shape), p=self.dropout, training=self.training)

    def _aux_loss(self, probs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Switch's loss of this micro-batch. Under context parallelism f_i counts the whole
        sequences' assignments (summed over the cp group) and P_i is this rank's mean, as
        Megatron-Core does (megatron/core/transformer/moe/moe_utils.py at 00611e6e:
        ``get_tokens_per_expert_and_token_count`` sums the counts over its tp x cp group,
        ``switch_load_balancing_loss_func`` keeps the probabilities local): the cp ranks' mean
        of this loss, which their gradient average takes, is the whole micro-batch's, each rank
        holding the same number of tokens."""
        if self.cp_group is None:
            return switch_aux_loss(probs, counts, self.spec.top_k)
        total = counts.clone()
        dist.all_reduce(total, group=self.cp_group)
        cp = dist.get_world_size(self.cp_group)
        return switch_aux_loss(probs, total, self.spec.top_k, tokens=probs.shape[0] * cp)

    def _record(self, kept: torch.Tensor, counts: torch.Tensor) -> None:
        kept_list = kept.tolist()
        self.stats.tokens = [a + b for a, b in zip(self.stats.tokens, kept_list, strict=True)]
        self.stats.dropped += int(counts.sum() - kept.sum())

    def _experts(self, rows: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
        """Each row through its expert (``rows`` sorted by expert, ``kept`` rows per expert),
        over the ep group when there is one; rows come back in the order they went."""
        if self.ep is None:
            return self._run_local(rows, kept.view(1, -1))
        ep, group, stats = self.ep.ep, self.ep.group, self.stats
        local = self.spec.num_experts // ep
        # Each rank first learns how many rows it receives from every rank for each of its
        # experts (one small all-to-all of counts), then the rows move.
        incoming = _all_to_all(kept, None, None, group, stats, "dispatch").view(ep, local)
        send = kept.view(ep, local).sum(1).tolist()
        recv = incoming.sum(1).tolist()
        moved = _Exchange.apply(rows, send, recv, group, stats, "dispatch")
        y = self._run_local(moved, incoming)
        return _Exchange.apply(y, recv, send, group, stats, "combine")

    def _run_local(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """``rows`` grouped by (source rank, local expert) with ``counts`` (sources, local
        experts) rows each: every expert computes its rows from all sources at once."""
        sizes = counts.flatten().tolist()
        chunks = list(rows.split(sizes))
        local = counts.shape[1]
        for j, e in enumerate(self.local_experts):
            mine = list(range(j, len(chunks), local))
            y = self.experts[str(e)](torch.cat([chunks[i] for i in mine]))
            for i, part in zip(mine, y.split([sizes[i] for i in mine]), strict=True):
                chunks[i] = part
        return torch.cat(chunks) if chunks else rows


def block_runs(fn, module: nn.Module):
    """``fn`` for an activation checkpoint of a block whose MLP is ``module``: each call marks
    an MoE ``module`` with its phase, the first call the forward, any later one the recompute
    in backward (a plain MLP is left alone)."""
    if not isinstance(module, MoE):
        return fn
    calls = [0]

    def run(*args):
        module.phase = "forward" if calls[0] == 0 else "recompute"
        calls[0] += 1
        try:
            return fn(*args)
        finally:
            module.phase = None

    return run


def moe_modules(model: nn.Module) -> list[tuple[str, MoE]]:
    """(name, module) of every MoE MLP in ``model``, in order."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, MoE)]


def apply_ep(model: nn.Module, ctx: EPContext) -> None:
    """Route every MoE block of ``model`` (built with this ep rank's experts, ``ep_experts``)
    over ``ctx``'s group."""
    for _, moe in moe_modules(model):
        want = list(ep_experts(moe.spec.num_experts, ctx.ep, ctx.rank))
        if moe.local_experts != want:
            raise ValueError(f"an MoE block holds experts {moe.local_experts}, not ep rank "
                             f"{ctx.rank}'s {want}: build the model with experts={want}")
        moe.ep = ctx


def is_expert_param(name: str) -> bool:
    """Whether the parameter named ``name`` is a routed expert's (split over ep; its gradient
    reduced over expert-dp), not a dense one (the router and shared experts included)."""
    return ".experts." in name


def set_aux_scale(model: nn.Module, scale: float) -> None:
    """The factor the aux loss's gradient starts from (1 / micro-batches when the language-model
    loss is divided by them; 1 when the pipeline schedule scales the gradients itself)."""
    for _, moe in moe_modules(model):
        moe.aux_scale = scale


def take_stats(models: list[nn.Module]) -> dict[str, MoEStats]:
    """Every MoE block's stats since the last call, keyed by block index; resets them."""
    out = {}
    for model in models:
        for name, moe in moe_modules(model):
            block = name.split(".")[1] if name.startswith("layers.") else name
            out[block] = moe.stats.settle()
            moe.stats = MoEStats(tokens=[0] * moe.spec.num_experts)
    return out
