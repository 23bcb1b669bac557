"""``recompute: selective-op``: PyTorch's op-level selective activation checkpointing of a block.

torchtitan's policy (``torchtitan/distributed/activation_checkpoint.py``, ``_custom_policy``; its
``llama3_8b.toml``: ``mode = 'selective'``, ``selective_ac_option = 'op'``): inside each
checkpointed block, keep the outputs of the 1st, 3rd, 5th ... matrix multiply and of the fused
attention kernel (SDPA); recompute every other op in backward from the block's input. The cost
model's reading of it is ``costmodel/checkpoint_policy.py`` (``kept_matmuls``); this module is
what flm bench runs.

What counts as a matrix multiply: the ops a weight ``nn.Linear`` reaches under the dispatch mode
that ``torch.utils.checkpoint`` installs: ``aten.mm`` without a bias, ``aten.addmm`` with one (on
CPU and GPU alike; ``aten.linear`` is decomposed before it). torchtitan counts ``aten.mm`` only
because its Llama has no biases; counting both keeps "every second weight matmul" for GPT's
biased linears too. The unfused attention core's batched matmuls (``aten.bmm``) are not counted
and not kept, as the cost model has it. Matmuls are counted per checkpoint context, forward and
recompute apart, as torchtitan does (torch >= 2.9 consults the policy in forward only and replays
by op index, so the recompute counter stays unused there).

One deliberate difference from torchtitan: an attention kernel that applies dropout is recomputed,
not kept. Checkpointing replays the random-number generator from the block's start; a kept kernel
is not run again, so it would not advance the generator, and every later dropout mask of the block
(the residual dropouts) would come out different in the recompute than in forward. torchtitan's
models have no dropout. On CPU, SDPA with dropout is decomposed into ``bmm`` / ``softmax`` /
``bernoulli_`` anyway, so this only matters on GPUs.

torchtitan also keeps the outputs of sequence-parallel reduce-scatters; flm's policy does not
(the cost model does not count them), so under SP they are issued again in the recompute. As in
torchtitan's default configuration (``early_stop = false``) the recompute runs the whole block;
unlike it (``preserve_rng_state = false``, no dropout there) the generator state is restored for
the recompute, which is what keeps dropout exact.

The saved-activation meter (bench/activations.py) does not see the cached outputs nor the
rebuilt block's saved tensors through its hooks; :func:`_metered` and :func:`_metered_fn` hand
both to it.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Callable

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from frontier_llm.bench.activations import active_meter

aten = torch.ops.aten

# Weight matrix multiplies (with and without a bias).
MATMULS = frozenset({aten.mm.default, aten.addmm.default})

# The fused attention kernels behind F.scaled_dot_product_attention, on every backend that has
# them in this torch build.
ATTENTION_KERNELS = frozenset(
    getattr(aten, name).default
    for name in ("_scaled_dot_product_flash_attention",
                 "_scaled_dot_product_flash_attention_for_cpu",
                 "_scaled_dot_product_efficient_attention",
                 "_scaled_dot_product_cudnn_attention",
                 "_scaled_dot_product_fused_attention_overrideable")
    if hasattr(aten, name)
)


def _dropout_p(func, args: tuple, kwargs: dict) -> float:
    """The ``dropout_p`` argument of an attention kernel call (0 when it has none)."""
    for i, arg in enumerate(func._schema.arguments):
        if arg.name == "dropout_p":
            value = kwargs.get("dropout_p", args[i] if i < len(args) else arg.default_value)
            return float(value or 0.0)
    return 0.0


def op_policy(counts: dict[str, int]) -> Callable:
    """The policy of one checkpointed block call; ``counts`` holds its matmul counters."""

    def policy(ctx, func, *args, **kwargs) -> CheckpointPolicy:
        if func in MATMULS:
            key = "recompute" if ctx.is_recompute else "forward"
            counts[key] += 1
            # The 1st, 3rd, 5th ... are kept (torchtitan recomputes every second one).
            return (CheckpointPolicy.MUST_SAVE if counts[key] % 2 == 1
                    else CheckpointPolicy.PREFER_RECOMPUTE)
        if func in ATTENTION_KERNELS and _dropout_p(func, args, kwargs) == 0.0:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def _kept_tensors(storage: dict) -> list[tuple[object, torch.Tensor]]:
    """(cache entry, tensor) of every output the forward context cached: each entry is one of
    torch's ``_VersionWrapper`` objects, which the checkpoint drops when the recompute consumes
    it (or when the graph is freed unused)."""
    out = []
    for slots in storage.values():
        # torch 2.13 keys each op's outputs by call index (a dict); torch 2.11 and older keep
        # them in a list (the GPU machines' torch: docs/gpu.md).
        for entry in slots.values() if isinstance(slots, dict) else slots:
            for wrapper in torch.utils._pytree.tree_leaves(entry):
                value = getattr(wrapper, "val", None)
                if isinstance(value, torch.Tensor):
                    out.append((wrapper, value))
    return out


@contextlib.contextmanager
def _metered(forward_context):
    """Run ``forward_context`` (the caching mode) and then hand what it cached to the active
    saved-activation meter, which holds each output until its cache entry is dropped."""
    with forward_context:
        yield
    meter = active_meter()
    if meter is not None:
        for wrapper, tensor in _kept_tensors(forward_context.storage):
            meter.hold_while(tensor, wrapper)


_RECOMPUTING: list[bool] = []  # one entry per recompute in progress


@contextlib.contextmanager
def _recomputing(recompute_context):
    """The recompute context (torch's cache replay), marked so that the block function knows."""
    _RECOMPUTING.append(True)
    try:
        with recompute_context:
            yield
    finally:
        _RECOMPUTING.pop()


def selective_op_contexts():
    """``context_fn`` for ``torch.utils.checkpoint.checkpoint``: fresh counters per call."""
    forward, recompute = create_selective_checkpoint_contexts(op_policy(defaultdict(int)))
    return _metered(forward), _recomputing(recompute)


def _metered_fn(fn: Callable) -> Callable:
    """``fn`` that, when run as the recompute in backward under a measuring meter, counts the
    rebuilt block's saved tensors (torch keeps them in the checkpoint frame, out of the outer
    hooks' sight) until backward has used them: the rebuilt layer that the cost model adds to
    the peak as its transient."""

    def run(*args):
        meter = active_meter()
        if meter is None or not _RECOMPUTING:
            return fn(*args)
        with meter.counting_under():
            return fn(*args)

    return run


def checkpoint_selective_op(fn: Callable, *args):
    """``fn(*args)`` under ``selective-op`` (non-reentrant checkpoint with the op policy)."""
    # torchtitan's default (``early_stop = false`` in its activation-checkpoint config): the
    # recompute runs the whole block, so every cached output is consumed by it.
    return torch.utils.checkpoint.checkpoint(
        _metered_fn(fn), *args, use_reentrant=False, context_fn=selective_op_contexts,
        early_stop=False)

