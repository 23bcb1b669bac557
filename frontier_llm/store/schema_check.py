"""A fast yes/no check of a trace against the trace JSON schema, for the collector's hot loop.

jsonschema spends about 1 ms per trace (most of a 10,000-trace ingest). This compiles the schema
once into nested Python closures that only answer "certainly valid". The rule that keeps it
safe: it never accepts a document jsonschema would reject. It is stricter where that is
simpler (an integer must be a Python int, so 1.0 is not one), and a schema using any keyword it
does not know compiles to None, i.e. no fast path. Whatever it does not accept goes to
:func:`frontier_llm.bench.trace.validate_trace`, which decides and words the error.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from frontier_llm.bench import trace as trace_contract

Check = Callable[[Any], bool]

# Keywords that only annotate.
_ANNOTATIONS = {"$schema", "$id", "title", "description", "$comment", "examples", "default"}
_KNOWN = _ANNOTATIONS | {"type", "required", "properties", "additionalProperties", "enum",
                         "const", "pattern", "minimum", "minLength", "items"}

_TYPES: dict[str, Check] = {
    "object": lambda x: type(x) is dict,
    "array": lambda x: type(x) is list,
    "string": lambda x: type(x) is str,
    "integer": lambda x: type(x) is int,
    "number": lambda x: type(x) in (int, float),
    "boolean": lambda x: type(x) is bool,
    "null": lambda x: x is None,
}


class _Unsupported(Exception):
    pass


def _same(a: Any, b: Any) -> bool:
    # JSON equality: True is not 1 (Python says it is).
    return type(a) is type(b) and a == b


def _compile(schema: Any) -> Check:
    if schema is True or schema == {}:
        return lambda x: True
    if not isinstance(schema, dict) or set(schema) - _KNOWN:
        raise _Unsupported(schema)
    checks: list[Check] = []
    if "type" in schema:
        names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if any(n not in _TYPES for n in names):
            raise _Unsupported(names)
        fns = [_TYPES[n] for n in names]
        checks.append(lambda x, fns=fns: any(f(x) for f in fns))
    if "const" in schema:
        checks.append(lambda x, c=schema["const"]: _same(x, c))
    if "enum" in schema:
        checks.append(lambda x, e=tuple(schema["enum"]): any(_same(x, v) for v in e))
    if "pattern" in schema:
        rx = re.compile(schema["pattern"])
        checks.append(lambda x, rx=rx: type(x) is not str or rx.search(x) is not None)
    if "minLength" in schema:
        checks.append(lambda x, n=schema["minLength"]: type(x) is not str or len(x) >= n)
    if "minimum" in schema:
        checks.append(lambda x, m=schema["minimum"]:
                      type(x) not in (int, float) or x >= m)
    if "required" in schema:
        req = tuple(schema["required"])
        checks.append(lambda x, req=req: type(x) is not dict or all(k in x for k in req))
    props = {k: _compile(v) for k, v in schema.get("properties", {}).items()}
    extra = schema.get("additionalProperties", True)
    extra_check = None if extra is True else (
        (lambda x: False) if extra is False else _compile(extra))
    if props or extra_check is not None:
        def objects(x: Any, props=props, extra_check=extra_check) -> bool:
            if type(x) is not dict:
                return True
            for k, v in x.items():
                f = props.get(k)
                if f is not None:
                    if not f(v):
                        return False
                elif extra_check is not None and not extra_check(v):
                    return False
            return True
        checks.append(objects)
    if "items" in schema:
        item = _compile(schema["items"])
        checks.append(lambda x, item=item: type(x) is not list or all(item(v) for v in x))
    return lambda x, checks=tuple(checks): all(c(x) for c in checks)


@lru_cache(maxsize=1)
def trace_check() -> Check | None:
    """The compiled check of the trace schema, or None when it uses a keyword not handled."""
    try:
        return _compile(trace_contract.schema())
    except _Unsupported:
        return None


def validate_trace_fast(trace: Any) -> None:
    """Same outcome as ``validate_trace``: returns for a valid trace, raises TraceError else."""
    check = trace_check()
    if check is not None and check(trace):
        return
    trace_contract.validate_trace(trace)
