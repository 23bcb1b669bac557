"""What a measurement may say and still be one: the plausible range of a step time, a memory
peak and a throughput. ``flm collect`` quarantines a trace outside them, ``flm validate`` and
``flm calibrate --from-runs`` leave such a run out and say so.

Why: a trace or a trainer's log is written by a program flm does not control (docs/security.md):
one log line claiming 1e308 ms per iteration became a step time of 1e305 s, and a calibration
fitted through it moved its held-out error from 15 % to 336 % without a word. The bounds are
wide (a thousand times the largest real figure): they catch what no machine can do, never a
slow or a small run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

# The shortest step: one kernel launch takes about 5 us on a GPU (NVIDIA CUDA C++ Best
# Practices Guide, "Kernel launch overhead"; the same order on ROCm), and a training step runs
# hundreds of kernels; 1 us is below any of them.
MIN_STEP_S = 1e-6
# The longest step: a day. Published steps of the largest models run for seconds to a minute
# (GPT 1T on 3072 A100s: about 60 s per iteration, Narayanan et al. 2021, Table 1).
MAX_STEP_S = 86_400.0
# The most memory one device holds: 1 TiB, above any accelerator's (AMD MI355X: 288 GB HBM3E;
# NVIDIA GH200: 144 GB HBM3e plus 480 GB LPDDR5X the GPU can address).
MAX_DEVICE_BYTES = float(2**40)
# A device's own memory: a peak a little above its datasheet size is the allocator's rounding
# and the datasheet's GB-for-GiB; 10 % above is no measurement.
DEVICE_MARGIN = 1.10
# The most TFLOP/s one device does: 20,000, above any today (NVIDIA B200: 9 PFLOP/s dense FP4,
# 2.25 PFLOP/s dense BF16, NVIDIA Blackwell datasheet).
MAX_TFLOPS_PER_DEVICE = 2e4
# MFU and HFU are shares of the device's peak: above 1 the run did more than the device can.
# 1.1 leaves room for a peak that a site states a little low (docs/costmodel.md).
MAX_UTILISATION = 1.10
# The summary columns that hold bytes of device memory.
_DEVICE_BYTES = ("device_allocated_peak_bytes", "device_reserved_peak_bytes")
_NON_NEGATIVE_BYTES = ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_peak_bytes",
                       "host_rss_peak_bytes", *_DEVICE_BYTES)


def _bad_number(value: Any) -> bool:
    return isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)


def step_time_problem(seconds: Any, what: str = "step time") -> str | None:
    """Why ``seconds`` cannot be a training step's time, or None (None itself passes)."""
    if seconds is None:
        return None
    if _bad_number(seconds):
        return f"{what} is not a finite number"
    if not MIN_STEP_S <= seconds <= MAX_STEP_S:
        return (f"{what} {seconds:.3g} s is outside the plausible range [{MIN_STEP_S:g} s, "
                f"{MAX_STEP_S:g} s] (specs/plausible.py)")
    return None


def memory_problem(nbytes: Any, what: str, device_bytes: float | None = None) -> str | None:
    """Why ``nbytes`` cannot be a peak of device memory (``device_bytes``: the device's size,
    None when unknown), or None."""
    if nbytes is None:
        return None
    if _bad_number(nbytes):
        return f"{what} is not a finite number"
    if nbytes < 0:
        return f"{what} is negative ({nbytes:.3g} bytes)"
    limit = MAX_DEVICE_BYTES if device_bytes is None else device_bytes * DEVICE_MARGIN
    if nbytes > limit:
        return (f"{what} {nbytes:.3g} bytes is above what the device holds ({limit:.3g} bytes; "
                "specs/plausible.py)")
    return None


def throughput_problem(summary: Mapping[str, Any], peak_flops: float | None = None,
                       utilisation: bool = True) -> str | None:
    """Why a run summary's TFLOP/s, MFU or HFU cannot be real (``peak_flops``: the device's
    peak FLOP/s for the run's dtype, None when unknown; ``utilisation``: check MFU and HFU,
    which a CPU run's estimated peak makes only indicative), or None."""
    limit = MAX_TFLOPS_PER_DEVICE
    if peak_flops:
        limit = min(limit, peak_flops / 1e12 * MAX_UTILISATION)
    for key in ("model_tflops_per_gpu", "hardware_tflops_per_gpu"):
        value = summary.get(key)
        if value is None:
            continue
        if _bad_number(value) or value < 0:
            return f"{key} is not a finite number of 0 or more"
        if value > limit:
            return (f"{key} {value:.3g} is above the device's peak ({limit:.3g} TFLOP/s with "
                    "a 10 % margin; specs/plausible.py)")
    for key in ("mfu", "hfu") if utilisation else ():
        value = summary.get(key)
        if value is None:
            continue
        if _bad_number(value) or not 0 <= value <= MAX_UTILISATION:
            return f"{key} {value!r} is outside [0, {MAX_UTILISATION:g}]"
    return None


def trace_problem(trace: Mapping[str, Any], device_bytes: float | None = None,
                  peak_flops: float | None = None) -> str | None:
    """The first reason a schema-valid trace's measurements cannot be real, or None: its step
    times, its summary's step time, memory peaks and throughput. ``device_bytes`` and
    ``peak_flops`` are the device's, when the caller knows the system (None: the fixed
    bounds above); a CPU run's memory is the host's and only the fixed bound applies."""
    summary = trace.get("summary") or {}
    why = step_time_problem(summary.get("step_time_s"), "summary step_time_s")
    if why:
        return why
    for s in trace.get("steps") or ():
        why = step_time_problem(s.get("time_s"), f"step {s.get('step')} time_s")
        if why:
            return why
    on_device = (trace.get("environment") or {}).get("device") != "cpu"
    device = device_bytes if on_device else None
    why = memory_problem(summary.get("peak_memory_bytes"), "summary peak_memory_bytes", device)
    if why:
        return why
    for m in trace.get("memory") or ():
        for key in _NON_NEGATIVE_BYTES:
            limit = device if key in _DEVICE_BYTES else None
            why = memory_problem(m.get(key), f"memory rank {m.get('rank')} {key}", limit)
            if why:
                return why
    # A CPU system's peak is an estimate (catalog cpu-local.yaml: "MFU here is indicative
    # only"): only the absolute bound applies to a CPU run.
    return throughput_problem(summary, peak_flops if on_device else None, on_device)
