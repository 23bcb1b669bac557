"""The trace file: the contract between a benchmark run and everything downstream.

A trace is one JSON document per run (``<run_id>.trace.json``), validated against
``trace_schema.json`` and written atomically (temporary file in the same directory, fsync,
rename), so a collector never reads half a file. While the run lives, ``<run_id>.heartbeat.json``
beside it shows step progress; the job classifier reads its age to call a run HUNG.
"""

from __future__ import annotations

import json
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

import jsonschema

from frontier_llm.atomic import write_text_atomic
from frontier_llm.errors import UserError

SCHEMA_VERSION = 1
SCHEMA_PATH = Path(__file__).with_name("trace_schema.json")
TRACE_SUFFIX = ".trace.json"
HEARTBEAT_SUFFIX = ".heartbeat.json"


class TraceError(UserError):
    """A trace that is not valid JSON or does not follow the schema."""


@lru_cache(maxsize=1)
def schema() -> dict:
    """trace_schema.json with its ``layout`` object derived from the Layout dataclass and each
    rank's index along every mesh axis (``tp_rank``, ``cp_rank``, ...) from ``specs.axes``.
    The file requires the three of the first traces; a later axis's field is optional (a trace
    from before it ran at index 0)."""
    from frontier_llm.specs.axes import AXES, rank_field
    from frontier_llm.specs.layout import layout_json_schema

    loaded = json.loads(SCHEMA_PATH.read_text())
    loaded["properties"]["layout"] = layout_json_schema()
    ranks = loaded["properties"]["memory"]["items"]["properties"]
    for axis in AXES:
        ranks.setdefault(rank_field(axis), {
            "type": "integer", "minimum": 0,
            "description": f"the rank's index along the {axis} axis of the mesh"})
    return loaded


@lru_cache(maxsize=1)
def _validator() -> jsonschema.protocols.Validator:
    cls = jsonschema.validators.validator_for(schema())
    return cls(schema())


def validate_trace(trace: Any) -> None:
    """Raise TraceError naming the first rule the trace breaks (with its JSON path)."""
    if isinstance(trace, dict) and trace.get("schema_version") not in (None, SCHEMA_VERSION):
        raise TraceError(
            f"trace schema_version {trace.get('schema_version')!r} is not supported "
            f"(this frontier_llm reads version {SCHEMA_VERSION})"
        )
    error = jsonschema.exceptions.best_match(_validator().iter_errors(trace))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(top level)"
        raise TraceError(f"trace invalid at {where}: {error.message}")


def trace_path(trace_dir: str | Path, run_id: str) -> Path:
    return Path(trace_dir) / f"{run_id}{TRACE_SUFFIX}"


def heartbeat_path(trace_dir: str | Path, run_id: str) -> Path:
    return Path(trace_dir) / f"{run_id}{HEARTBEAT_SUFFIX}"


def write_json_atomic(path: str | Path, obj: Any) -> Path:
    """Write JSON so that readers see the old file or the whole new one, never a part, and
    durably (a trace must survive the node that wrote it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(obj, indent=1, sort_keys=True, allow_nan=False) + "\n"
    return write_text_atomic(path, text, durable=True)


def write_trace(trace_dir: str | Path, trace: dict) -> Path:
    """Validate and atomically write ``trace``; returns its path."""
    validate_trace(trace)
    return write_json_atomic(trace_path(trace_dir, trace["run_id"]), trace)


def read_trace(path: str | Path) -> dict:
    """Load and validate one trace; TraceError says what is wrong with it."""
    path = Path(path)
    try:
        trace = json.loads(path.read_text())
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not a text file") from None
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}: not valid JSON: {exc.msg} at line {exc.lineno}") from None
    try:
        validate_trace(trace)
    except TraceError as exc:
        raise TraceError(f"{path}: {exc}") from None
    return trace


def write_heartbeat(trace_dir: str | Path, run_id: str, step: int, total_steps: int,
                    **extra: Any) -> Path:
    """Record progress; called by rank 0 after every step."""
    return write_json_atomic(
        heartbeat_path(trace_dir, run_id),
        {"run_id": run_id, "step": step, "total_steps": total_steps, "time": time.time(), **extra},
    )
