"""The check's steps. Each writes ``<work>/<step>.json`` after every run it finishes, so that a
step killed at its time limit still leaves what it measured; a run that fails (an OOM, an error,
a timeout) is a record with its first error line, never the end of the step.

Every training run is the real ``flm bench`` (``python -m frontier_llm.cli bench``) started as
rank 0 of a world of one through the torchrun variables, so it writes its ordinary trace: step
times, MFU/HFU against the system's dense peak, the allocator's peaks and the cost model's
prediction with its breakdown (bench/run.py). The figures here are read off those traces.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import platform
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from frontier_llm.child import flm
from frontier_llm.gpucheck.modes import Mode, system_for
from frontier_llm.gpucheck.summary import DOES_NOT_FIT, first_error_line
from frontier_llm.specs.vocab import RunStatus

GiB = 2**30


class Budget:
    """The seconds a step may still spend (its limit, less a margin to write its results)."""

    def __init__(self, limit_s: float, margin_s: float = 3.0) -> None:
        self.end = time.monotonic() + max(0.0, limit_s - margin_s)

    def left(self) -> float:
        return self.end - time.monotonic()


def save(work: Path, step: str, doc: dict) -> Path:
    path = work / f"{step}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    os.replace(tmp, path)  # the summary never reads half a file
    return path


def run_env(mode: Mode, work: Path) -> dict[str, str]:
    """The environment of a run: rank 0 of one (the torchrun variables, so flm bench joins
    rather than spawns), no GPU in the tiny mode, DeepSpeed's op cache kept in one place."""
    from frontier_llm.bench.launch import free_port

    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    env.setdefault("OMP_NUM_THREADS", "1" if not mode.gpu else "8")
    env.setdefault("TORCH_EXTENSIONS_DIR", str(work / "torch_extensions"))
    if not mode.gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def layout_for(mode: Mode, micro_batch: int, recompute: str = "none", engine: str = "native",
               zero: int = 0):
    from frontier_llm.specs.layout import Layout, zero_preset

    return Layout(micro_batch=micro_batch, global_batch=micro_batch, dtype=mode.dtype,
                  recompute=recompute, flash_attention=True, engine=engine,
                  sharding=zero_preset(zero))


def bench(mode: Mode, work: Path, system: str, layout, run_id: str, steps: int, warmup: int,
          timeout_s: float, label: str) -> dict:
    """One ``flm bench`` run; its record (status, first error line, figures off its trace)."""
    from frontier_llm.bench.config import bench_argv
    from frontier_llm.bench.trace import read_trace, trace_path

    traces = work / "traces"
    argv = [*flm(["bench"]),
            *bench_argv(mode.model, system, layout, steps=steps, warmup=warmup, seed=0,
                        labels={"gpucheck": label},
                        extra=["--trace-dir", str(traces), "--run-id", run_id])]
    rec: dict[str, Any] = {"run_id": run_id, "layout": layout.to_dict(), "status": None,
                           "error": None}
    if timeout_s < 5:
        rec.update(status="skipped", error="the step's time budget was spent")
        return rec
    t0 = time.monotonic()
    out, code = _run(argv, run_env(mode, work), timeout_s)
    rec.update(wall_s=round(time.monotonic() - t0, 2), exit_code=code)
    with open(work / "check.log", "a") as log:
        log.write(f"\n=== flm bench {run_id} (exit {code}, {rec['wall_s']} s)\n{out}")
    path = trace_path(traces, run_id)
    if path.exists():
        try:
            trace = read_trace(path)
            rec.update(status=trace["status"], error=trace.get("error"), trace=path.name,
                       **figures(trace))
        except Exception as exc:  # a trace the schema refuses is a finding too
            rec.update(status=RunStatus.FAILED.value,
                       error=f"trace: {type(exc).__name__}: {exc}"[:500])
    else:
        rec["status"] = (RunStatus.TIMEOUT if code == 124 else RunStatus.FAILED).value
        rec["error"] = (f"no trace after {timeout_s:.0f} s (killed)" if code == 124
                        else first_error_line(out) or f"exit {code}, no trace")
    return rec


_CHILDREN: set[int] = set()  # process groups of the runs in flight


