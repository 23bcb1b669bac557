"""``flm memcheck``: one rank of a layout measured under fake tensors and a fake process group
(PyTorch's own, standing for GPUs and ranks this machine does not have), beside the cost model."""

from __future__ import annotations

import json

import pytest

from frontier_llm.cli import main


def test_json_gives_both_peaks_and_both_breakdowns(capsys):
    """Llama 3 8B at its real shapes on 8 ranks (tp 2 x dp 4, FSDP2): the measured and predicted
    peaks and their breakdowns, and what cannot be traced; no real memory for 8B parameters."""
    argv = ["memcheck", "--model", "llama3-8b", "--system", "dgx-h100", "--tp", "2",
            "--dp", "4", "--global-batch", "4", "--zero", "3", "--format", "json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["device"] == "fake" and doc["measured_phase"] in ("backward", "step")
    measured, predicted = doc["measured_peak_bytes"], doc["predicted_peak_bytes"]
    assert measured > 10 * 2**30  # a full-size 8B shard, not a toy
    assert abs(predicted / measured - 1) < 0.05
    backward = doc["measured_breakdown"]["backward"]
    # FSDP2 over dp 4 x tp 2: a rank stores 1/8 of the bf16 parameters.
    assert backward["params"] == pytest.approx(2 * 8.03e9 / 8, rel=0.01)
    assert set(doc["predicted_breakdown"]) >= {"params", "grads", "optimizer", "activations",
                                               "loss", "buffers", "step", "reserved"}
    assert "DeepSpeed" in doc["not_traced"]


def test_table_names_the_terms(capsys):
    argv = ["memcheck", "--model", "llama3-8b", "--system", "dgx-h100", "--tp", "1", "--pp",
            "4", "--dp", "1", "--global-batch", "4", "--seq-len", "2048"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "pipeline stage" in out and "activations" in out and "not traced" in out


def test_deepspeed_is_refused_with_the_reason(capsys):
    argv = ["memcheck", "--model", "tiny-gpt", "--system", "cpu-local", "--tp", "1", "--pp",
            "1", "--dp", "2", "--global-batch", "2", "--engine", "deepspeed"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "native engine only" in err or "cannot see" in err


def test_interleaved_stages_are_refused_not_guessed(capsys):
    argv = ["memcheck", "--model", "tiny-gpt-8l", "--system", "cpu-local", "--tp", "1", "--pp",
            "2", "--dp", "1", "--global-batch", "4", "--schedule", "interleaved",
            "--virtual-stages", "2"]
    assert main(argv) == 2
    assert "interleaved" in capsys.readouterr().err


def _attention_peak(kernel: bool) -> tuple[int, int]:
    """Peak bytes of one dropout attention's forward and backward under fake tensors (gpt-22b's
    32 heads of a tp-2 rank at micro-batch 2), with or without memcheck's fused kernel; and
    the bytes of one fp32 ``s x s`` score tensor."""
    import contextlib

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.nn import functional as F

    from frontier_llm.bench.memcheck import _gpu_attention_kernel

    b, heads, s, d = 2, 32, 2048, 96
    with (_gpu_attention_kernel() if kernel else contextlib.nullcontext()), FakeTensorMode():
        q, k, v = (torch.empty(b, heads, s, d, dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        tracker = MemTracker()
        with tracker:
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.1, is_causal=True)
            out.sum().backward()
        peak = next(iter(tracker.get_tracker_snapshot("peak").values()))["Total"]
    return peak, 4 * b * heads * s * s


def test_dropout_attention_is_measured_as_the_gpu_fused_kernel():
    """On CPU, SDPA with dropout falls back to the math path (its flash kernel refuses dropout)
    and materialises fp32 s x s scores; a GPU's flash kernel does not, and neither does the
    fused kernel flm memcheck calls: its peak is a few q-sized tensors."""
    fallback, scores = _attention_peak(kernel=False)
    fused, _ = _attention_peak(kernel=True)
    assert fallback > 2 * scores  # what the CPU would allocate, no GPU does
    assert fused < scores / 4  # q, k, v, output, log-sum-exp and the gradients: 1/4 of one
