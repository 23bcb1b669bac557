"""Eager (un-compiled) PyTorch element-wise traffic: costmodel/steptime.py EAGER_BYTES_PER_TOKEN,
measured by analysis/eager_bytes.py; calibration prices a row eager where its model code is
plain PyTorch and names no compilation (planner/calibration.py row_eager)."""

from __future__ import annotations

import pandas as pd
import pytest

from frontier_llm.catalog import load_model, load_system
from frontier_llm.costmodel import evaluate
from frontier_llm.costmodel.layouts import from_configs
from frontier_llm.planner.calibration import row_eager
from frontier_llm.specs.parallel import ParallelConfig


def _times(eager: bool, system: str = "dgx-h100") -> dict[str, float]:
    m, s = load_model("llama3-8b"), load_system(system)
    table = from_configs([ParallelConfig(dp=8, micro_batch=2, global_batch=16, sharding=3)])
    return {k: float(v[0]) for k, v in evaluate(m, s, table, eager=eager).items()}


def test_eager_element_wise_costs_more_and_matmuls_do_not_change():
    fused, eager = _times(False), _times(True)
    assert eager["time_compute_s"] == fused["time_compute_s"]  # GEMMs and attention as before
    assert eager["step_time_s"] > fused["step_time_s"]
    # Un-fused RMSNorm (through fp32), RoPE, SwiGLU and their autograd backward move ~4x the
    # bytes of the fused kernels (analysis/eager_bytes.py on the Llama shapes: x3.8 to x4.3).
    ratio = eager["time_elementwise_s"] / fused["time_elementwise_s"]
    assert 3.5 < ratio < 4.5


def test_eager_penalty_grows_with_compute_over_bandwidth():
    # The same bytes weigh more where FLOP/s per byte/s is higher (H100 over A100).
    share = {}
    for system in ("dgx-a100", "dgx-h100"):
        eager = _times(True, system)
        share[system] = eager["time_elementwise_s"] / eager["step_time_s"]
    assert share["dgx-h100"] > share["dgx-a100"]


@pytest.mark.parametrize(("engine", "notes", "eager"), [
    ("PyTorch FSDP (FSDP1), SDPA FlashAttention-2, bf16, no torch.compile", "", True),
    ("", "torchtitan Table 1, FSDP, eager (no torch.compile, no Float8)", True),
    # PyTorch is eager unless compiled: FSDP code that names no compile ran eagerly.
    ("PyTorch FSDP (FSDP1), SDPA FlashAttention-2, bf16", "", True),
    ("PyTorch FSDP2 with torch.compile, bf16", "", False),
    ("xtuner + DeepSpeed ZeRO-3 (bf16)", "", True),  # a Hugging Face Llama
    # Megatron's fused kernels, also under DeepSpeed; XLA fuses.
    ("Megatron-DeepSpeed (microsoft fork, examples_deepspeed/rebase), fp16, flash-attn", "",
     False),
    ("MaxText (JAX/XLA), cudnn_flash_te", "", False),
    ("", "MFU 41%; README: fine-grained overlap of DP (--overlap-grad-reduce)", False),
])
def test_rows_are_priced_eager_where_their_model_code_runs_eagerly(engine, notes, eager):
    assert row_eager(pd.Series({"engine": engine, "notes": notes})) is eager
