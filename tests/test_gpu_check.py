"""The GPU check (scripts/gpu-check.sh, frontier_llm/gpucheck) cannot rot between GPU runs: its
steps run here on the CPU in the tiny mode through the real script, the real ``flm bench``,
DeepSpeed and ``flm calibrate`` microbenchmark; without CUDA the GPU mode refuses in one line.

What cannot run here is CUDA itself: :func:`test_gpu_memory_figures_from_a_trace` gives
:func:`frontier_llm.gpucheck.steps.figures` a trace with the allocator's peaks filled in as a GPU
run writes them (bench/run.py), the one fake in this file.
"""

from __future__ import annotations

import configparser
import importlib.metadata as md
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from ds_cache import extension_dir

from frontier_llm.catalog import load_system
from frontier_llm.errors import UserError
from frontier_llm.gpucheck import modes, steps, summary, wheels

REPO = Path(__file__).resolve().parents[1]
CHECK = REPO / "scripts" / "gpu-check.sh"
NAME = re.compile(r"[A-Za-z0-9._-]+")


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    # This venv's python (FLM_PYTHON), no wheels to install (this environment has them all), and
    # the DeepSpeed op cache the DeepSpeed tests share (tests/ds_cache.py).
    return dict(os.environ, FLM_PYTHON=sys.executable, FLM_GPU_WHEELS=str(tmp_path / "none"),
                TORCH_EXTENSIONS_DIR=extension_dir(), OMP_NUM_THREADS="1", **extra)


