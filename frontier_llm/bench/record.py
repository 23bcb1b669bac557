"""The one trace record: every trace flm writes is built here.

``flm bench``'s own runs (bench/run.py ``skeleton_trace``), a trainer log's runs
(logs/traces.py ``build_trace``) and a sweep job whose trainer printed no step
(logs/job.py) all call :func:`trace_record`, so the fields every reader relies on (the
model without its description, the system, the layout and its hash, the cost model's
prediction) are filled one way. A new trace field is added here once, not in each writer.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, Protocol

from frontier_llm.bench.trace import SCHEMA_VERSION
from frontier_llm.specs.identity import layout_hash

# The summary of a run that measured nothing yet (bench/trace_schema.json's required keys).
EMPTY_SUMMARY = {"steps_measured": 0, "step_time_s": None, "tokens_per_s": None,
                 "model_tflops_per_gpu": None, "hardware_tflops_per_gpu": None, "mfu": None,
                 "hfu": None, "peak_memory_bytes": None}


class RunSpec(Protocol):
    """What a trace is about: bench's BenchConfig, or the model, system and layout a log's
    run states (any object with these three)."""

    model: Any
    system: Any
    layout: Any


def trace_record(cfg: RunSpec, *, run_id: str, status: str, started_at: str,
                 environment: dict, labels: dict[str, str], error: str | None = None,
                 finished_at: str | None = None, steps: Iterable[dict] = (),
                 memory: Iterable[dict] = (), summary: dict | None = None) -> dict:
    """A trace (bench/trace_schema.json) of one run of ``cfg``'s model, system and layout,
    with the cost model's prediction for that layout."""
    model = cfg.model.to_dict()
    model.pop("description", None)  # prose, not part of what ran
    return {
        "schema_version": SCHEMA_VERSION, "run_id": run_id, "status": str(status),
        "error": error, "engine": str(cfg.layout.engine), "started_at": started_at,
        "finished_at": finished_at, "model": model,
        "system": {"name": cfg.system.name, "gpu": cfg.system.gpu},
        "layout": cfg.layout.to_dict(),
        "layout_hash": layout_hash(cfg.model, cfg.system.name, cfg.layout),
        "labels": dict(labels), "environment": environment, "steps": list(steps),
        "memory": list(memory), "summary": dict(EMPTY_SUMMARY if summary is None else summary),
        **prediction_fields(cfg),
    }


def prediction_fields(cfg: RunSpec) -> dict:
    """``prediction`` (the cost model's figures with its per-stage memory) and, when the cost
    model had no answer for a part, ``prediction_error`` saying which part and why: the benchmark
    runs anyway, and the trace says why it carries no (or a partial) prediction."""
    try:
        from frontier_llm.costmodel import predict
        from frontier_llm.specs.engine_rules import CP_EXCHANGE

        # The layout names its engine, and with it the engine's own conventions (what it saves
        # for backward, what it shards): the cost model reads them from the layout.
        # A run that syncs FSDP2 every micro-batch is priced so; otherwise the engine's rule.
        # Its context parallelism is flm bench's own (bench/context_parallel.py: one gather).
        pred = predict(cfg.model, cfg.system, cfg.layout,
                       grad_sync=getattr(cfg, "grad_sync_each_microbatch", None) or None,
                       cp_exchange=CP_EXCHANGE["flm-bench"])
    except Exception as exc:  # the benchmark must run even where the cost model has no answer
        return {"prediction": None, "prediction_error": _describe("cost model", exc)}
    out: dict = {}
    try:
        from frontier_llm.costmodel.memory import rank_activation_bytes, rank_state_bytes

        pred["memory_per_rank"] = [
            {"pp_stage": s, **{k: int(v) for k, v in
                               rank_state_bytes(cfg.model, cfg.layout, s).items()},
             "activations_bytes": int(rank_activation_bytes(cfg.model, cfg.layout, s))}
            for s in range(cfg.layout.pp)
        ]
    except Exception as exc:
        out["prediction_error"] = _describe("cost model memory per rank", exc)
    return {"prediction": json.loads(json.dumps(pred, default=float)), **out}


def _describe(part: str, exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{part}: {type(exc).__name__}: {text[0] if text else ''}"[:2000]
