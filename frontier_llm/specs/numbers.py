"""Numbers at the boundary: every integer and float that a YAML file, a trainer's log, the
command line or the Python API hands flm passes here once, where it is read.

Why one layer: a value that is a number by type is not yet a quantity. YAML reads ``.nan`` and
``.inf`` as floats, so ``layers: .nan`` reached ``int(value)`` (a ValueError traceback); a log
prints ``inf`` where a counter overflowed, and ``int(float("inf"))`` stopped a whole folder from
being stored; a count of 16.7 million layers is accepted by type and made ``flm plan`` run for
minutes. So each value is refused when it is NaN, infinite, not whole where a count is meant,
negative where that means nothing, or beyond what any real run has; the message names the
field, the limit and the reason for the limit, never more of the value than its number.
"""

from __future__ import annotations

import math
import re
from typing import Any

from frontier_llm.errors import SpecError
from frontier_llm.specs.values import finite

# The largest count flm keeps (a degree, a batch, a step number, a dimension): int32's range,
# so every product of two counts stays inside int64 and the store's INTEGER columns.
MAX_COUNT = 2**31 - 1
# The largest magnitude of a measured or configured real number: 1e18 is a billion times the
# largest figure any run reports (a step's tokens/s is at most ~1e9, a peak of memory ~1e12
# bytes, a token budget ~1e14); a larger one is a corrupt line, and products of two stay far
# from float overflow.
MAX_REAL = 1e18
# The longest run of digits read as one number: 19 digits hold any int64; longer ones are no
# value a trainer prints, and Python's int() refuses more than 4300 (sys.int_info).
MAX_DIGITS = 19
_NOT_FINITE = ("nan", "inf", "infinity")
_NUMBER = re.compile(r"\A[+-]?(\d[\d,]*\.?\d*|\.\d+)([eE][+-]?\d+)?\Z")


def integer(value: Any, field: str, *, lo: int | None = 0, hi: int | None = MAX_COUNT,
            reason: str = "") -> int:
    """``value`` as an int in [lo, hi] (None: no bound on that side; the field's own check
    gives it): a bool, NaN, an infinity, a fraction or a value out of range is a SpecError
    naming ``field``, the limit and ``reason`` (why the limit)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(f"{field} must be an integer (got {type(value).__name__})", field)
    if isinstance(value, float) and not math.isfinite(value):
        raise SpecError(f"{field} must be an integer, not {value}", field)
    if value != int(value):
        raise SpecError(f"{field} must be an integer (got {value:g})", field)
    return _in_range(int(value), field, lo, hi, reason)


def real(value: Any, field: str, *, lo: float | None = -MAX_REAL, hi: float | None = MAX_REAL,
         reason: str = "") -> float:
    """``value`` as a finite float in [lo, hi] (None: no bound on that side); an int too large
    for a float is refused too (values.finite, the check a file's numbers already had)."""
    return _in_range(finite(value, field), field, lo, hi, reason)


def _in_range(value: Any, field: str, lo: float | None, hi: float | None, reason: str) -> Any:
    if (lo is None or lo <= value) and (hi is None or value <= hi):
        return value
    why = f" ({reason})" if reason else ""
    if lo is not None and value < lo:
        limit = "must not be negative" if lo == 0 else f"must be at least {_fmt(lo)}"
        raise SpecError(f"{field} {limit} (got {_fmt(value)}){why}", field)
    raise SpecError(f"{field} must be at most {_fmt(hi)} (got {_fmt(value)}){why}", field)


def _fmt(value: float) -> str:
    """A limit as a reader writes it: 1,048,576 and 2,147,483,647 whole, 1e+08 and 0.5 short."""
    if float(value).is_integer() and abs(value) < 1e7:
        return f"{int(value):,}"
    if isinstance(value, int) and abs(value) < 1e12:
        return f"{value:,}"
    return f"{value:g}"


def _parse(text: str, field: str) -> float:
    """The float a printed number spells (``nan`` and ``inf`` too, for the checks to name);
    a run of more than :data:`MAX_DIGITS` digits or anything else is refused here."""
    text = str(text).strip()
    if text.lower().lstrip("+-") in _NOT_FINITE:
        return float(text)
    digits = max((len(d) for d in re.findall(r"\d+", text)), default=0)
    if digits > MAX_DIGITS or not _NUMBER.match(text):
        raise SpecError(f"{field}: not a number flm reads ({_shown(text)})", field)
    return float(text.replace(",", ""))


def parse_real(text: str, field: str, **limits: Any) -> float:
    """A number printed in text (a log, a flag): ``10,050``, ``1.8E+00``, ``243.6``; then
    :func:`real` (``nan``, ``inf`` and out of range refused)."""
    return real(_parse(text, field), field, **limits)


def parse_integer(text: str, field: str, **limits: Any) -> int:
    """A count printed in text (``1,024``, ``8``, ``8.0``), then :func:`integer`."""
    return integer(_parse(text, field), field, **limits)


def _shown(text: str) -> str:
    """At most a few characters of a value that is not a number (a log line may be hostile)."""
    short = text[:16]
    return repr(short + ("..." if len(text) > 16 else ""))
