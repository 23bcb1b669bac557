"""Trial, not adopted: also price the ``native`` engine's fused attention on Hopper at
FlashAttention-2's published rate (what PyTorch's SDPA flash backend runs, torchtitan 9dec370
``get_train_context``), on top of Megatron-LM's measured kernels (costmodel/attention_kernels.py),
and print the leave-one-source-out tables (docs/costmodel.md, "Fused attention kernels' measured
rates").

    python analysis/attention_rates_trial.py      # residuals to /tmp, tables printed

Not adopted: native+sharded+fp8@nvidia gets 1.3 points worse (14.1 -> 15.4 %, TorchTitan's
cp 2 / 4 / 8 rows, already fast, faster still), and ``native`` is several stacks (torchtitan's
SDPA, FMS's SDPA, MaxText's JAX kernels), not one kernel. Writes nothing in the repository.
"""

from __future__ import annotations

import argparse

import numpy as np
from loso_residuals import all_residuals

from frontier_llm.costmodel import attention_kernels
from frontier_llm.planner.calibration import load_calibration
from frontier_llm.planner.intervals import family_table, gpu_numbers
from frontier_llm.report.tables import markdown
from frontier_llm.specs.layout import DType, Engine

# Shah et al. 2024, FlashAttention-3 (arXiv 2407.08608) Figs. 5-6, FlashAttention-2 bars, H100
# SXM5, head dim 128: forward causal, and backward non-causal times the kernel's causal /
# non-causal forward ratio; TFLOP/s in FlashAttention's count.
FA2_HOPPER = (989.4e12, {2048: (298.0, 240.0), 8192: (333.0, 286.0), 16384: (335.0, 292.0)})


def wrap() -> None:
    original = attention_kernels.kernel_times

    def kernel_times(model, system, t, full_flops, local_seq):
        measured, fwd, bwd = original(model, system, t, full_flops, local_seq)
        if (attention_kernels.chip(system) != "hopper" or model.is_mla
                or model.head_dim != attention_kernels.HEAD_DIM):
            return measured, fwd, bwd
        rows = ((t.engine == Engine.NATIVE.code) & np.asarray(t.flash_attention, dtype=bool)
                & (t.dtype != DType.FP32.code))
        peak, points = FA2_HOPPER
        s = model.seq_len
        work = np.asarray(full_flops, dtype=float) * (s + 1) / (2 * s)
        scale = system.peak("bf16") / peak
        f = work / (attention_kernels._rate(points, local_seq, 0) * scale)
        b = attention_kernels.BACKWARD_WORK * work / (
            attention_kernels._rate(points, local_seq, 1) * scale)
        return measured | rows, np.where(rows, f, fwd), np.where(rows, b, bwd)

    attention_kernels.kernel_times = kernel_times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="/tmp/attention_rates_trial.csv")
    args = ap.parse_args()
    wrap()
    frame = all_residuals(load_calibration())
    frame.to_csv(args.out, index=False)
    print(markdown(family_table(frame)))
    print()
    print(markdown(gpu_numbers(frame)))


if __name__ == "__main__":
    main()
