"""Build validated dataclasses from plain mappings (YAML, JSON, CLI flags) with precise errors."""

from __future__ import annotations

import dataclasses
import difflib
import enum
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from frontier_llm.errors import SpecError
from frontier_llm.specs.numbers import integer
from frontier_llm.specs.values import finite
from frontier_llm.specs.yamlio import LineMap

T = TypeVar("T")


def _where(data: Mapping, key: str | None) -> str:
    if isinstance(data, LineMap):
        return data.where(key) + ": "
    return ""


def _located(message: str, where: str) -> bool:
    """Whether ``message`` already names a place in the same file (a nested section's error)."""
    path = where[:-2].rsplit(":", 1)[0]
    return bool(path) and message.startswith(path + ":")


def _coerce(value: Any, hint: Any, name: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None:
            return None
        return _coerce(value, args[0], name)
    if origin is typing.Literal:
        allowed = typing.get_args(hint)
        if value not in allowed:
            raise SpecError(
                f"{name} must be one of {', '.join(map(str, allowed))} (got {value!r})", name
            )
        return value
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        # A vocabulary (frontier_llm.specs.layout): its members' words are the allowed values.
        try:
            return hint(value)
        except ValueError:
            words = ", ".join(str(m.value) for m in hint)
            raise SpecError(f"{name} must be one of {words} (got {value!r})", name) from None
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise SpecError(f"{name} must be true or false (got {value!r})", name)
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SpecError(f"{name} must be an integer (got {value!r})", name)
        # .nan, .inf and 1.5 (YAML floats) are refused in the one number layer; each field's
        # own range is its dataclass's check.
        return integer(value, name, lo=None, hi=None)
    if hint is float:
        if isinstance(value, str):
            # PyYAML reads 1.5e12 (no sign in the exponent) as a string; accept it as a number.
            try:
                value = float(value)
            except ValueError:
                raise SpecError(f"{name} must be a number (got {value!r})", name) from None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SpecError(f"{name} must be a number (got {value!r})", name)
        # NaN, inf and 10**400 written out are no quantity: refused here, once, for every file.
        return finite(value, name)
    if hint is str:
        if not isinstance(value, str):
            raise SpecError(f"{name} must be a string (got {value!r})", name)
        return value
    return value


def build(cls: type[T], data: Mapping[str, Any], *, nested: Mapping[str, Any] | None = None) -> T:
    """Make ``cls`` from ``data``: unknown keys, missing keys and wrong types are SpecErrors that
    name the field (and the file and line when ``data`` came from YAML).

    ``nested`` maps a field name to a callable that builds that field's value from its raw data.
    """
    if not isinstance(data, Mapping):
        raise SpecError(
            f"expected a mapping of fields for {cls.__name__}, got {type(data).__name__}"
        )
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise SpecError(
                f"{_where(data, key)}unknown field '{key}' for {cls.__name__}{hint}", str(key)
            )
        try:
            if nested and key in nested:
                kwargs[key] = nested[key](value)
            else:
                kwargs[key] = _coerce(value, hints[key], key)
        except SpecError as exc:
            if _where(data, key) and not _located(str(exc), _where(data, key)):
                raise SpecError(f"{_where(data, key)}{exc}", key) from None
            raise
    missing = [
        name
        for name, f in fields.items()
        if name not in kwargs
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise SpecError(
            f"{_where(data, None)}{cls.__name__} is missing required field(s): "
            f"{', '.join(missing)}",
            missing[0],
        )
    try:
        return cls(**kwargs)
    except SpecError as exc:
        where = _where(data, exc.field)
        if where and not _located(str(exc), where):
            raise SpecError(f"{where}{exc}", exc.field) from None
        raise
