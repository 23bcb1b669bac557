"""A fast yes/no check of a trace against the trace JSON schema, for the collector's hot loop.

jsonschema spends about 1 ms per trace (most of a 10,000-trace ingest). ``fastjsonschema``
compiles the same schema (``bench/trace_schema.json``) once into straight-line Python, which
answers in microseconds. It only decides "valid": whatever it rejects goes to
:func:`frontier_llm.bench.trace.validate_trace`, which decides again with jsonschema and words
the error, so messages do not depend on which validator saw the trace first. The rule that keeps
it safe, checked by a differential test: it never accepts a document jsonschema rejects.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

import fastjsonschema

from frontier_llm.bench import trace as trace_contract

Check = Callable[[Any], bool]


@lru_cache(maxsize=1)
def _compiled() -> Callable[[Any], Any]:
    # The schema names draft 2020-12; fastjsonschema reads it as its newest draft (7), which
    # means the same for every keyword the trace schema uses (the differential test holds it).
    return fastjsonschema.compile(trace_contract.schema())


def trace_check() -> Check:
    """The compiled check of the trace schema: True for a trace it accepts."""
    validate = _compiled()

    def check(trace: Any) -> bool:
        try:
            validate(trace)
        except fastjsonschema.JsonSchemaException:
            return False
        return True

    return check


def validate_trace_fast(trace: Any) -> None:
    """Same outcome as ``validate_trace``: returns for a valid trace, raises TraceError else."""
    try:
        _compiled()(trace)
        return
    except fastjsonschema.JsonSchemaException:
        pass
    trace_contract.validate_trace(trace)
