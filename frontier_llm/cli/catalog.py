"""flm models, flm systems: list the built-in catalog."""

from __future__ import annotations

import argparse

import pandas as pd

from frontier_llm.catalog import load_model, load_system, model_names, system_names
from frontier_llm.cli.common import add_command, add_format, emit_frame
from frontier_llm.planner.allocation import gpu_rows_text, same_gpu_rows


def _human(n: int) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(n)


def models_frame() -> pd.DataFrame:
    rows = []
    for name in model_names():
        m = load_model(name)
        rows.append({
            "name": name, "params": _human(m.num_params()), "layers": m.layers,
            "hidden": m.hidden, "heads": m.heads, "kv_heads": m.kv_heads,
            "ffn_hidden": m.ffn_hidden, "activation": m.activation, "seq_len": m.seq_len,
            "vocab": m.vocab,
        })
    return pd.DataFrame(rows)


def systems_frame() -> pd.DataFrame:
    rows = []
    for name in system_names():
        s = load_system(name)
        rows.append({
            "name": name, "gpu": s.gpu, "gpus_per_node": s.gpus_per_node,
            "memory_gb": s.memory_bytes / 1e9,
            "peak_bf16_tflops": s.peak_flops.get("bf16", float("nan")) / 1e12,
            # FP8 and the microscaled formats (costmodel/fp8.py): NaN where the GPU has none.
            "peak_fp8_tflops": s.peak_flops.get("fp8", float("nan")) / 1e12,
            "peak_mxfp8_tflops": s.peak_flops.get("mxfp8", float("nan")) / 1e12,
            "peak_mxfp4_tflops": s.peak_flops.get("mxfp4", float("nan")) / 1e12,
            "matmul_eff": s.eff("matmul", float("nan")),
            "matmul_fp8_eff": (s.eff("matmul_fp8", s.eff("matmul", float("nan")))
                               if "fp8" in s.peak_flops else float("nan")),
            "node_gb_s": s.links["node"].bandwidth / 1e9,
            "nvlink_domain_gpus": s.scale_up_domain,
            "network_gb_s_per_gpu": s.links["network"].bandwidth / 1e9,
            "rests_on": s.rests_on,
            # The calibration rows measured on this GPU, which its intervals rest on
            # (planner/intervals.py reference_pool): Frontier's are LUMI-G's MI250X runs.
            "calibration_rows": gpu_rows_text(same_gpu_rows(s)),
            "sources": "; ".join(f"{k}: {v}" for k, v in s.sources.items()),
        })
    return pd.DataFrame(rows)


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "models", "list the catalog's models",
        "List the built-in models with their shapes and parameter counts. Any command that takes "
        "--model also takes a path to a model YAML file of the same form.",
        ["flm models", "flm models --format csv"],
    )
    add_format(p)
    p.set_defaults(func=lambda a: emit_frame(models_frame(), a.format))
    p = add_command(
        sub, "systems", "list the catalog's systems",
        "List the built-in systems: GPU, GPUs per node, memory, dense peaks (bf16, fp8 and the "
        "microscaled MXFP8/MXFP4 where the GPU has them), the achievable matmul fractions the "
        "cost model uses (bf16 and fp8), link bandwidths, the NVLink domain (GPUs a group can "
        "span at the node link's speed: 72 on a GB200 NVL72), a line saying what the figures "
        "rest on, the calibration rows measured on the GPU (which its error bars rest on) and "
        "their sources. Any command that takes --system also takes a path to a "
        "system YAML file.",
        ["flm systems", "flm systems --format json"],
    )
    add_format(p)
    p.set_defaults(func=lambda a: emit_frame(systems_frame(), a.format))
