"""The collector's fast trace check (fastjsonschema) never accepts what jsonschema rejects.

Differential test: every field of a valid trace is replaced by values of every JSON type, deleted,
or joined by an unknown key, and each mutant goes through both checks.
"""

from __future__ import annotations

import copy

import pytest
from store_fixtures import make_trace

from frontier_llm.bench.trace import TraceError, validate_trace
from frontier_llm.store.schema_check import trace_check, validate_trace_fast

REPLACEMENTS = (None, True, False, 0, 1, -1, 1.0, 0.5, -2.5, "", "x", "completed", "1f1b",
                [], [1], {}, {"a": 1})


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, (*prefix, i))


def _set(doc, path, value=None, delete=False):
    out = copy.deepcopy(doc)
    target = out
    for p in path[:-1]:
        target = target[p]
    if delete:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return out


def _mutants(trace):
    for path in _paths(trace):
        if not path:
            continue
        for value in REPLACEMENTS:
            yield _set(trace, path, value)
        if not isinstance(path[-1], int):
            yield _set(trace, path, delete=True)
    for path in _paths(trace):
        node = trace
        for p in path:
            node = node[p]
        if isinstance(node, dict):
            yield _set(trace, (*path, "unknown_key"), 1)


def _jsonschema_ok(doc) -> bool:
    try:
        validate_trace(doc)
    except TraceError:
        return False
    return True


def test_fast_check_never_accepts_an_invalid_trace():
    trace = make_trace("mutant", tp=2, steps=2, warmup=1)
    check = trace_check()
    assert check(trace) and _jsonschema_ok(trace)
    accepted = rejected = declined = 0
    for doc in _mutants(trace):
        ok = _jsonschema_ok(doc)
        if check(doc):
            accepted += 1
            assert ok, doc
        else:
            rejected += 1
            declined += ok  # valid, but left to jsonschema: slower, never wrong
    # Both outcomes occur a lot, so the test exercises both sides of the check; and the fast
    # path is worth having only if it takes (nearly) every valid trace.
    assert accepted > 100 and rejected > 500
    assert declined == 0


def test_rejected_traces_get_the_jsonschema_message():
    trace = make_trace("bad")
    trace["layout"]["tp"] = 0
    with pytest.raises(TraceError, match="trace invalid at layout/tp"):
        validate_trace_fast(trace)
    trace = make_trace("bad-version")
    trace["schema_version"] = 2
    assert not trace_check()(trace)
    with pytest.raises(TraceError, match="schema_version 2 is not supported"):
        validate_trace_fast(trace)
    # A float that is a whole number is an integer to JSON Schema: both validators accept it.
    trace = make_trace("float-int")
    trace["layout"]["tp"] = 1.0
    assert trace_check()(trace) and _jsonschema_ok(trace)
    validate_trace_fast(trace)
