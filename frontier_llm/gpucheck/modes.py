"""What the GPU check runs: the full-size mode for one GPU, and the tiny mode tests run on a CPU.

Both run the same steps through the same code; only the model, the dtype and the lists differ.
The GPU mode is sized so that every step ends inside its share of eight minutes on one H100 or
H200 (gpt3-1.3b: a step of micro-batch 8 is about 1.5e14 FLOPs, a fraction of a second; what
costs time is starting each run: importing torch, building and initialising 1.3B parameters).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

RECOMPUTES = ("none", "selective", "selective-op", "full")


@dataclass(frozen=True)
class Mode:
    name: str
    model: str
    dtype: str
    # flm bench native, one rank: each micro-batch is run as global batch = micro-batch.
    mfu_micro_batches: tuple[int, ...]
    mfu_steps: int
    mfu_warmup: int
    # Memory: each recompute mode at each micro-batch. One warm-up step and one measured step:
    # Adam's moments exist from the first optimizer step on, so the second step's forward and
    # backward hold everything the cost model counts (states, activations, loss temporaries).
    recomputes: tuple[str, ...]
    memory_micro_batches: tuple[int, ...]
    memory_steps: int
    memory_warmup: int
    deepspeed_zero: tuple[int, ...]
    deepspeed_micro_batch: int
    deepspeed_steps: int
    deepspeed_warmup: int
    run_timeout_s: float  # one flm bench run, start to trace
    gemm_budget_s: float  # seconds of calls per GEMM in the calibration
    gpu: bool
    # The attention step: SDPA at these (name, query length, key length, causal) shapes, heads
    # of head_dim, each timed attention_reps times; priced as attention_model's core.
    attention_shapes: tuple[tuple[str, int, int, bool], ...] = ()
    attention_heads: int = 32
    attention_head_dim: int = 128
    attention_reps: int = 5
    attention_model: str = "llama3-8b"


GPU = Mode(
    name="gpu", model="gpt3-1.3b", dtype="bf16",
    # 16 needs about 100 GB without recompute: run on an H200, skipped (predicted not to fit)
    # on an H100's 80 GB.
    mfu_micro_batches=(4, 8, 16), mfu_steps=5, mfu_warmup=2,
    recomputes=RECOMPUTES, memory_micro_batches=(1, 4), memory_steps=1, memory_warmup=1,
    deepspeed_zero=(0, 1, 3), deepspeed_micro_batch=4, deepspeed_steps=2, deepspeed_warmup=1,
    run_timeout_s=120.0, gemm_budget_s=0.2, gpu=True,
    # TorchTitan's Table 2 ring at 32K tokens a rank (Llama 3.1 8B, 32 query heads of 128, the
    # K/V repeated to 32 by torchtitan 9dec370): step 0 causal over the rank's two chunks, the
    # later steps all queries against the first half of the keys or the second half of the
    # queries against all keys; and 8K causal, the corpus's usual length.
    attention_shapes=(("causal-8k", 8192, 8192, True), ("causal-32k", 32768, 32768, True),
                      ("ring-kv-half-32k", 32768, 16384, False),
                      ("ring-q-half-32k", 16384, 32768, False)),
)

# The same code on a CPU in seconds: tiny-gpt, fp32, two steps per run, lists cut to keep the
# test under half a minute on two cores (every recompute mode still runs once).
TINY = Mode(
    name="tiny", model="tiny-gpt", dtype="fp32",
    mfu_micro_batches=(1, 2), mfu_steps=1, mfu_warmup=1,
    recomputes=RECOMPUTES, memory_micro_batches=(2,), memory_steps=1, memory_warmup=1,
    deepspeed_zero=(1,), deepspeed_micro_batch=1, deepspeed_steps=1, deepspeed_warmup=1,
    run_timeout_s=120.0, gemm_budget_s=0.01, gpu=False,
    attention_shapes=(("causal-128", 128, 128, True), ("causal-512", 512, 512, True),
                      ("ring-kv-half-512", 512, 256, False),
                      ("ring-q-half-512", 256, 512, False)),
    attention_heads=4, attention_head_dim=32, attention_reps=2, attention_model="tiny-llama",
)

MODES = {m.name: m for m in (GPU, TINY)}

# Device names as torch.cuda.get_device_name reports them -> the single-GPU catalog system whose
# dense bf16 peak is the MFU denominator ('NVIDIA H200' and 'NVIDIA H100 80GB HBM3' are the SXM
# parts: /work/.library/device/KINDS.md). An H100/H200 PCIe or NVL board has lower clocks and
# power: it gets no system here and the check asks for FLM_GPU_SYSTEM.
DEVICE_SYSTEMS = (("H200", "h200-sxm"), ("H100 80GB HBM3", "h100-sxm"),
                  ("H100-SXM", "h100-sxm"), ("H100 SXM", "h100-sxm"))


def system_for(mode: Mode, device_name: str, env: dict | None = None) -> str:
    """The catalog system (or a YAML path) the check measures against: ``FLM_GPU_SYSTEM`` if
    set, ``cpu-local`` in the tiny mode, else the single-GPU system of the device's name."""
    env = os.environ if env is None else env
    if env.get("FLM_GPU_SYSTEM"):
        return env["FLM_GPU_SYSTEM"]
    if not mode.gpu:
        return "cpu-local"
    # The NVL and PCIe boards share the names but not the clocks and power (lower peaks).
    if not any(board in device_name for board in ("NVL", "PCIe")):
        for key, system in DEVICE_SYSTEMS:
            if key in device_name:
                return system
    from frontier_llm.errors import UserError

    raise UserError(f"no single-GPU catalog system for {device_name!r}: set FLM_GPU_SYSTEM to a "
                    "system name or YAML file with its dense bf16 peak (docs/systems.md)")