def _run(argv: list[str], env: dict[str, str], timeout_s: float) -> tuple[str, int]:
    """Run ``argv`` in its own process group; on timeout end the whole group (exit 124)."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", start_new_session=True)
    _CHILDREN.add(proc.pid)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        return out, proc.returncode
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        out, _ = proc.communicate()
        return out, 124
    finally:
        _CHILDREN.discard(proc.pid)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def end_runs_on_sigterm() -> None:
    """When the wrapper's ``timeout`` ends the step (SIGTERM), end the run in flight too: it sits
    in a process group of its own, out of the signal's reach, and would hold the GPU while the
    next step runs. The step then exits 124 as ``timeout`` would report it."""

    def stop(signum: int, frame: object) -> None:
        for pid in list(_CHILDREN):
            _kill_group(pid)
        raise SystemExit(124)

    signal.signal(signal.SIGTERM, stop)


def figures(trace: dict) -> dict:
    """What the check reports of one trace: time, throughput, MFU/HFU, and memory measured
    against predicted (the ratio per case)."""
    s = trace["summary"]
    mem = trace["memory"][0] if trace["memory"] else {}
    pred = trace.get("prediction") or {}
    breakdown = (pred.get("breakdown") or {}).get("memory_bytes") or {}
    per_rank = (pred.get("memory_per_rank") or [{}])[0]
    out = {k: s.get(k) for k in ("step_time_s", "tokens_per_s", "model_tflops_per_gpu",
                                 "hardware_tflops_per_gpu", "mfu", "hfu")}
    out["predicted_step_time_s"] = pred.get("step_time_s")
    out["device"] = trace["environment"]["device"]
    alloc, reserved = mem.get("device_allocated_peak_bytes"), mem.get("device_reserved_peak_bytes")
    peak = pred.get("peak_memory_bytes")
    held = sum(mem.get(k) or 0 for k in ("params_bytes", "grads_bytes", "optimizer_bytes",
                                         "activations_peak_bytes"))
    out["memory"] = {
        "allocated_peak_bytes": alloc, "reserved_peak_bytes": reserved,
        "states_and_activations_bytes": held,
        "predicted_peak_bytes": peak, "predicted_breakdown_bytes": breakdown,
        # The cost model's peak is the allocator's reserved peak plus the system's reserve
        # (CUDA context, fragmentation: costmodel/memory.py); allocated is compared with the
        # peak less that reserve.
        "ratio_reserved": _ratio(reserved, peak),
        "ratio_allocated": _ratio(alloc, None if peak is None
                                  else peak - (breakdown.get("reserved") or 0)),
        # Components, measured (bench/run.py) over predicted (costmodel.memory per rank).
        "ratio_components": {
            k: _ratio(mem.get(f"{k}_bytes" if k != "activations" else "activations_peak_bytes"),
                      per_rank.get(f"{k}_bytes"))
            for k in ("params", "grads", "optimizer", "activations")},
    }
    if alloc is None:
        # No device allocator (CPU): what bench measured, states and saved activations, against
        # the same terms of the prediction: the rank's own (bench/record.py), not the peak's
        # breakdown, which since cost model 2.3 may be the optimizer step's, when no
        # activation is held.
        terms = (sum(per_rank.get(f"{k}_bytes") or 0 for k in ("params", "grads", "optimizer",
                                                               "activations"))
                 if per_rank else
                 sum(breakdown.get(k) or 0 for k in ("params", "grads", "optimizer",
                                                     "activations")))
        out["memory"]["ratio_states_and_activations"] = _ratio(held, terms or None)
    return out


def _ratio(a, b) -> float | None:
    return round(a / b, 4) if a is not None and b else None


def _system(mode: Mode) -> str:
    import torch

    name = torch.cuda.get_device_name(0) if mode.gpu else "cpu"
    return system_for(mode, name)


def device_memory_bytes(mode: Mode, system) -> float:
    """The memory a run may use: the GPU's total as the driver reports it, else the system's."""
    if mode.gpu:
        import torch

        return float(torch.cuda.get_device_properties(0).total_memory)
    return float(system.memory_bytes)


# --- steps -----------------------------------------------------------------------------------
def preflight(mode: Mode, work: Path, limit_s: float) -> int:
    """The machine and the software: device, driver, versions, and every requirement of the
    package importable (the check runs on the image's torch, whatever setup.cfg pins)."""
    import importlib
    import importlib.metadata as md

    import torch

    doc: dict[str, Any] = {"step": "preflight", "mode": mode.name, "failures": []}
    env = {"python": platform.python_version(), "torch": torch.__version__,
           "cuda_runtime": torch.version.cuda, "host": platform.node(),
           "cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(device=torch.cuda.get_device_name(0), device_memory_bytes=props.total_memory,
                   multiprocessors=props.multi_processor_count,
                   capability=f"{props.major}.{props.minor}")
        env["driver"] = _nvidia_smi("driver_version")
    else:
        env["device"] = "cpu"
    doc["environment"] = env
    versions, failures = {}, doc["failures"]
    for name in [*_requirements(), "deepspeed"]:
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            versions[name] = None
            failures.append({"what": f"package {name}", "error": "not installed"})
    doc["packages"] = versions
    # Every module of the package imports: the errors a missing or too-old package (or this
    # image's torch) causes show here, not in the middle of a run.
    doc["modules"] = 0
    for name in _modules():
        try:
            importlib.import_module(name)
            doc["modules"] += 1
        except Exception as exc:
            failures.append({"what": f"import {name}",
                             "error": f"{type(exc).__name__}: {first_error_line(str(exc))}"})
    try:
        doc["system"] = _system(mode)
    except Exception as exc:
        failures.append({"what": "system", "error": str(exc)})
    save(work, "preflight", doc)
    return 1 if failures else 0


def _modules() -> list[str]:
    """Every module of frontier_llm (``__main__`` modules left out: importing runs them)."""
    import pkgutil

    import frontier_llm

    return sorted(m.name for m in pkgutil.walk_packages(frontier_llm.__path__, "frontier_llm.")
                  if not m.name.endswith("__main__"))


def _nvidia_smi(field: str) -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=15, check=True).stdout
        return out.strip().splitlines()[0] if out.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def _requirements() -> list[str]:
    """install_requires of the installed package, else of the checkout's setup.cfg."""
    import configparser
    import importlib.metadata as md

    try:
        reqs = [r for r in (md.requires("frontier_llm") or []) if "extra ==" not in r]
    except md.PackageNotFoundError:
        cfg = configparser.ConfigParser()
        cfg.read(Path(__file__).resolve().parents[2] / "setup.cfg")
        reqs = [ln.split("#")[0].strip() for ln in
                cfg.get("options", "install_requires", fallback="").splitlines()]
    return sorted({re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0] for r in reqs if r})


