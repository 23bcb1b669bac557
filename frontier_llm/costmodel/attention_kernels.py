"""A fused causal attention core at the measured rate of the kernel its engine runs on that GPU.

Where no measurement is published, a block's attention core is priced as an unfused one: the full
``s x s`` work at the bf16 GEMM rate through the size law, forward ``f_attn`` and backward
``2 f_attn`` (steptime.block_times). Where the engine fixes the kernel and that kernel's rate is
published for the chip (:data:`KERNELS`), the causal work ``W = full x (s+1)/(2s)`` runs at the
kernel's measured forward rate and ``2.5 W`` (FlashAttention's backward count: five matmuls to
the forward's two) at its measured backward rate, both log-interpolated in the rank's sequence
length (``seq / cp``; clamped to the measured range) and scaled by the system's bf16 peak over
the measured GPU's (H200 and H800 as the H100 die).

Megatron-LM only: its attention is TransformerEngine's fused attention whatever the site, cuDNN's
kernel on Hopper (TE prefers it there: NVIDIA/NeMo#9188, ``memory_optimizations.rst``) and CK's
fused attention v3 (AITER's assembly kernels) under ROCm's TransformerEngine where the run sets
``NVTE_CK_USES_FWD_V3`` / ``NVTE_CK_USES_BWD_V3`` (AMD's MLPerf v5.1 recipe,
mlcommons/training_results_v5.1@441d65f4 AMD/.../config_MI355X_1x8x1_8b.sh), on the MI355X and
on CDNA3 (MI300X, MI325X) alike, where AMD's Primus runs them through TE or Primus-Turbo's AITER
attention. The ``native`` label
covers PyTorch SDPA (torchtitan, FMS) and JAX (MaxText) runs whose kernels differ by stack and
version, so it keeps today's pricing; so do A100, Blackwell and MI250X (no published measurement
of the kernel TE runs there), MLA (its 192-wide Q·K heads were not measured) and head widths other
than 128 (every measurement's).
"""

from __future__ import annotations

import numpy as np

from frontier_llm.costmodel import gemm
from frontier_llm.specs.layout import DType, Engine
from frontier_llm.specs.model import ModelSpec
from frontier_llm.specs.system import SystemSpec

# chip -> (measured GPU's bf16 dense peak FLOP/s, {seq: (forward, backward) causal TFLOP/s}),
# FlashAttention's FLOP count (causal halves the work), 16-bit, head dim 128, Megatron-LM's kernel.
KERNELS: dict[str, tuple[float, dict[int, tuple[float, float]]]] = {
    # cuDNN fused attention, H100 SXM5: Shah et al. 2024, FlashAttention-3 (arXiv 2407.08608)
    # Fig. 5 (forward, causal, head dim 128) and Fig. 6 (backward, non-causal: 465 / 518 / 516,
    # times the kernel's causal/non-causal forward ratio, which on AITER, where both are measured,
    # overstates the causal backward by 5-6 %), cuDNN bars.
    "hopper": (989.4e12, {2048: (484.0, 365.0), 8192: (529.0, 457.0), 16384: (539.0, 467.0)}),
    # CK fused attention v3 = AITER's kernels, MI355X: HazyResearch/HipKittens@f09e9685
    # analysis/attn/fwd/benchmark/mi355x_mha_causal_fwd.json and
    # analysis/attn/bkwd/benchmark/mi355x_mha_bkwd_causal.json, ``tflops_ref``
    # (aiter.flash_attn_func, bf16, B 16, H 16, D 128, causal), both measured.
    "mi355x": (2516.6e12, {1024: (554.6, 388.7), 2048: (876.3, 673.1), 4096: (1069.0, 876.8),
                           8192: (1173.2, 1034.1), 16384: (1247.4, 1108.7)}),
    # The same kernels on CDNA3, MI300X: ROCm/aiter@e4048607a535ace3a2b51ded31b1c8c2d45c0879
    # op_tests/cpp/mha/README.md, "the asm kernel performance of the attention forwards and
    # attention backwards" (bf16, BSHD), causal rows of batch 8, 32 query / 8 K/V heads (lines
    # 168-170) and, at 16384, batch 1, 64 / 8 heads (line 202); causal FLOPs halved (ROCm/aiter
    # PR #4874). Backward: the fp32-atomic column ("BWD-a32"), TransformerEngine's and
    # Primus-Turbo's default on CDNA3 (NVTE_CK_IS_V3_ATOMIC_FP32 = 1; AMD-AGI/Primus-Turbo@a6a16cdc
    # primus_turbo/common/constants.py: "Default: "1" (enabled)"). MI325X is the same die at the
    # same bf16 peak, so it takes these rates unscaled.
    "mi300x": (1307.4e12, {2048: (412.99, 326.355), 4096: (513.1, 409.05), 8192: (537.36, 441.4),
                           16384: (541.55, 412.04)}),
}
HEAD_DIM = 128
BACKWARD_WORK = 2.5


