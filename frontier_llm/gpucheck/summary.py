"""The check's results in OUTDIR: ``summary.json``, ``summary.md`` and the files behind them.

At most :data:`MAX_FILES` files, flat, named in letters, digits, '.', '_' and '-' only, so that
they can be copied back from a machine that returns only a few files (docs/gpu.md):

- ``summary.json`` / ``summary.md`` — device, driver, torch and CUDA versions, every figure,
  every failure with its first error line, the seconds each step took against its limit;
- ``traces.tar.gz`` — every ``flm bench`` trace (``tar xzf traces.tar.gz && flm collect traces``);
- ``calibration.json`` — the microbenchmark's results file (``flm calibrate fit`` reads it);
- ``<system>-gpucheck.yaml`` — the fitted system file;
- ``check.log`` — every run's output (its last MiB).
"""

from __future__ import annotations

import json
import re
import shutil
import tarfile
from pathlib import Path
from typing import Any

from frontier_llm.gpucheck.modes import Mode
from frontier_llm.specs.vocab import RunStatus

MAX_FILES = 8
LOG_TAIL_BYTES = 2**20
STEP_ORDER = ("preflight", "mfu", "memory", "calibrate", "deepspeed", "attention", "fp8")
SKIPPED = 125  # scripts/gpu-check.sh: a step the budget had no time left for
ERROR_LINE = re.compile(r"^\s*([\w.]*(Error|Exception|Interrupt)\b.*|flm bench: .*|.*error: .*)$")
DOES_NOT_FIT = "does-not-fit"  # a run left out because flm predict says it cannot fit


def _load(work: Path, step: str) -> dict | None:
    path = work / f"{step}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_steps_file(work: Path) -> dict[str, dict]:
    """``steps.tsv`` as the wrapper wrote it: ``name<TAB>exit code<TAB>limit s<TAB>used s``."""
    out = {}
    path = work / "steps.tsv"
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split("\t")
            if len(parts) == 4:
                out[parts[0]] = {"exit_code": int(parts[1]), "limit_s": float(parts[2]),
                                 "used_s": float(parts[3])}
    return out


def step_time_errors(runs: list[dict], base: str, fitted: str | None, model_ref: str,
                     work: Path) -> dict:
    """Predicted over measured step time, minus one, for every completed run: the built-in
    system (``base``) and the calibrated one (``fitted``, a file in ``work``)."""
    from frontier_llm.catalog import load_model, load_system
    from frontier_llm.costmodel import predict
    from frontier_llm.specs.layout import Layout

    model = load_model(model_ref)
    systems = {"before": load_system(base)}
    if fitted:
        systems["after"] = load_system(str(work / fitted))
    rows = []
    for run in runs:
        if run.get("status") != RunStatus.COMPLETED or not run.get("step_time_s"):
            continue
        layout = Layout.from_dict(run["layout"])
        row: dict[str, Any] = {"run_id": run["run_id"], "measured_s": run["step_time_s"]}
        for key, system in systems.items():
            pred = predict(model, system, layout)["step_time_s"]
            row[f"{key}_s"] = pred
            row[f"{key}_error"] = round(pred / run["step_time_s"] - 1, 4)
        rows.append(row)
    mape = {key: (round(sum(abs(r[f"{key}_error"]) for r in rows) / len(rows), 4) if rows
                  else None) for key in systems}
    return {"base_system": base, "fitted_system": fitted, "runs": rows, "mape": mape}


