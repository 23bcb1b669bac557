"""Predict published training runs (../shared/data/calibration_runs.csv) and measure the error.

Protocol (docs/costmodel.md, "Calibration"): each row becomes a model (GPT-style: GeLU 4h MLP,
learned positions, tied embeddings, Megatron's 0.1 dropout; Llama-style where its notes name
SwiGLU, with the KV heads and MLP width they state), the catalog system for its GPU, the engine
its source ran (:func:`row_engine`) and a search space pinned to every knob the row states. Knobs
the row leaves empty (micro-batch, recompute, schedule, ZeRO stage, flash attention, and for some
rows TP/PP/DP) are searched over what that engine offers, and the fastest layout that fits is the
prediction, as the authors tuned theirs. The figure compared is the iteration time where the row
gives it, else TFLOP/s per GPU (hardware FLOPs where the notes say the source counts them), else
tokens/s per GPU, else the percentage of peak; a stated peak memory is compared beside it. No row
is treated specially: the same function runs on rows the model has never seen.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from frontier_llm.catalog import load_system
from frontier_llm.errors import UserError
from frontier_llm.planner.plan import plan
from frontier_llm.planner.space import SearchSpace
from frontier_llm.specs.engine_rules import rules_for
from frontier_llm.specs.forms import label
from frontier_llm.specs.layout import Engine, Schedule, parse_schedule_label, zero_preset
from frontier_llm.specs.model import ModelSpec
from frontier_llm.specs.system import SystemSpec

# "interleaved pipeline with 3 stages per rank": the interleaving depth a row's notes state.
_STAGES_PER_RANK = re.compile(r"(\d+)\s+(?:virtual\s+)?stages\s+per\s+rank", re.IGNORECASE)
# First match wins: the 500 W, HBM2e H100 of Meta's Grand Teton hosts is a system of its own.
GPU_SYSTEMS = {"hbm2e": "grand-teton-h100", "a100": "dgx-a100", "h100": "dgx-h100",
               "mi250x": "frontier"}
_KV_HEADS = re.compile(r"kv_heads\s+(\d+)", re.IGNORECASE)
_FFN = re.compile(r"\bffn\s+(\d+)", re.IGNORECASE)
_ZERO = re.compile(r"^\s*(\d)")
_YEAR = re.compile(r"((?:19|20)\d\d)")
# Flash attention (Dao et al., arXiv 2205.14135, May 2022): a source dated before it ran the
# unfused attention kernel.
FLASH_ATTENTION_YEAR = 2022


def row_engine(row: pd.Series) -> str:
    """The engine a row's source ran, read from its source and notes (first match wins):
    DeepSpeed named -> ``deepspeed``; FSDP2 or TorchTitan named -> ``native`` (PyTorch's own
    FSDP2); anything else (Megatron-LM's papers and README) -> ``megatron``."""
    text = f"{row.get('source', '')} {row.get('notes', '')}".lower()
    if "deepspeed" in text:
        return "deepspeed"
    if "fsdp2" in text or "torchtitan" in text:
        return "native"
    return "megatron"


def row_zero_stage(row: pd.Series) -> int | None:
    """The ZeRO stage a row states: a leading digit, or 3 for FSDP's full sharding."""
    if not _given(row.get("zero_stage")):
        return None
    text = str(row["zero_stage"])
    match = _ZERO.match(text)
    if match:
        return int(match.group(1))
    if "full shard" in text.lower():
        return 3
    raise UserError(f"zero_stage {text!r}: not a ZeRO stage")


def _given(value) -> bool:
    return not (value is None or (isinstance(value, float) and math.isnan(value)) or value == "")


def load_runs(path: str | Path) -> pd.DataFrame:
    try:
        return pd.read_csv(path)
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None


def row_model(row: pd.Series) -> ModelSpec:
    shape = dict(name=str(row["model"]), layers=int(row["layers"]), hidden=int(row["hidden"]),
                 heads=int(row["heads"]), seq_len=int(row["seq_len"]), vocab=int(row["vocab"]))
    notes = str(row.get("notes") or "")
    if "swiglu" in notes.lower():
        # Llama style (the catalog's llama3 models): the notes state what differs from a GPT.
        kv, ffn = _KV_HEADS.search(notes), _FFN.search(notes)
        return ModelSpec(**shape, kv_heads=int(kv.group(1)) if kv else None,
                         ffn_hidden=int(ffn.group(1)) if ffn else None, activation="swiglu",
                         norm="rmsnorm", position="rope", bias=False, tied_embeddings=False,
                         dropout=0.0)
    return ModelSpec(**shape, tied_embeddings=True, dropout=0.1)


def row_system(row: pd.Series, systems: dict[str, SystemSpec] | None = None) -> SystemSpec:
    gpu = str(row["gpu_type"]).lower()
    for key, name in GPU_SYSTEMS.items():
        if key in gpu:
            return (systems or {}).get(name) or load_system(name)
    raise UserError(f"no catalog system for GPU type {row['gpu_type']!r}")


def row_space(row: pd.Series) -> SearchSpace:
    """Pin what the row states; leave the rest to the search."""
    def pinned(col):
        return (int(row[col]),) if _given(row.get(col)) else None

    kw: dict = {"tp": pinned("tp"), "pp": pinned("pp"), "micro_batch": pinned("micro_batch")}
    # The published runs state their layouts without context parallelism (the table has no cp
    # column; none of its sources split sequences), so none is searched for them.
    kw["cp"] = (1,)
    engine = rules_for(row_engine(row))
    year = _YEAR.search(str(row.get("source") or ""))
    if year and int(year.group(1)) < FLASH_ATTENTION_YEAR:
        kw["flash_attention"] = (False,)
    recompute = str(row.get("act_recompute") or "")
    if _given(row.get("act_recompute")):
        if recompute.startswith("full"):
            kw["recompute"] = ("full",)
            kw["flash_attention"] = (False,)
        elif recompute.startswith("selective") and engine.engine == Engine.NATIVE:
            # PyTorch-native "selective" is torchtitan's op-level selective checkpointing
            # (its llama3_8b.toml: mode 'selective', selective_ac_option 'op'), over SDPA,
            # whose default kernel is flash attention.
            kw["recompute"] = ("selective-op",)
        elif recompute.startswith("selective"):
            # Megatron's selective recomputation (Korthikanti et al. 2022 §4.2) exists to drop
            # the unfused attention core's scores; a run that states it ran the unfused kernel.
            kw["recompute"] = ("selective",)
            kw["flash_attention"] = (False,)
        if "sequence parallel" in recompute:
            kw["sequence_parallel"] = (True,)
    notes = str(row.get("notes") or "")
    if "interleaved" in notes:
        depth = _STAGES_PER_RANK.search(notes)
        # "interleaved, 4 stages per rank" is the schedule interleaved:4; without a depth the
        # planner tries every one.
        text = f"interleaved:{depth.group(1)}" if depth else "interleaved"
        kw.update({k: (v,) for k, v in parse_schedule_label(text).items()
                   if depth or k == "schedule"})
    # The search covers what the sources' framework offers: Megatron-LM shards nothing or the
    # optimizer states (its distributed optimizer, ZeRO-1), and schedules pipelines with 1F1B or
    # interleaved 1F1B (Megatron-DeepSpeed's pipelines likewise take ZeRO-0/1 only).
    stage = row_zero_stage(row)
    kw["sharding"] = ((zero_preset(stage),) if stage is not None else
                      tuple(s for s in (zero_preset(0), zero_preset(1))
                            if engine.runs_sharding(s)))
    kw.setdefault("schedule", tuple(str(s) for s in engine.schedules
                                    if s != Schedule.GPIPE))
    kw.setdefault("flash_attention", (False, True))
    if not engine.sequence_parallel:
        kw["sequence_parallel"] = (False,)
    kw["engine"] = (str(engine.engine),)
    return SearchSpace(**kw)


def predict_row(row: pd.Series, systems: dict[str, SystemSpec] | None = None) -> dict:
    """The best layout's figures for one published row, beside the published figure."""
    model, system = row_model(row), row_system(row, systems)
    result = plan(model, system, int(row["num_gpus"]), int(row["global_batch"]), row_space(row))
    # A published run ran: when none of its layouts is predicted to fit, the fastest is
    # predicted anyway (after those that fit) and the table says it was predicted not to fit.
    order = result.ranked_indices(fits_only=False)
    if _given(row.get("dp")):
        order = order[result.layouts.dp[order] == int(row["dp"])]
    if not len(order):
        return {"metric": None, "measured": None, "predicted": None, "error": math.nan,
                "layout": "no layout fits", "engine": row_engine(row)}
    best = int(order[0])
    fig = {k: float(v[best]) for k, v in result.figures.items()}
    counted = None  # which FLOPs a TFLOP/s figure counts
    if _given(row.get("iteration_time_s")):
        metric, measured, predicted = "iteration_time_s", row["iteration_time_s"], fig[
            "step_time_s"]
    elif _given(row.get("tflops_per_gpu")):
        counted = "hardware" if "hardware tflop" in str(row.get("notes") or "").lower() \
            else "model"
        metric, measured, predicted = ("tflops_per_gpu", row["tflops_per_gpu"],
                                       fig[f"{counted}_tflops_per_gpu"])
    elif _given(row.get("tokens_per_s_per_gpu")):
        metric, measured, predicted = ("tokens_per_s_per_gpu", row["tokens_per_s_per_gpu"],
                                       fig["tokens_per_s"] / int(row["num_gpus"]))
    else:
        metric, measured, predicted = "pct_peak", row["pct_peak"], 100 * fig["mfu"]
    cfg = result.layout(best)
    memory = {}
    if _given(row.get("memory_gb")):
        # memory_gb is GiB of the allocator's peak reserved (the README): what peak_memory_bytes
        # predicts.
        got = fig["peak_memory_bytes"] / 2**30
        memory = {"memory_gib": float(row["memory_gb"]), "memory_predicted_gib": got,
                  "memory_error": (got - float(row["memory_gb"])) / float(row["memory_gb"])}
    return {
        "metric": metric, "measured": float(measured), "predicted": predicted,
        "error": (predicted - measured) / measured, "flops_counted": counted,
        "engine": str(cfg.engine),
        "layout": label(cfg),
        "mfu_predicted": fig["mfu"], "fits": bool(fig["fits"]),
        **memory,
    }


def validate_runs(runs: pd.DataFrame, systems: dict[str, SystemSpec] | None = None
                  ) -> pd.DataFrame:
    """One row per published run: what was measured, what the model predicts, the error."""
    rows = []
    for _, row in runs.iterrows():
        out = predict_row(row, systems)
        rows.append({"source": row["source"].split()[0], "model": row["model"],
                     "gpu": row["gpu_type"], "system": row_system(row, systems).name,
                     "gpus": int(row["num_gpus"]), **out})
    return pd.DataFrame(rows)


def error_summary(table: pd.DataFrame) -> dict[str, float]:
    err = table["error"].abs()
    return {"rows": len(table), "mape": float(np.nanmean(err)), "max": float(np.nanmax(err))}