@pytest.mark.skipif(_cuda(), reason="this machine has CUDA: the GPU mode would run")
def test_without_cuda_the_check_refuses_in_one_line(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(["bash", str(CHECK), str(out)], capture_output=True, text=True,
                          timeout=120, env=_env(tmp_path))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "needs a CUDA GPU" in lines[0] and "--tiny" in lines[0]
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert not out.exists()


def test_bad_usage_is_one_line(tmp_path):
    proc = subprocess.run(["bash", str(CHECK)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "usage: scripts/gpu-check.sh [--tiny] OUTDIR"


def test_tiny_mode_runs_every_step_through_the_script(tmp_path):
    """The whole check on this CPU: preflight, MFU, memory, calibration, DeepSpeed, summary."""
    out = tmp_path / "out"
    proc = subprocess.run(["bash", str(CHECK), "--tiny", str(out)], capture_output=True,
                          text=True, timeout=400, env=_env(tmp_path))
    doc = json.loads((out / "summary.json").read_text())
    assert proc.returncode == 0, (proc.stderr, doc["failures"])
    assert doc["failures"] == []
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= summary.MAX_FILES and all(NAME.fullmatch(f) for f in files), files
    assert {"summary.json", "summary.md", "traces.tar.gz", "calibration.json",
            "cpu-local-gpucheck.yaml", "check.log"} == set(files)

    # MFU: every micro-batch of the list ran; the best is the highest MFU, against the peak.
    runs = doc["mfu"]["runs"]
    assert [r["layout"]["micro_batch"] for r in runs] == list(modes.TINY.mfu_micro_batches)
    assert all(r["status"] == "completed" and r["mfu"] > 0 for r in runs)
    assert doc["mfu"]["best"]["mfu"] == max(r["mfu"] for r in runs)
    assert doc["mfu"]["peak_flops"] == load_system("cpu-local").peak("fp32")

    # Memory: each recompute mode; on a CPU bench measures states and saved activations, which
    # match the cost model's terms for tiny-gpt (docs/bench.md), so the ratio is about 1.
    mem = doc["memory"]
    assert sorted(r["layout"]["recompute"] for r in mem) == sorted(modes.RECOMPUTES)
    for r in mem:
        assert r["status"] == "completed"
        m = r["memory"]
        assert m["predicted_peak_bytes"] > 0 and m["predicted_breakdown_bytes"]["params"] > 0
        assert 0.9 < m["ratio_states_and_activations"] < 1.1, (r["run_id"], m)
        assert m["ratio_components"]["params"] == pytest.approx(1.0, abs=0.01)
    by_mode = {r["layout"]["recompute"]: r["memory"]["states_and_activations_bytes"]
               for r in mem}
    assert by_mode["full"] < by_mode["none"]  # full recompute keeps only the block inputs

    ds = doc["deepspeed"]
    assert ds["version"] == md.version("deepspeed")
    assert [r["status"] for r in ds["runs"]] == ["completed"] * len(modes.TINY.deepspeed_zero)

    # Attention: every shape timed, its rates beside the cost model's own (the CPU's figures say
    # nothing about a GPU's; the test checks the arithmetic and that each shape ran).
    att = doc["attention"]
    assert [r["name"] for r in att["shapes"]] == [n for n, *_ in modes.TINY.attention_shapes]
    from frontier_llm.catalog import load_model
    from frontier_llm.costmodel.attention_kernels import priced_rates

    fwd_rate, bwd_rate = priced_rates(load_model("tiny-llama"), load_system("cpu-local"), "fp32")
    assert att["priced_tflops"] == {"forward": fwd_rate / 1e12, "backward": bwd_rate / 1e12}
    for r in att["shapes"]:
        assert r["forward_s"] > 0 and r["backward_s"] > 0, r
        pairs = r["q_len"] * (r["q_len"] + 1) / 2 if r["causal"] else r["q_len"] * r["kv_len"]
        assert r["forward_flops"] == 4 * pairs * att["heads"] * att["head_dim"]
        assert r["backward_tflops"] == pytest.approx(2.5 * r["forward_flops"] / r["backward_s"]
                                                     / 1e12)
        assert r["forward_over_priced"] == pytest.approx(r["forward_tflops"] * 1e12 / fwd_rate)
    assert "ring-q-half-512" in (out / "summary.md").read_text()

    # Calibration: a fitted system file that the catalog loads, and the step-time error of the
    # built-in and the fitted system on every completed run.
    cal = doc["calibration"]
    fitted = load_system(str(out / cal["system_file"]))
    assert fitted.eff("matmul") == cal["matmul_efficiency"] and cal["rate_flops"] > 0
    err = doc["step_time_error"]
    assert len(err["runs"]) == len(runs) + len(mem) + len(ds["runs"])
    assert all(r["before_s"] > 0 and r["after_s"] > 0 for r in err["runs"])
    assert err["mape"]["before"] is not None and err["mape"]["after"] is not None

    # The traces are flm traces (flm collect ingests the unpacked folder).
    from frontier_llm.bench.trace import validate_trace

    with tarfile.open(out / "traces.tar.gz") as tar:
        members = [m for m in tar.getmembers() if m.isfile()]
        assert len(members) == len(err["runs"])
        for m in members:
            validate_trace(json.load(tar.extractfile(m)))
    text = (out / "summary.md").read_text()
    assert all(r["run_id"] in text for r in runs + mem)
    assert doc["environment"]["torch"] and doc["budget"]["used_s"] < doc["budget"]["total_limit_s"]


def test_a_killed_step_and_a_failed_run_are_recorded(tmp_path):
    """The summary of a check whose MFU step hit its limit and whose memory run ran out of
    memory: both listed with their first error line, the rest still summarized."""
    (tmp_path / "steps.tsv").write_text("preflight\t0\t40\t3\nmfu\t124\t110\t110\n"
                                        "memory\t1\t150\t20\n")
    steps.save(tmp_path, "memory", {"runs": [{
        "run_id": "gpucheck-mem-none-mb4", "status": "oom", "layout": {"micro_batch": 4},
        "error": "rank 0: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB"}]})
    doc = summary.build(modes.TINY, tmp_path, 470)
    errors = {(f["step"], f["what"]): f["error"] for f in doc["failures"]}
    assert errors[("mfu", "step")] == "killed at its time limit (110 s)"
    assert "OutOfMemoryError" in errors[("memory", "gpucheck-mem-none-mb4")]
    assert errors[("calibrate", "step")] == "not run (budget spent)"
    assert doc["budget"]["used_s"] == 133
    assert "killed at its time limit" in summary.markdown(doc)


def test_first_error_line_finds_the_error_not_the_traceback():
    out = ("[W] some warning\nTraceback (most recent call last):\n  File \"x.py\", line 1\n"
           "torch.OutOfMemoryError: CUDA out of memory.\nmore\n")
    assert steps.first_error_line(out) == "torch.OutOfMemoryError: CUDA out of memory."
    assert steps.first_error_line("just\nlines\n") == "lines"


def test_gpu_memory_figures_from_a_trace():
    """A GPU trace (allocator peaks set, as bench/run.py writes them under CUDA: faked here)."""
    trace = {"summary": {"step_time_s": 0.5, "mfu": 0.4, "hfu": 0.5}, "environment":
             {"device": "NVIDIA H100 80GB HBM3"}, "memory": [{
                 "params_bytes": 10, "grads_bytes": 20, "optimizer_bytes": 30,
                 "activations_peak_bytes": 40, "device_allocated_peak_bytes": 90 * 2**30,
                 "device_reserved_peak_bytes": 96 * 2**30}],
             "prediction": {"peak_memory_bytes": 100 * 2**30, "step_time_s": 0.4,
                            "breakdown": {"memory_bytes": {"reserved": 2 * 2**30}},
                            "memory_per_rank": [{"params_bytes": 10, "activations_bytes": 50}]}}
    m = steps.figures(trace)["memory"]
    assert m["ratio_reserved"] == 0.96
    assert m["ratio_allocated"] == round(90 / 98, 4)
    assert m["ratio_components"]["params"] == 1.0 and m["ratio_components"]["activations"] == 0.8
    assert "ratio_states_and_activations" not in m


def test_each_device_gets_its_single_gpu_system():
    assert modes.system_for(modes.GPU, "NVIDIA H100 80GB HBM3", {}) == "h100-sxm"
    assert modes.system_for(modes.GPU, "NVIDIA H200", {}) == "h200-sxm"
    assert modes.system_for(modes.TINY, "cpu", {}) == "cpu-local"
    assert modes.system_for(modes.GPU, "NVIDIA H100 NVL", {"FLM_GPU_SYSTEM": "x.yaml"}) == "x.yaml"
    for board in ("NVIDIA H100 NVL", "NVIDIA H100 PCIe", "NVIDIA H200 NVL", "NVIDIA A10"):
        with pytest.raises(UserError, match="FLM_GPU_SYSTEM"):
            modes.system_for(modes.GPU, board, {})


@pytest.mark.parametrize("name", ["h100-sxm", "h200-sxm"])
def test_single_gpu_systems_state_the_dense_peak(name):
    system = load_system(name)
    # The MFU denominator is the dense bf16 rate: the datasheets' 1,979 TFLOPS is with sparsity.
    assert system.peak("bf16") == 989e12 == load_system("dgx-h100").peak("bf16")
    assert system.gpus_per_node == 1
    assert "datasheet" in system.sources["peak_flops"]
    assert system.memory_bytes == {"h100-sxm": 80e9, "h200-sxm": 141e9}[name]


def _install_requires() -> list[str]:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    lines = [ln.split("#")[0].strip() for ln in
             cfg.get("options", "install_requires").splitlines()]
    return [ln for ln in lines if ln]


def _name(req: str) -> str:
    return wheels.norm(re.split(r"[\[<>=!~; (]", req, maxsplit=1)[0])


def _minimums() -> dict[str, tuple[int, ...]]:
    out = {}
    for req in _install_requires():
        low = re.search(r">=\s*([\d.]+)", req)
        out[_name(req)] = tuple(int(x) for x in low.group(1).split(".")) if low else ()
    return out


def _linux_deps(name: str, extras: tuple[str, ...] = ()) -> set[str]:
    """What ``name`` requires on Linux under Python 3.12 (with ``extras``)."""
    deps = set()
    for req in md.requires(name) or []:
        extra = re.search(r"extra == [\"']([\w-]+)", req)
        if (extra and extra.group(1) not in extras) or "win32" in req or "3.11" in req:
            continue
        deps.add(_name(req))
    return deps


def test_wheels_and_the_image_cover_every_requirement():
    carried = {wheels.norm(n): v for n, v, _ in wheels.WHEELS}
    have = set(carried) | wheels.IMAGE_PACKAGES
    needed = set(_minimums()) | {"deepspeed"}
    for req in _install_requires():  # psycopg[binary]: the extra's packages too
        extras = re.search(r"\[([\w,-]+)\]", req)
        if extras:
            needed |= _linux_deps(_name(req), tuple(extras.group(1).split(",")))
    assert needed - have == set()
    assert "torch" not in carried  # the check runs on the image's own torch
    for name, version in carried.items():
        low = _minimums().get(name, ())
        assert tuple(int(x) for x in version.split(".")[:len(low)]) >= low, name
        missing = _linux_deps(name) - have  # each carried wheel's own dependencies
        assert not missing, f"{name} needs {missing}"


def test_scripts_pass_shellcheck():
    for script in ("gpu-check.sh", "gpu-wheels.sh"):
        proc = subprocess.run(["shellcheck", "--shell=bash", "--severity=style",
                               str(REPO / "scripts" / script)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout
