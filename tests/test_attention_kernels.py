"""Megatron-LM's fused attention at its kernel's measured rate where one is published
(costmodel/attention_kernels.py); today's GEMM-rate pricing everywhere else."""

from __future__ import annotations

import numpy as np
import pytest

from frontier_llm.catalog import load_model, load_system
from frontier_llm.costmodel import evaluate
from frontier_llm.costmodel.attention_kernels import KERNELS, kernel_times, priced_rates
from frontier_llm.costmodel.flops import layer_forward_flops_per_token
from frontier_llm.costmodel.layouts import from_configs
from frontier_llm.costmodel.steptime import _rates, block_times
from frontier_llm.specs.parallel import ParallelConfig


def _table(*engines):
    return from_configs([ParallelConfig(global_batch=8, micro_batch=1, dp=8, engine=e)
                         for e in engines])


def _megatron_and_native_llama3_8b(system: str):
    """Llama 3 8B's Megatron and native layouts on one system: (measured flags, forward and
    backward kernel seconds, the causal forward work)."""
    m, s = load_model("llama3-8b"), load_system(system)
    t = _table("megatron", "native")
    _, attn = layer_forward_flops_per_token(m)
    full = attn * m.seq_len
    measured, fwd, bwd = kernel_times(m, s, t, np.full(2, full), t.local_seq(m.seq_len))
    return measured, fwd, bwd, full * (m.seq_len + 1) / (2 * m.seq_len)


def test_megatron_on_mi355x_runs_aiter_s_measured_rates():
    measured, fwd, bwd, causal = _megatron_and_native_llama3_8b("mi355x")
    assert list(measured) == [True, False]
    rate_fwd, rate_bwd = KERNELS["mi355x"][1][8192]  # llama3-8b's sequence: a measured point
    assert fwd[0] == pytest.approx(causal / (rate_fwd * 1e12), rel=1e-9)
    assert bwd[0] == pytest.approx(2.5 * causal / (rate_bwd * 1e12), rel=1e-9)
    assert np.isnan(fwd[1]) and np.isnan(bwd[1])


@pytest.mark.parametrize("system", ["mi300x", "mi325x"])
def test_megatron_on_cdna3_runs_aiter_s_mi300x_rates_unscaled(system):
    """MI325X is the MI300X die at the same bf16 peak: both take AITER's MI300X table as is,
    the backward its fp32-atomic column (TransformerEngine's and Primus-Turbo's default)."""
    measured, fwd, bwd, causal = _megatron_and_native_llama3_8b(system)
    assert list(measured) == [True, False]
    assert fwd[0] == pytest.approx(causal / 537.36e12, rel=1e-9)
    assert bwd[0] == pytest.approx(2.5 * causal / 441.4e12, rel=1e-9)


@pytest.mark.parametrize("model,system", [("llama3-8b", "lumi-g"), ("llama3-8b", "dgx-a100"),
                                          ("llama3-8b", "dgx-b200"),
                                          ("deepseek-v3", "dgx-h800")])
def test_no_published_measurement_keeps_today_s_pricing(model, system):
    m, s = load_model(model), load_system(system)
    t = _table("megatron")
    measured, _, _ = kernel_times(m, s, t, np.ones(1), t.local_seq(m.seq_len))
    assert not measured.any()


def test_the_kernel_s_backward_is_priced_as_measured_not_twice_the_forward():
    """On an H100 a Megatron layout's compute carries cuDNN's forward plus its measured
    backward (2.5x the forward's work); a native layout of the same shape keeps the GEMM-rate
    attention, three times its forward."""
    from frontier_llm.costmodel.steptime import _rates

    m, s = load_model("llama3-8b"), load_system("dgx-h100")
    t = _table("megatron", "native")
    out = evaluate(m, s, t)
    _, attn = layer_forward_flops_per_token(m)
    full = np.full(2, attn * m.seq_len)
    gemm_attn = full / _rates(m, s, t).flops
    _, fwd, bwd = kernel_times(m, s, t, full, t.local_seq(m.seq_len))
    per_layer = out["time_compute_s"] / m.layers
    assert per_layer[0] - per_layer[1] == pytest.approx(
        fwd[0] + bwd[0] - 3 * gemm_attn[1], rel=1e-6)
    assert fwd[0] + bwd[0] < 3 * gemm_attn[1]


@pytest.mark.parametrize("system", ["grand-teton-h100", "h200-sxm", "frontier"])
def test_priced_rates_are_what_block_times_charges_a_native_layout(system):
    """The rates the GPU check sets its measured SDPA rates beside are the cost model's own: a
    native layout's attention core (forward, and twice it backward) takes exactly the causal
    work over them, so the two cannot drift apart."""
    m, s = load_model("llama3-8b"), load_system(system)
    t = _table("native")
    blk = block_times(m, s, t, _rates(m, s, t))
    _, attn = layer_forward_flops_per_token(m)
    causal = attn * m.seq_len * (m.seq_len + 1) / (2 * m.seq_len)
    fwd, bwd = priced_rates(m, s)
    assert blk.attn[0] == pytest.approx(causal / fwd, rel=1e-9)
    assert 2 * blk.attn[0] == pytest.approx(2.5 * causal / bwd, rel=1e-9)
    assert float(np.asarray(blk.attn_bwd_extra).max()) == 0.0  # no measured kernel here
    assert fwd < s.peak("bf16") / 2 and bwd == pytest.approx(1.25 * fwd)