def build(mode: Mode, work: Path, total_limit_s: float | None = None) -> dict:
    """The summary document from the steps' results in ``work``."""
    steps = read_steps_file(work)
    docs = {s: _load(work, s) for s in STEP_ORDER}
    pre = docs["preflight"] or {}
    failures: list[dict] = []
    for name in STEP_ORDER:
        info = steps.get(name)
        doc = docs[name]
        if info and info["exit_code"] in (124, 137):  # timeout's TERM, then its KILL
            failures.append({"step": name, "what": "step",
                             "error": f"killed at its time limit ({info['limit_s']:.0f} s)"})
        elif info and info["exit_code"] == SKIPPED:
            failures.append({"step": name, "what": "step",
                             "error": "not run: the budget was spent before it"})
        elif info and info["exit_code"] not in (0, 1):
            failures.append({"step": name, "what": "step",
                             "error": _log_error(work, name) or f"exit {info['exit_code']}"})
        if info is None and doc is None:
            failures.append({"step": name, "what": "step", "error": "not run (budget spent)"})
        if doc is None:
            continue
        for f in doc.get("failures", []):
            failures.append({"step": name, **f})
        if doc.get("error"):
            failures.append({"step": name, "what": name, "error": doc["error"]})
        for run in doc.get("runs", []):
            # A micro-batch the cost model says cannot fit is left out on purpose.
            if run.get("status") not in (RunStatus.COMPLETED, DOES_NOT_FIT):
                failures.append({"step": name, "what": run["run_id"],
                                 "status": run.get("status"), "error": run.get("error")})
    runs = [r for s in ("mfu", "memory", "deepspeed") for r in (docs[s] or {}).get("runs", [])]
    cal = docs["calibrate"] or {}
    system = (docs["mfu"] or {}).get("system") or pre.get("system")
    errors = None
    if system:
        try:
            errors = step_time_errors(runs, system, cal.get("system_file"), mode.model, work)
        except Exception as exc:
            failures.append({"step": "summarize", "what": "step-time errors",
                             "error": f"{type(exc).__name__}: {exc}"})
    mfu_doc = docs["mfu"] or {}
    best = next((r for r in mfu_doc.get("runs", []) if r["run_id"] == mfu_doc.get("best")), None)
    return {
        "schema": "flm-gpucheck/1",
        "mode": mode.name,
        "model": mode.model,
        "dtype": mode.dtype,
        "system": system,
        "environment": pre.get("environment"),
        "packages": pre.get("packages"),
        "budget": {"total_limit_s": total_limit_s, "steps": steps,
                   "used_s": round(sum(s["used_s"] for s in steps.values()), 1)},
        "mfu": {"peak_flops": mfu_doc.get("peak_flops"), "best": best and {
            k: best.get(k) for k in ("run_id", "step_time_s", "tokens_per_s", "mfu", "hfu",
                                     "model_tflops_per_gpu", "hardware_tflops_per_gpu")},
                "runs": mfu_doc.get("runs", [])},
        "memory": (docs["memory"] or {}).get("runs", []),
        "deepspeed": {"version": (docs["deepspeed"] or {}).get("deepspeed"),
                      "runs": (docs["deepspeed"] or {}).get("runs", [])},
        "calibration": cal,
        # SDPA at a context-parallel rank's shapes beside the cost model's rates (steps.py).
        "attention": {k: (docs["attention"] or {}).get(k) for k in (
            "dtype", "heads", "head_dim", "backends", "priced_tflops", "shapes")},
        # flm bench --dtype fp8 beside bf16 (steps.py fp8): the speed-up measured and predicted.
        "fp8": {k: (docs["fp8"] or {}).get(k) for k in ("runs", "speedup", "refusal")},
        "step_time_error": errors,
        "failures": failures,
    }