def mfu(mode: Mode, work: Path, limit_s: float) -> int:
    """flm bench native on one GPU at each micro-batch of the list the cost model says fits;
    the best MFU and its HFU, against the system's dense peak."""
    from frontier_llm.catalog import load_model, load_system
    from frontier_llm.costmodel import predict

    budget = Budget(limit_s)
    system_ref = _system(mode)
    model, system = load_model(mode.model), load_system(system_ref)
    room = device_memory_bytes(mode, system)
    doc: dict[str, Any] = {"step": "mfu", "system": system_ref, "model": mode.model,
                           "dtype": mode.dtype, "peak_flops": system.peak(mode.dtype),
                           "device_memory_bytes": room, "runs": []}
    for mb in mode.mfu_micro_batches:
        layout = layout_for(mode, mb)
        need = predict(model, system, layout)["peak_memory_bytes"]
        if need > room:
            doc["runs"].append({"run_id": f"gpucheck-mfu-mb{mb}", "layout": layout.to_dict(),
                                "status": DOES_NOT_FIT, "error": (
                                    f"predicted peak {need / GiB:.1f} GiB > the device's "
                                    f"{room / GiB:.1f} GiB")})
            continue
        doc["runs"].append(bench(mode, work, system_ref, layout, f"gpucheck-mfu-mb{mb}",
                                 mode.mfu_steps, mode.mfu_warmup,
                                 min(mode.run_timeout_s, budget.left()), "mfu"))
        save(work, "mfu", doc)
    done = [r for r in doc["runs"]
            if r["status"] == RunStatus.COMPLETED and r.get("mfu") is not None]
    doc["best"] = max(done, key=lambda r: r["mfu"])["run_id"] if done else None
    save(work, "mfu", doc)
    return 0 if done else 1


