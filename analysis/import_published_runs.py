"""Bring ``../shared/data/published_runs_a.csv`` and ``published_runs_b.csv`` into the calibration
corpus as ``frontier_llm/planner/data/calibration_runs_published.csv``.

Every released row is kept, once, in the columns of ``calibration_runs_sharded.csv`` plus:

- ``origin``: the shared file and row it came from;
- ``derived``: each cell not read verbatim in the source and how it was obtained (a rate turned
  into a step time, an architecture another table of the same paper states, a catalog system
  for a GPU the row names by its family);
- ``unused``: empty for a row the model is judged on; else why not (a duplicate of a row already
  in the corpus, a layout or architecture the source does not state, a precision the bf16
  corpus does not cover). ``planner/calibration.py`` predicts no row that has a reason here.

The rules below are per source (one paper, repository or blog), never per number: a cell is
filled only from the same source's own words (the row's ``notes``), as the README of the shared
data asks. Run from the repository root:

    python analysis/import_published_runs.py    # rewrites the CSV (deterministic)
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
OUT = ROOT / "frontier_llm" / "planner" / "data" / "calibration_runs_published.csv"
COLUMNS = list(pd.read_csv(ROOT / "frontier_llm" / "planner" / "data"
                           / "calibration_runs_sharded.csv", nrows=0).columns)
EXTRA = ["system_hint", "samples_per_s", "metric", "origin", "derived", "unused"]

# Narayanan et al. 2021, Table 1: the shapes its Table 2 names only by parameter count.
NARAYANAN_SHAPES = {174.6: (96, 12288, 96), 529.6: (105, 20480, 128)}
EQ3 = ("hardware TFLOP/s as the paper counts them (eq. 3: 96·B·s·l·h², the recomputed "
       "forward included)")
# "104.70 s/iter", "60.1 s/iteration": a step time stated in a row's notes.
_SECONDS = re.compile(r"(\d+(?:\.\d+)?)\s*s/iter")
FP8 = "Float8 training: this corpus is bf16/fp16 (fp8 rows belong in calibration_runs_fp8.csv)"


def _given(value) -> bool:
    return not (value is None or (isinstance(value, float) and math.isnan(value)) or value == "")


def _row(raw: pd.Series, origin: str) -> dict:
    out = {c: raw.get(c) for c in COLUMNS if c in raw.index}
    out.update(origin=origin, derived=[], unused="", confidence="high")
    for c in ("system_hint", "samples_per_s", "metric", "engine"):
        if c in raw.index:
            out[c] = raw[c]
    return out


def _step_from_samples(out: dict) -> None:
    """A samples/s figure over a stated global batch: the step time (what the model predicts)."""
    if _given(out.get("samples_per_s")) and _given(out.get("global_batch")) \
            and not _given(out.get("iteration_time_s")):
        out["iteration_time_s"] = round(float(out["global_batch"]) / float(out["samples_per_s"]),
                                        3)
        out["derived"].append("iteration_time_s = global_batch / samples_per_s")


def _narayanan(out: dict, i: int) -> None:
    out["engine"] = "Megatron-LM (PTD-P)"
    out["flops_kind"] = EQ3
    if "Table1" in out["source"]:
        # The row's own cell: the paper's FLOP count includes the recomputed forward, which it
        # runs in every Table 1 configuration.
        out["act_recompute"] = "full (stated: eq. 3 counts the recomputed forward)"
        return
    params = float(out["params_b"])
    if not _given(out.get("layers")):
        out["layers"], out["hidden"], out["heads"] = NARAYANAN_SHAPES[params]
        out["derived"].append("layers, hidden, heads: the paper's Table 1 shape of this size")
    if "ZeRO-3" in str(out["notes"]):
        out["engine"] = "DeepSpeed ZeRO-3 (no model parallelism)"
        if params == 174.6:
            out["unused"] = "duplicate of calibration_runs.csv (Narayanan Table 2 ZeRO-3 rows)"
    elif not _given(out.get("tp")):
        out["dp"] = int(out["num_gpus"]) // 96
        out["derived"].append("dp = num_gpus / 96 (the stated model-parallel size); the tp/pp "
                              "split is searched")


def _korthikanti(out: dict, i: int) -> None:
    out["unused"] = ("global batch not stated: a 35-stage pipeline's bubble (and so its MFU) "
                     "depends on it")
    out["confidence"] = "low"


def _bloom(out: dict, i: int) -> None:
    out["engine"] = "Megatron-DeepSpeed (BigScience fork: BF16_Optimizer, ZeRO-1)"
    out["flops_kind"] = "hardware TFLOP/s (Megatron-DeepSpeed's count, recompute included)"
    out["act_recompute"] = "full (stated: activation checkpointing)"
    # Jean Zay is no DGX: its nodes reach each other through 4 Omni-Path links (the tr11
    # README's Hardware section: "8 GPUs per node Using NVLink 4 inter-gpu connects, 4
    # OmniPath links"; "Inter-node connect: Omni-Path Architecture (OPA)"), 100 Gbit/s each
    # (OPA 100 series), a quarter of a DGX A100's eight 200 Gbit/s HDR ports.
    out["gpu_type"] = "A100 80GB (Jean Zay: 4 x 100 Gbps Omni-Path, 400 Gbps inter-node)"
    out["derived"].append("gpu_type's network: the tr11 README's 4 OmniPath links per node, "
                          "100 Gbit/s each (Omni-Path Architecture 100 series)")
    seconds = _SECONDS.search(str(out["notes"]))
    if seconds:
        out["iteration_time_s"] = float(seconds.group(1))
        out["derived"].append("iteration_time_s: the logged s/iter in notes")


def _opt(out: dict, i: int) -> None:
    out["unused"] = "vocab and pipeline degree not stated"
    out["engine"] = "metaseq FSDP + Megatron TP, fp16"


def _mtnlg(out: dict, i: int) -> None:
    # The paper states the precision (§2, its hardware paragraph): "Model training is done with
    # mixed precision using 16-bit bfloat16 on NVIDIA's Selene supercomputer" (the shared row's
    # notes, a summary, leave it out).
    out["engine"] = "Megatron-DeepSpeed (ZeRO-powered DP, stage not stated), bf16"
    out["derived"].append("engine's bf16: the paper's hardware paragraph, 'Model training is "
                          "done with mixed precision using 16-bit bfloat16'")
    out["vocab"] = 51200
    out["derived"].append("vocab 51200: the GPT-2 BPE padded as Narayanan's and Korthikanti's "
                          "rows of this shape (under 1 % of the FLOPs)")
    out["iteration_time_s"] = float(_SECONDS.search(str(out["notes"])).group(1))
    out["derived"].append("iteration_time_s: the s/iteration in notes")
    # 126 TFLOP/s at 60.1 s is 8·P·tokens / (GPUs·time) (124): the count with a recomputed
    # forward, 6·P·tokens giving 93. A 35-stage 1F1B pipeline without recompute would also
    # hold 35 micro-batches of 3 layers' activations (~0.9 GB each at TP 8) on its first rank.
    flops = 8 * float(out["params_b"]) * 1e9 * float(out["global_batch"]) * float(
        out["seq_len"]) / (float(out["num_gpus"]) * out["iteration_time_s"]) / 1e12
    out["act_recompute"] = "full (derived from the stated TFLOP/s)"
    out["derived"].append(f"act_recompute full: the stated {out['tflops_per_gpu']:g} TFLOP/s "
                          f"is 8·P·tokens/time ({flops:.0f}), the count with a recomputed "
                          "forward")
    out["confidence"] = "medium"


def _mlperf(out: dict, i: int) -> None:
    out["unused"] = "FP8 (TransformerEngine) and the architecture not stated"


def _torchtitan(out: dict, i: int) -> None:
    notes = str(out["notes"])
    out["engine"] = "TorchTitan FSDP2" + (", torch.compile" if "compile" in notes else ", eager")
    out["zero_stage"] = "FSDP2 (full sharding)"
    out["memory_kind"] = "reserved peak (GiB, the allocator's peak as torchtitan logs it)"
    out["notes"] = notes + "; kv_heads 8, ffn 14336, SwiGLU" if "8B" in str(out["model"]) \
        else notes
    if "Float8" in notes:
        out["unused"] = FP8
        return
    if "Table 1; FSDP;" in notes:
        out["unused"] = "duplicate of calibration_runs.csv (TorchTitan Table 1, eager)"
    if not _given(out.get("seq_len")):
        out["seq_len"] = 8192
        out["derived"].append("seq_len 8192: torchtitan's train_configs default (as "
                              "calibration_runs.csv's Table 1 row)")
    out["vocab"] = 128256
    out["derived"].append("vocab 128256: Llama 3's tokenizer (torchtitan llama3 configs)")


def _dash(out: dict, i: int) -> None:
    out["unused"] = "the abstract states no architecture or layout of the measured run"


def _lumi(out: dict, i: int) -> None:
    engine = str(out.get("engine"))
    if "GPT-NeoX" in str(out["model"]):
        out["engine"] = "GPT-NeoX (DeepSpeed ZeRO-1), fp16"
    elif engine == "megatron":
        out["engine"] = "Megatron-LM (BigCode fork), multi-query attention"
        out["confidence"] = "medium"
    else:
        out["engine"] = "Megatron-DeepSpeed (BigScience fork: BF16_Optimizer, ZeRO-1), bf16"
    out["flops_kind"] = "hardware TFLOP/s (Megatron-DeepSpeed's count, recompute included)"
    if not _given(out.get("global_batch")):
        out["unused"] = "global batch not stated"
    _step_from_samples(out)


def _crusher(out: dict, i: int) -> None:
    out["engine"] = "Megatron-DeepSpeed (ORNL fork), fp16, flash-attn"
    out["confidence"] = "low"
    out["derived"].append("confidence low: fp16 overflow (optimizer steps likely skipped), "
                          "iterations 195-280 s, not peer reviewed")


def _megascale(out: dict, i: int) -> None:
    out["engine"] = "Megatron-LM (commit 285068c8), interleaved 1F1B, 6 stages per rank"
    out["gpu_type"] = "A100 (stated: NVIDIA Ampere GPUs, MFU on a 312 TFLOP/s peak)"
    out["derived"].append("gpu_type A100: the Ampere part whose 312 TFLOP/s peak the stated "
                          "MFU implies; iteration_time_s = batch·seq / the stated tokens/s")
    out["confidence"] = "medium"


def _llama3(out: dict, i: int) -> None:
    out["unused"] = ("126 layers over 16 stages (Meta's uneven split: one layer fewer on the "
                     "first and last) and micro-batch, recompute unstated")


RULES = {"Narayanan2021-SC21": _narayanan, "Korthikanti2022": _korthikanti,
         "BigScience": _bloom, "Zhang2022-OPT": _opt, "Smith2022-MTNLG": _mtnlg,
         "MLPerf-Training-v3.1": _mlperf, "TorchTitan": _torchtitan,
         "Dash2023-Frontier": _dash, "spyysalo/lumi-llm-scaling": _lumi,
         "sajal-vt/Megatron-DeepSpeed-ORNL": _crusher, "Jiang2024-MegaScale": _megascale,
         "Llama": _llama3}


def imported() -> pd.DataFrame:
    rows = []
    for name in ("published_runs_a.csv", "published_runs_b.csv"):
        raw = pd.read_csv(SHARED / name)
        for i, r in raw.iterrows():
            out = _row(r, f"{name}:{i}")
            key = str(r["source"]).split()[0]
            RULES[key](out, i)
            out["derived"] = "; ".join(out["derived"])
            rows.append(out)
    frame = pd.DataFrame(rows)
    return frame[[c for c in COLUMNS + EXTRA if c in frame.columns]]


def main() -> None:
    frame = imported()
    frame.to_csv(OUT, index=False)
    used = frame["unused"].fillna("") == ""
    print(f"wrote {OUT.relative_to(ROOT)}: {len(frame)} rows, {int(used.sum())} used")


if __name__ == "__main__":
    main()