def first_error_line(text: str) -> str:
    """The line that names the error in a run's output: the first ``XxxError: ...`` or
    ``flm bench: ...`` line, else the last non-empty line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for line in lines:
        if ERROR_LINE.match(line) and not line.startswith("Traceback"):
            return line[:500]
    return lines[-1][:500] if lines else ""


def _log_error(work: Path, step: str) -> str | None:
    path = work / f"{step}.log"
    return first_error_line(path.read_text(errors="replace")) if path.exists() else None


def _gib(x) -> str:
    return "–" if x is None else f"{x / 2**30:.2f}"


def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.1f} %"


def _num(x, fmt: str = "{:.3f}") -> str:
    return "–" if x is None else fmt.format(x)


def _ms(seconds):
    return None if seconds is None else 1e3 * seconds


def markdown(doc: dict) -> str:
    """summary.md: the same figures as summary.json, as tables."""
    env = doc.get("environment") or {}
    lines = [f"# flm GPU check ({doc['mode']} mode)", "",
             f"- device: {env.get('device')} ({_gib(env.get('device_memory_bytes'))} GiB), "
             f"driver {env.get('driver')}, torch {env.get('torch')}, CUDA "
             f"{env.get('cuda_runtime')}, Python {env.get('python')}, host {env.get('host')}",
             f"- model {doc['model']}, {doc['dtype']}, system {doc['system']} (dense peak "
             f"{_num((doc['mfu'].get('peak_flops') or 0) / 1e12, '{:.1f}')} TFLOP/s)",
             f"- wall time: {doc['budget']['used_s']} s of {doc['budget']['total_limit_s']} s",
             "", "## MFU (flm bench native, one GPU, flash attention)", "",
             "| run | status | micro-batch | step s | tokens/s | MFU | HFU | predicted step s |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in doc["mfu"]["runs"]:
        lines.append(f"| {r['run_id']} | {r['status']} | {r['layout'].get('micro_batch')} | "
                     f"{_num(r.get('step_time_s'))} | {_num(r.get('tokens_per_s'), '{:.0f}')} | "
                     f"{_pct(r.get('mfu'))} | {_pct(r.get('hfu'))} | "
                     f"{_num(r.get('predicted_step_time_s'))} |")
    best = doc["mfu"].get("best")
    lines += ["", f"Best: {best['run_id']}, MFU {_pct(best['mfu'])}, HFU {_pct(best['hfu'])}."
              if best else "Best: none completed."]
    lines += ["", "## Memory: measured against flm predict", "",
              "| run | status | recompute | mb | allocated GiB | reserved GiB | predicted GiB "
              "| reserved / predicted | allocated / (predicted − reserve) "
              "| on a CPU: states + activations / predicted |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in doc["memory"] + doc["deepspeed"]["runs"]:
        m = r.get("memory") or {}
        lay = r.get("layout") or {}
        lines.append(f"| {r['run_id']} | {r['status']} | {lay.get('recompute')} | "
                     f"{lay.get('micro_batch')} | {_gib(m.get('allocated_peak_bytes'))} | "
                     f"{_gib(m.get('reserved_peak_bytes'))} | "
                     f"{_gib(m.get('predicted_peak_bytes'))} | "
                     f"{_num(m.get('ratio_reserved'))} | {_num(m.get('ratio_allocated'))} | "
                     f"{_num(m.get('ratio_states_and_activations'))} |")
    cal = doc.get("calibration") or {}
    lines += ["", "## Calibration (flm calibrate GEMMs on this device)", ""]
    if cal.get("system_file"):
        lines.append(f"{cal['gemms']} GEMMs at widths {cal['widths']}: matrix rate "
                     f"{cal['rate_flops'] / 1e12:.1f} TFLOP/s (efficiency "
                     f"{cal['matmul_efficiency']:.3f} of peak), half-rate width "
                     f"{cal['half_hidden']:.0f}, residual rms {_pct(cal['rms_rel_residual'])}; "
                     f"system file {cal['system_file']}.")
    else:
        lines.append(f"not fitted: {cal.get('error', 'not run')}")
    err = doc.get("step_time_error")
    if err:
        lines += ["", "## Step-time error of the cost model (predicted / measured − 1)", "",
                  "| run | measured s | built-in | fitted |", "|---|---:|---:|---:|"]
        for r in err["runs"]:
            lines.append(f"| {r['run_id']} | {r['measured_s']:.3f} | {_pct(r.get('before_error'))}"
                         f" | {_pct(r.get('after_error'))} |")
        lines.append(f"| **MAPE** | | {_pct(err['mape'].get('before'))} | "
                     f"{_pct(err['mape'].get('after'))} |")
    att = doc.get("attention") or {}
    lines += ["", "## Attention (PyTorch SDPA, flash or memory-efficient) at a context-parallel "
              "rank's shapes", ""]
    if att.get("shapes"):
        priced = att["priced_tflops"]
        lines += [f"{att['heads']} heads of {att['head_dim']}, {att['dtype']}; TFLOP/s in "
                  "FlashAttention's count. The cost model charges a native layout "
                  f"{priced['forward']:.3g} forward and {priced['backward']:.3g} backward "
                  "whatever the shape.", "",
                  "| shape | queries | keys | causal | forward ms | backward ms | forward TFLOP/s "
                  "| backward TFLOP/s | forward / priced | backward / priced |",
                  "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
        for r in att["shapes"]:
            lines.append(f"| {r['name']} | {r['q_len']} | {r['kv_len']} | {r['causal']} | "
                         f"{_num(_ms(r.get('forward_s')), '{:.2f}')} | "
                         f"{_num(_ms(r.get('backward_s')), '{:.2f}')} | "
                         f"{_num(r.get('forward_tflops'), '{:.3g}')} | "
                         f"{_num(r.get('backward_tflops'), '{:.3g}')} | "
                         f"{_num(r.get('forward_over_priced'))} | "
                         f"{_num(r.get('backward_over_priced'))} |")
    else:
        lines.append("not measured (see the failures)")
    f8 = doc.get("fp8") or {}
    lines += ["", "## FP8 (flm bench --dtype fp8, torchao float8, beside bf16)", ""]
    if f8.get("speedup"):
        lines.append(f"speed-up measured {f8['speedup']['measured']:.3f}, predicted "
                     f"{f8['speedup']['predicted']:.3f}")
    elif f8.get("refusal"):
        lines.append(f"refused on this CPU as expected: {f8['refusal'].get('as_expected')} "
                     f"({f8['refusal'].get('error')})")
    else:
        lines.append("not measured (see the failures)")
    lines += ["", "## Failures", ""]
    lines += [f"- {f['step']}: {f.get('what')}: {f.get('error')}" for f in doc["failures"]] \
        or ["none"]
    return "\n".join(lines) + "\n"


def write(mode: Mode, work: Path, out: Path, total_limit_s: float | None = None) -> list[Path]:
    """Write OUTDIR (at most MAX_FILES files); returns their paths."""
    from frontier_llm.bench.trace import write_json_atomic

    out.mkdir(parents=True, exist_ok=True)
    doc = build(mode, work, total_limit_s)
    files = [write_json_atomic(out / "summary.json", doc)]
    md = out / "summary.md"
    md.write_text(markdown(doc))
    files.append(md)
    traces = sorted((work / "traces").glob("*.trace.json")) if (work / "traces").exists() else []
    if traces:
        with tarfile.open(out / "traces.tar.gz", "w:gz") as tar:
            for t in traces:
                tar.add(t, arcname=f"traces/{t.name}")
        files.append(out / "traces.tar.gz")
    cal = doc.get("calibration") or {}
    for name in ("calibration.json", cal.get("system_file")):
        if name and (work / name).exists():
            files.append(Path(shutil.copyfile(work / name, out / name)))
    log = work / "check.log"
    if log.exists():
        with open(log, "rb") as fh:
            fh.seek(max(0, log.stat().st_size - LOG_TAIL_BYTES))
            (out / "check.log").write_bytes(fh.read())
        files.append(out / "check.log")
    assert len(files) <= MAX_FILES, files  # what the device tool copies back
    return files