def memory(mode: Mode, work: Path, limit_s: float) -> int:
    """Each recompute mode at each micro-batch: measured peaks against the prediction."""
    budget = Budget(limit_s)
    system_ref = _system(mode)
    doc: dict[str, Any] = {"step": "memory", "system": system_ref, "runs": []}
    for recompute in mode.recomputes:
        for mb in mode.memory_micro_batches:
            layout = layout_for(mode, mb, recompute)
            doc["runs"].append(bench(mode, work, system_ref, layout,
                                     f"gpucheck-mem-{recompute}-mb{mb}", mode.memory_steps,
                                     mode.memory_warmup, min(mode.run_timeout_s, budget.left()),
                                     "memory"))
            save(work, "memory", doc)
    save(work, "memory", doc)
    return 0 if all(r["status"] == RunStatus.COMPLETED for r in doc["runs"]) else 1


def deepspeed(mode: Mode, work: Path, limit_s: float) -> int:
    """The DeepSpeed engine with a world of one at each ZeRO stage of the list."""
    budget = Budget(limit_s)
    system_ref = _system(mode)
    doc: dict[str, Any] = {"step": "deepspeed", "system": system_ref, "runs": []}
    import importlib.metadata as md

    try:
        # Its version only: each run imports it (a broken import shows as the runs' error).
        doc["deepspeed"] = md.version("deepspeed")
    except md.PackageNotFoundError:  # a missing wheel is a finding, not a crash of the check
        doc["error"] = "deepspeed is not installed (scripts/gpu-wheels.sh carries it)"
        save(work, "deepspeed", doc)
        return 1
    for zero in mode.deepspeed_zero:
        layout = layout_for(mode, mode.deepspeed_micro_batch, engine="deepspeed", zero=zero)
        doc["runs"].append(bench(mode, work, system_ref, layout, f"gpucheck-ds-zero{zero}",
                                 mode.deepspeed_steps, mode.deepspeed_warmup,
                                 min(mode.run_timeout_s + 60, budget.left()), "deepspeed"))
        save(work, "deepspeed", doc)
    return 0 if all(r["status"] == RunStatus.COMPLETED for r in doc["runs"]) else 1


