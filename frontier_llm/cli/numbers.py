"""The numbers a command line takes, refused in one line when they are no number, out of range
or absurd (``--gpus 99999999999999999999`` answers at once, never hangs).

Each converter is an argparse ``type``: argparse turns its ArgumentTypeError into one line and
exit 2 (the ``flm`` parser prints no usage block, see ``cli/__init__.py``). The limits are
documented in docs/planner.md ("Bad input"): :data:`~frontier_llm.specs.layout.MAX_GPUS` GPUs,
:data:`MAX_COUNT` for any other count, :data:`MAX_SECONDS` for a duration.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from frontier_llm.errors import SpecError
from frontier_llm.specs.layout import MAX_COUNT, MAX_GPUS
from frontier_llm.specs.numbers import real

# A week: longer waits, polls and timeouts are typing mistakes.
MAX_SECONDS = 7 * 24 * 3600.0
# Ranks one machine starts itself (flm bench --nproc, flm calibrate --nproc): more processes than
# any node has cores are a typing mistake, and starting them would not end.
MAX_LOCAL_RANKS = 1024

__all__ = [
    "MAX_COUNT",
    "MAX_GPUS",
    "MAX_LOCAL_RANKS",
    "MAX_SECONDS",
    "count",
    "count_list",
    "days",
    "fraction",
    "gpus",
    "positive_float",
    "seconds",
    "tokens",
]


def count(lo: int = 1, hi: int = MAX_COUNT, what: str = "a count") -> Callable[[str], int]:
    """A whole number in [lo, hi]."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(
                f"{what} must be between {lo:,} and {hi:,} (got {text})")
        return value

    parse.__name__ = "count"  # argparse names the type in its messages
    return parse


def gpus(text: str) -> int:
    """A GPU count: 1 .. MAX_GPUS."""
    return count(1, MAX_GPUS, "the GPU count")(text)


def count_list(lo: int = 1, hi: int = MAX_COUNT) -> Callable[[str], tuple[int, ...]]:
    """Comma-separated whole numbers, each in [lo, hi]."""
    one = count(lo, hi, "each value")

    def parse(text: str) -> tuple[int, ...]:
        parts = [p for p in text.split(",") if p.strip()]
        if not parts:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
        try:
            return tuple(one(p.strip()) for p in parts)
        except argparse.ArgumentTypeError as exc:
            if "whole number" in str(exc):
                raise argparse.ArgumentTypeError(
                    f"expected comma-separated integers, got {text!r}") from None
            raise

    parse.__name__ = "count_list"
    return parse


def _finite(text: str) -> float:
    """A number of the command line through the one number layer (specs/numbers.py): NaN, an
    infinity and a magnitude beyond any run's are refused as a file's are."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    try:
        return real(value, "value", lo=None, hi=None)  # each flag keeps its own range
    except SpecError:
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}") from None


def seconds(text: str) -> float:
    """A duration in seconds: 0 .. MAX_SECONDS."""
    value = _finite(text)
    if not 0 <= value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"seconds must be between 0 and {MAX_SECONDS:,.0f} (a week) (got {text})")
    return value


def positive_float(hi: float = 1e12) -> Callable[[str], float]:
    """A number > 0 and at most ``hi``."""
    def parse(text: str) -> float:
        value = _finite(text)
        if not 0 < value <= hi:
            raise argparse.ArgumentTypeError(f"must be above 0 and at most {hi:g} (got {text})")
        return value

    parse.__name__ = "positive_float"
    return parse


def tokens(text: str) -> float:
    """A token budget: ``2e13``, ``20T``, ``300B`` (planner.allocation.parse_tokens)."""
    from frontier_llm.planner.allocation import parse_tokens

    try:
        return parse_tokens(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def days(text: str) -> float:
    """A deadline in days: ``45d``, ``12w``, ``36h`` or a bare number of days."""
    from frontier_llm.planner.allocation import parse_days

    try:
        return parse_days(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def fraction(text: str) -> float:
    """A number strictly between 0 and 1 (a confidence)."""
    value = _finite(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, exclusive (got {text})")
    return value