def chip(system: SystemSpec) -> str | None:
    """The :data:`KERNELS` key of the system's GPU, or None where none is measured."""
    if any(name in system.gpu for name in ("H100", "H200", "H800")):
        return "hopper"
    if "MI355X" in system.gpu:
        return "mi355x"
    if "MI300X" in system.gpu or "MI325X" in system.gpu:
        return "mi300x"
    return None


def priced_rates(model: ModelSpec, system: SystemSpec, dtype: str = "bf16"
                 ) -> tuple[float, float]:
    """``(forward, backward)`` FLOP/s, in FlashAttention's count (causal halves the work), that
    the cost model charges the attention core of ``model`` at tp 1 where no kernel is measured
    (steptime.block_times: the full ``s x s`` work at the GEMM rate through the size law,
    forward once and backward twice). The same rates whatever the call's shape: a context-
    parallel rank's partial attentions are priced as its share of the whole causal work. What
    the GPU check sets its measured SDPA rates beside (gpucheck/steps.py ``attention``)."""
    rate = (system.peak(dtype) * system.eff("matmul")
            * float(gemm.block_factor(model, np.array([1]), system.matmul_half_hidden)[0]))
    causal = (model.seq_len + 1) / (2 * model.seq_len)
    return rate * causal, rate * causal * BACKWARD_WORK / 2


def _rate(points: dict[int, tuple[float, float]], seq, which: int) -> np.ndarray:
    keys = sorted(points)
    xs = np.log(np.array(keys, dtype=float))
    ys = np.log(np.array([points[k][which] for k in keys]))
    return np.exp(np.interp(np.log(np.asarray(seq, dtype=float)), xs, ys)) * 1e12


def kernel_times(model: ModelSpec, system: SystemSpec, t, full_flops, local_seq
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(measured, forward, backward)`` seconds of a block's attention core per layout of ``t``:
    ``measured`` where the layout's kernel has a published rate on this chip (the other
    layouts' times are NaN). ``full_flops`` is the rank's full ``s x s`` forward work (today's
    count), ``local_seq`` its sequence length."""
    n = len(t)
    key = chip(system)
    if key is None or model.is_mla or model.head_dim != HEAD_DIM:
        return np.zeros(n, dtype=bool), np.full(n, np.nan), np.full(n, np.nan)
    peak, points = KERNELS[key]
    measured = ((t.engine == Engine.MEGATRON.code) & np.asarray(t.flash_attention, dtype=bool)
                & (t.dtype != DType.FP32.code))
    s = model.seq_len
    work = np.asarray(full_flops, dtype=float) * (s + 1) / (2 * s)
    scale = system.peak("bf16") / peak
    fwd = work / (_rate(points, local_seq, 0) * scale)
    bwd = BACKWARD_WORK * work / (_rate(points, local_seq, 1) * scale)
    return measured, np.where(measured, fwd, np.nan), np.where(measured, bwd, np.nan)