def calibrate(mode: Mode, work: Path, limit_s: float) -> int:
    """flm calibrate's microbenchmark on this device (one rank: GEMMs only, no link to time),
    its matrix-rate fit and the fitted system file."""
    from frontier_llm.calibrate.fit import fit_matmul
    from frontier_llm.calibrate.local import measure
    from frontier_llm.calibrate.microbench import WorkerConfig
    from frontier_llm.calibrate.results import load_results
    from frontier_llm.calibrate.shapes import gemm_set
    from frontier_llm.calibrate.system_file import (
        base_mapping,
        calibrated_mapping,
        provenance_line,
        write_system,
    )
    from frontier_llm.catalog import load_model

    system_ref = _system(mode)
    model = load_model(mode.model)
    doc: dict[str, Any] = {"step": "calibrate", "system": system_ref}
    # The ladder flm calibrate uses (cli/calibrate.py): the model's width x 1/4, 1/2, 1, 2.
    widths = [w for w in (model.hidden // 4, model.hidden // 2, model.hidden, 2 * model.hidden)
              if w >= model.head_dim and w % model.head_dim == 0]
    cfg = WorkerConfig(gemms=gemm_set(model, [1], widths), dtype=mode.dtype, min_bytes=1024,
                       max_bytes=4096, mpi=False, matmul_budget_s=mode.gemm_budget_s)
    results = work / "calibration.json"
    env_before = dict(os.environ)
    os.environ.update({} if mode.gpu else {"CUDA_VISIBLE_DEVICES": ""})
    try:
        code = measure(cfg, 1, results, mode.model, system_ref,
                       timeout_s=max(5.0, limit_s - 10), log=work / "calibration.log")
    finally:
        os.environ.clear()
        os.environ.update(env_before)
    if code != 0 or not results.exists():
        log = (work / "calibration.log").read_text(errors="replace") \
            if (work / "calibration.log").exists() else ""
        doc["error"] = first_error_line(log) or f"microbenchmark exit {code}"
        save(work, "calibrate", doc)
        return 1
    res = load_results(results)
    fit = fit_matmul(res.matmul, res.dtype)
    name = f"{Path(system_ref).stem}-gpucheck"
    mapping = calibrated_mapping(base_mapping(system_ref), res.provenance, {}, fit, name)
    out = write_system(mapping, work / f"{name}.yaml",
                       [f"System {name}: {provenance_line(res.provenance)}",
                        "GEMMs only (one GPU: no link measured); written by "
                        "scripts/gpu-check.sh (docs/gpu.md)."])
    doc.update(system_file=out.name, gemms=len(res.matmul), rate_flops=fit.rate,
               half_hidden=fit.half_hidden, rms_rel_residual=fit.rms_rel_residual,
               matmul_efficiency=mapping["efficiency"]["matmul"]["value"],
               widths=list(fit.widths), device=res.provenance.get("device"))
    save(work, "calibrate", doc)
    return 0


def fp8(mode: Mode, work: Path, limit_s: float) -> int:
    """flm bench --dtype fp8 (torchao's float8 linears) beside the same layout in bf16: the
    measured speed-up against the cost model's (costmodel/fp8.py). The tiny mode's CPU has no
    FP8 tensor cores: there the step checks that flm bench refuses fp8 in one line."""
    import importlib.util

    from frontier_llm.catalog import load_model, load_system
    from frontier_llm.costmodel import predict

    budget = Budget(limit_s)
    system_ref = _system(mode)
    doc: dict[str, Any] = {"step": "fp8", "system": system_ref, "model": mode.model, "runs": []}
    layout = layout_for(mode, FP8_MICRO_BATCH if mode.gpu else 1)
    fp8_layout = dataclasses.replace(layout, dtype="fp8")
    if not mode.gpu:
        rec = bench(mode, work, system_ref, fp8_layout, "gpucheck-fp8-refused", 1, 0,
                    min(mode.run_timeout_s, budget.left()), "fp8")
        refused = rec["exit_code"] == 2 and "FP8 tensor cores" in (rec.get("error") or "")
        doc["refusal"] = {"exit_code": rec["exit_code"], "error": rec.get("error"),
                          "as_expected": refused}
        if not refused:
            doc["error"] = f"flm bench --dtype fp8 on a CPU did not refuse: {rec.get('error')}"
        save(work, "fp8", doc)
        return 0 if refused else 1
    if importlib.util.find_spec("torchao") is None:
        doc["error"] = ("torchao is not installed: carry its wheel in gpu-wheels/ (torchao "
                        "matching the image's torch; docs/gpu.md)")
        save(work, "fp8", doc)
        return 1
    model, system = load_model(mode.model), load_system(system_ref)
    for lay, name in ((layout, "bf16"), (fp8_layout, "fp8")):
        rec = bench(mode, work, system_ref, lay, f"gpucheck-fp8-{name}", mode.mfu_steps,
                    mode.mfu_warmup, min(mode.run_timeout_s, budget.left()), "fp8")
        rec["predicted_step_time_s"] = predict(model, system, lay)["step_time_s"]
        doc["runs"].append(rec)
        save(work, "fp8", doc)
    base, f8 = doc["runs"]
    if base.get("step_time_s") and f8.get("step_time_s"):
        doc["speedup"] = {"measured": base["step_time_s"] / f8["step_time_s"],
                          "predicted": base["predicted_step_time_s"]
                          / f8["predicted_step_time_s"]}
    save(work, "fp8", doc)
    return 0 if all(r["status"] == RunStatus.COMPLETED for r in doc["runs"]) else 1


def attention(mode: Mode, work: Path, limit_s: float) -> int:
    """PyTorch SDPA's forward and backward at a context-parallel rank's call shapes
    (:attr:`Mode.attention_shapes`), beside the rates the cost model charges a native layout's
    attention (costmodel/attention_kernels.py ``priced_rates``: one rate whatever the shape).

    SDPA is held to the flash and memory-efficient backends, as torchtitan holds it under
    context parallelism. TorchTitan's cp 4 and cp 8 runs are slower per attention FLOP than its
    cp 1 and cp 2 runs, though every partial attention has one of these shapes (issue 51): what
    the shapes' own rates say is what this measures. Rates are in FlashAttention's count (the
    (query, key) pairs computed, causal halving a square; backward 2.5 times the forward)."""
    import torch

    from frontier_llm.catalog import load_model, load_system
    from frontier_llm.costmodel.attention_kernels import BACKWARD_WORK, priced_rates

    budget = Budget(limit_s)
    system_ref = _system(mode)
    fwd_rate, bwd_rate = priced_rates(load_model(mode.attention_model), load_system(system_ref),
                                      mode.dtype)
    doc: dict[str, Any] = {
        "step": "attention", "system": system_ref, "dtype": mode.dtype,
        "heads": mode.attention_heads, "head_dim": mode.attention_head_dim,
        "backends": ["flash", "efficient"], "model": mode.attention_model,
        "priced_tflops": {"forward": fwd_rate / 1e12, "backward": bwd_rate / 1e12},
        "shapes": [], "failures": []}
    device = "cuda" if mode.gpu else "cpu"
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[mode.dtype]
    for name, q_len, kv_len, causal in mode.attention_shapes:
        if budget.left() < 5:
            doc["failures"].append({"what": name, "error": "not run: the step's time is spent"})
            continue
        pairs = q_len * (q_len + 1) / 2 if causal else q_len * kv_len
        flops = 4.0 * pairs * mode.attention_heads * mode.attention_head_dim
        rec: dict[str, Any] = {"name": name, "q_len": q_len, "kv_len": kv_len,
                               "causal": causal, "forward_flops": flops}
        try:
            fwd_s, bwd_s = _time_sdpa(mode, device, dtype, q_len, kv_len, causal)
        except Exception as exc:  # an OOM or a refused shape is a finding, not the end
            rec["error"] = first_error_line(f"{type(exc).__name__}: {exc}")
            doc["failures"].append({"what": name, "error": rec["error"]})
        else:
            rec.update({
                "forward_s": fwd_s, "backward_s": bwd_s,
                "forward_tflops": flops / fwd_s / 1e12,
                "backward_tflops": BACKWARD_WORK * flops / bwd_s / 1e12})
            rec["forward_over_priced"] = rec["forward_tflops"] * 1e12 / fwd_rate
            rec["backward_over_priced"] = rec["backward_tflops"] * 1e12 / bwd_rate
        doc["shapes"].append(rec)
        save(work, "attention", doc)
    save(work, "attention", doc)
    return 0 if not doc["failures"] else 1


def _time_sdpa(mode: Mode, device: str, dtype, q_len: int, kv_len: int, causal: bool
               ) -> tuple[float, float]:
    """Median seconds of one SDPA forward and of its backward, over ``mode.attention_reps``
    timed calls after one warm-up (each call waited for: the kernels run milliseconds)."""
    import statistics

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    shape = (1, mode.attention_heads, q_len, mode.attention_head_dim)
    kv_shape = (1, mode.attention_heads, kv_len, mode.attention_head_dim)
    q = torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
    k = torch.randn(kv_shape, device=device, dtype=dtype, requires_grad=True)
    v = torch.randn(kv_shape, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn(shape, device=device, dtype=dtype)
    fwd, bwd = [], []
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
        for rep in range(mode.attention_reps + 1):
            sync()
            t0 = time.perf_counter()
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            sync()
            t1 = time.perf_counter()
            out.backward(grad)
            sync()
            t2 = time.perf_counter()
            if rep:  # the first call is the warm-up
                fwd.append(t1 - t0)
                bwd.append(t2 - t1)
            q.grad = k.grad = v.grad = None
    return statistics.median(fwd), statistics.median(bwd)


# The fp8 step's micro-batch on a GPU: gpt3-1.3b's GEMMs at 8 x 2048 tokens, as the mfu step's.
FP8_MICRO_BATCH = 8

STEPS = {"preflight": preflight, "mfu": mfu, "memory": memory, "calibrate": calibrate,
         "deepspeed": deepspeed, "attention": attention, "fp8": fp8}
