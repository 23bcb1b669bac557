"""``recompute: selective-op`` in flm bench's model: what the policy keeps and what the meter sees.

Real torch on CPU, one process: the block runs under ``torch.utils.checkpoint`` with the op
policy of ``bench/checkpoint_policy.py``; the kept outputs are read from the checkpoint's own
cache, and the saved-activation meter of ``bench/activations.py`` is compared with the cost
model (``costmodel/checkpoint_policy.py``, ``costmodel/memory.py``). Multi-rank runs (TP with
sequence parallelism, FSDP) are in tests/test_bench_layouts.py.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import pytest
import torch
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from frontier_llm.bench.activations import SavedTensorMeter
from frontier_llm.bench.checkpoint_policy import _kept_tensors, op_policy
from frontier_llm.bench.model import build_model, loss_fn
from frontier_llm.catalog import load_model
from frontier_llm.costmodel.checkpoint_policy import kept_bytes_per_token, kept_matmuls
from frontier_llm.costmodel.memory import rank_activation_bytes
from frontier_llm.specs.parallel import ParallelConfig

MODELS = ["tiny-gpt", "tiny-llama"]  # GeLU with biases (addmm) | SwiGLU without (mm)


def _block_input(spec) -> torch.Tensor:
    return torch.randn(2, spec.seq_len, spec.hidden, requires_grad=True)


@pytest.mark.parametrize("flash", [True, False])
@pytest.mark.parametrize("model", MODELS)
def test_policy_keeps_the_cost_models_matmuls_and_the_attention_kernel(model, flash):
    """The outputs cached by one block's checkpoint are exactly those of the weight matmuls the
    cost model names (``kept_matmuls``) plus, with flash attention, the SDPA kernel's output and
    log-sum-exp; never the unfused core's batched matmuls."""
    spec = load_model(model)
    block = build_model(spec, seed=0, flash=flash).layers["0"]
    produced = {}  # storage of each linear's output -> the linear's name

    def remember(name):
        def hook(_module, _inputs, out):
            produced[out.untyped_storage().data_ptr()] = name
        return hook

    for name, module in block.named_modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_hook(remember(name.rsplit(".", 1)[-1]))
    forward, recompute = create_selective_checkpoint_contexts(op_policy(defaultdict(int)))
    x = _block_input(spec)
    y = checkpoint(block._forward, x, use_reentrant=False,
                   context_fn=lambda: (forward, recompute))
    kept = [t for _, t in _kept_tensors(forward.storage)]
    names = [produced.get(t.untyped_storage().data_ptr()) for t in kept]
    assert [n for n in names if n] == [n for n, _, _ in kept_matmuls(spec)]
    others = [t for t, n in zip(kept, names, strict=True) if n is None]
    if flash:  # output (b, heads, s, d) and fp32 log-sum-exp (b, heads, s)
        assert sorted(t.dim() for t in others) == [3, 4]
    else:
        assert others == []
    tokens = x.shape[0] * x.shape[1]
    assert sum(t.untyped_storage().nbytes() for t in kept) == (
        tokens * kept_bytes_per_token(spec, 1, 4, flash))
    y.sum().backward()  # and the cached outputs serve the recompute
    assert block.attention.wq.weight.grad is not None


@pytest.mark.parametrize("flash", [True, False])
@pytest.mark.parametrize("model", MODELS)
def test_meter_counts_what_selective_op_keeps(model, flash):
    """The meter's bytes after one block's forward are its input plus the cost model's kept
    bytes, exactly; over a whole forward and backward its peak is the cost model's
    ``activation_bytes`` (within the 10 % of the multi-rank bench tests); nothing stays counted
    after backward (the cached outputs and the rebuilt block's tensors are released)."""
    spec = load_model(model)
    m = build_model(spec, seed=0, flash=flash, recompute="selective-op")
    x = _block_input(spec)
    m.layers["0"](x)  # builds the shared RoPE / mask tables outside the measurement
    meter = SavedTensorMeter()
    with meter.measuring():
        y = m.layers["0"](x)
        tokens = x.shape[0] * x.shape[1]
        per_token = spec.hidden * 4 + kept_bytes_per_token(spec, 1, 4, flash)
        assert meter.current == tokens * per_token
        del y
    assert meter.current == 0  # that graph was dropped unused: its cache went with it

    meter = SavedTensorMeter()
    tokens = torch.randint(0, spec.vocab, (1, spec.seq_len + 1))
    with meter.measuring():
        loss_fn(m(tokens[:, :-1]), tokens[:, 1:]).backward()
    assert meter.current == 0
    layout = ParallelConfig(dtype="fp32", flash_attention=flash, recompute="selective-op",
                            global_batch=1)
    want = rank_activation_bytes(spec, layout, 0)
    assert meter.peak == pytest.approx(want, rel=0.10)
    # and far below what the same run keeps without recompute
    plain = rank_activation_bytes(spec, dataclasses.replace(layout, recompute="none"), 0)
    assert meter.peak < 0.6 * plain


def test_attention_kernel_with_dropout_is_recomputed():
    """A kept kernel is not run in the recompute, so it would not advance the random-number
    generator and every later dropout mask of the block would differ from forward's: with
    ``dropout_p > 0`` the policy recomputes it. (On CPU SDPA with dropout decomposes into plain
    ops, so only the policy function itself can be checked here; the GPU kernels take the same
    ``dropout_p`` argument.)"""
    q = torch.zeros(1, 1, 4, 8)

    class Ctx:
        is_recompute = False

    kernel = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    policy = op_policy(defaultdict(int))
    assert policy(Ctx(), kernel, q, q, q, 0.0) == CheckpointPolicy.MUST_SAVE
    assert policy(Ctx(), kernel, q, q, q, dropout_p=0.1) == CheckpointPolicy.PREFER_RECOMPUTE
    assert policy(Ctx(), kernel, q, q, q, 0.1) == CheckpointPolicy.PREFER_RECOMPUTE
    # matmuls: 1st kept, 2nd recomputed, 3rd kept; other ops recomputed
    mm = torch.ops.aten.mm.default
    assert [policy(Ctx(), mm, q, q) for _ in range(3)] == [
        CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_RECOMPUTE,
        CheckpointPolicy.MUST_SAVE]
    assert policy(Ctx(), torch.ops.aten.bmm.default, q, q) == CheckpointPolicy.PREFER_RECOMPUTE
