"""Megatron's tensor-parallel layers on plain tensors, for engines that cannot hold DTensors.

The native engine shards with ``torch.distributed.tensor.parallel`` (DTensor parameters). DeepSpeed
flattens plain parameter tensors into its own buffers (ZeRO, the pipeline engine's gradient
reduction), so under DeepSpeed's ``PipelineModule`` tensor parallelism is what Megatron-DeepSpeed
does: column- and row-parallel linear layers, a vocabulary-parallel embedding and a
vocabulary-parallel cross entropy (Shoeybi et al. 2019, ``megatron/core/tensor_parallel``), each
holding its own slice of the weight as an ordinary ``nn.Parameter``.

Which module gets which split is not repeated here: :func:`shard_model` reads the native engine's
plan (``parallelize.tp_plan``: Q, K, V, fc1 and the SwiGLU gate column-parallel; out-projection and
fc2 row-parallel; token embedding and output head over the vocabulary; norms and learned positions
whole), so both engines split the same weights the same way and the cost model's tensor-parallel
accounting (``costmodel/params.py``) holds for both. Each slice is cut from the whole,
deterministically initialised weight, so every layout starts from the reference's values.

The vocabulary is split in ``ceil(V/tp)`` rows per rank (the cost model's count); rows past ``V``
on the last rank are padding: never looked up, and left out of the logits, so the loss is the
reference's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from frontier_llm.bench.model import GPT


@dataclass
class TPGroup:
    """This rank's place in its tensor-parallel group. ``group`` may be bound after the layers
    are built (DeepSpeed's ``PipelineModule`` builds its stages before it hands out its grid's
    groups); the layers only need it when they run."""

    rank: int
    size: int
    group: dist.ProcessGroup | None = None


def _group(tp: TPGroup) -> dist.ProcessGroup:
    # Unbound, a collective would silently run over the whole world.
    if tp.group is None:
        raise RuntimeError("the tensor-parallel group was not bound before the layers ran")
    return tp.group


class _CopyToTP(torch.autograd.Function):
    """Identity forward; all-reduce of the input gradient over the TP group in backward (the
    input of a column-parallel layer feeds every rank's slice)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
        ctx.tp = tp
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=_group(ctx.tp))
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    """All-reduce forward (the partial sums of a row-parallel layer or of the vocabulary-parallel
    embedding); identity backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
        x = x.contiguous()
        dist.all_reduce(x, group=_group(tp))
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


def _mark(p: nn.Parameter, dim: int) -> nn.Parameter:
    # What DeepSpeed's is_model_parallel_parameter and Megatron's checkpoints look for: the
    # gradient norm counts a sharded parameter on every TP rank, a replicated one once.
    p.tensor_model_parallel, p.partition_dim, p.partition_stride = True, dim, 1
    return p


def _rows(n: int, tp: TPGroup) -> tuple[int, int]:
    """[start, stop) of this rank's ceil(n/tp) slice (the last one may run past n)."""
    per = -(-n // tp.size)
    return tp.rank * per, (tp.rank + 1) * per


def _slice_rows(w: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    """This rank's rows of ``w``, zero-padded to ceil(n/tp) rows."""
    start, stop = _rows(w.shape[0], tp)
    out = w.new_zeros((stop - start, *w.shape[1:]))
    real = w[start:stop]
    out[:real.shape[0]] = real
    return out


class ColumnParallelLinear(nn.Module):
    """``y = x Aᵀ + b`` with A's output rows (and b) split over the TP group; the output stays
    split (the next layer is row-parallel, or the loss is vocabulary-parallel). ``valid``: the
    output features that are real (the vocabulary head's padding is dropped)."""

    def __init__(self, linear: nn.Linear, tp: TPGroup) -> None:
        super().__init__()
        self.tp = tp
        n = linear.out_features
        start, _ = _rows(n, tp)
        self.valid = max(0, min(n - start, -(-n // tp.size)))
        self.weight = _mark(nn.Parameter(_slice_rows(linear.weight.detach(), tp)), 0)
        self.bias = (None if linear.bias is None
                     else _mark(nn.Parameter(_slice_rows(linear.bias.detach(), tp)), 0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(_CopyToTP.apply(x, self.tp), self.weight, self.bias)
        return y if self.valid == y.shape[-1] else y[..., :self.valid]


class RowParallelLinear(nn.Module):
    """``y = x Aᵀ + b`` with A's input columns split over the TP group (the input arrives split
    by a column-parallel layer); partial sums all-reduced, then the whole bias added once."""

    def __init__(self, linear: nn.Linear, tp: TPGroup) -> None:
        super().__init__()
        self.tp = tp
        w = linear.weight.detach()
        start, stop = _rows(w.shape[1], tp)
        if w.shape[1] % tp.size:
            raise ValueError(f"{w.shape[1]} input features do not split over tp {tp.size}")
        self.weight = _mark(nn.Parameter(w[:, start:stop].clone()), 1)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _ReduceFromTP.apply(F.linear(x, self.weight), self.tp)
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """Token embedding with ceil(V/tp) vocabulary rows per rank: each rank looks up the tokens
    in its range (zeros elsewhere) and an all-reduce assembles the whole embedding."""

    def __init__(self, embedding: nn.Embedding, tp: TPGroup) -> None:
        super().__init__()
        self.tp = tp
        self.start, self.stop = _rows(embedding.num_embeddings, tp)
        self.weight = _mark(nn.Parameter(_slice_rows(embedding.weight.detach(), tp)), 0)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        outside = (tokens < self.start) | (tokens >= self.stop)
        local = (tokens - self.start).masked_fill(outside, 0)
        out = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return _ReduceFromTP.apply(out, self.tp)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-token cross entropy over logits split along the vocabulary (Megatron's
    ``vocab_parallel_cross_entropy``): the max, the target's logit and the softmax denominator
    are all-reduced over the TP group; nobody holds the whole logits."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, start: int,
                tp: TPGroup) -> torch.Tensor:
        logits = logits.float()
        vmax = logits.max(dim=-1).values
        dist.all_reduce(vmax, op=dist.ReduceOp.MAX, group=_group(tp))
        shifted = logits - vmax.unsqueeze(-1)
        outside = (targets < start) | (targets >= start + logits.shape[-1])
        local = (targets - start).masked_fill(outside, 0)
        picked = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        dist.all_reduce(picked, group=_group(tp))
        exp = shifted.exp()
        total = exp.sum(dim=-1)
        dist.all_reduce(total, group=_group(tp))
        ctx.save_for_backward(exp.div_(total.unsqueeze(-1)), local, outside)
        return total.log() - picked

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        softmax, local, outside = ctx.saved_tensors
        g = softmax.clone()
        g.scatter_add_(-1, local.unsqueeze(-1), -(~outside).to(g.dtype).unsqueeze(-1))
        return g.mul_(grad.unsqueeze(-1)), None, None, None


def vocab_parallel_loss(logits: torch.Tensor, targets: torch.Tensor, tp: TPGroup,
                        vocab: int) -> torch.Tensor:
    """Mean next-token cross entropy of logits split over a vocabulary of ``vocab`` entries
    (``model.loss_fn``'s value, computed in fp32)."""
    start, _ = _rows(vocab, tp)
    return _VocabParallelCrossEntropy.apply(logits, targets, start, tp).mean()


def shard_model(model: GPT, tp: TPGroup) -> GPT:
    """Replace the layers the native tensor-parallel plan splits by this rank's slices (in
    place; the model's names and the rest of its parameters stay as they are)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    from frontier_llm.bench.parallelize import tp_plan

    for name, style in tp_plan(model, sequence_parallel=False).items():
        parent_name, _, leaf = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        old = getattr(parent, leaf)
        if isinstance(style, ColwiseParallel):
            new: nn.Module = ColumnParallelLinear(old, tp)
        elif isinstance(style, RowwiseParallel) and isinstance(old, nn.Embedding):
            new = VocabParallelEmbedding(old, tp)
        elif isinstance(style, RowwiseParallel):
            new = RowParallelLinear(old, tp)
        else:  # sequence parallelism's styles: the engines that use this module refuse it
            raise ValueError(f"no plain-tensor layer for {type(style).__name__} ({name})")
        setattr(parent, leaf, new)
    return model
