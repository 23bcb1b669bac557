"""The one validation layer for what a file or a command line hands flm: names, free text and
numbers, refused in one line that names the field and never repeats a hostile value.

Why a layer of its own: a name read from YAML (a model's, a system's, a label) travels into
exported flag files, TOML and script comments, the database and the terminal. A newline in it
starts a new line of a flags file (a live ``--load``), a bidi override reorders what a reviewer
reads (Boulanger and Anderson, "Trojan Source", CVE-2021-42574), an escape sequence drives the
terminal. So a name is checked once, where it is read, instead of by each writer; numbers are
checked the same way, so a NaN or an overflow never reaches the cost model as a value.
"""

from __future__ import annotations

import math
import re
import unicodedata
from typing import Any

from frontier_llm.errors import SpecError

# The longest name flm keeps (a model, a system, a label): file names stop at 255 bytes, and a
# name longer than a line of a table is a mistake.
MAX_NAME = 200
# The longest label value or free-text line (a description): longer ones are pasted files.
MAX_TEXT = 4096
# Names of files, jobs and sweeps: the characters of a portable file name (POSIX.1-2017, 3.282
# "Portable Filename Character Set"). ``\Z``, not ``$``: ``$`` also matches before a final
# newline, so ``re.match("^...$", "name\n")`` let a name end in a newline.
SAFE_NAME = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]*\Z")
# Unicode categories that are never part of a printable name: Cc (controls: NUL, newline,
# ESC, DEL), Cf (format: the bidi overrides U+202A-202E and isolates U+2066-2069, zero-width
# joiners), Zl and Zp (the line and paragraph separators U+2028, U+2029, which some editors
# and terminals break lines at), Cs and Co (surrogates, private use).
_UNPRINTABLE = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co"})


def bad_character(text: str, *, allow_tab: bool = False) -> int | None:
    """The index of the first character of ``text`` that is a control, format (bidi) or line
    separator character, or None."""
    for i, c in enumerate(text):
        if c == "\t" and allow_tab:
            continue
        if unicodedata.category(c) in _UNPRINTABLE:
            return i
    return None


def _describe(c: str) -> str:
    name = unicodedata.name(c, "")
    return f"U+{ord(c):04X}" + (f" {name}" if name else "")


def check_name(value: Any, field: str, *, safe: bool = False) -> str:
    """``value`` if it is a one-line, printable string of at most :data:`MAX_NAME` characters
    (``safe``: only the portable file name characters); else a SpecError naming ``field`` and
    the character at fault, not the value."""
    if not isinstance(value, str):
        raise SpecError(f"{field} must be a string", field)
    if not value.strip():
        raise SpecError(f"{field} must not be empty", field)
    if len(value) > MAX_NAME:
        raise SpecError(f"{field} is longer than {MAX_NAME} characters", field)
    i = bad_character(value)
    if i is not None:
        raise SpecError(f"{field}: character {_describe(value[i])} at position {i + 1} is not "
                        "allowed in a name (a control, bidi or line-break character would "
                        "reach files, scripts and the terminal; the value is not repeated here)",
                        field)
    if safe and not SAFE_NAME.match(value):
        raise SpecError(f"{field} may hold only letters, digits, '.', '_', '-' (it names files "
                        "and jobs)", field)
    return value


def check_text(value: Any, field: str) -> str:
    """Free text of one line (a label value, a description): printable, at most
    :data:`MAX_TEXT` characters; a tab is allowed."""
    if not isinstance(value, str):
        raise SpecError(f"{field} must be a string", field)
    if len(value) > MAX_TEXT:
        raise SpecError(f"{field} is longer than {MAX_TEXT} characters", field)
    i = bad_character(value, allow_tab=True)
    if i is not None:
        raise SpecError(f"{field}: character {_describe(value[i])} at position {i + 1} is not "
                        "allowed (the value is not repeated here)", field)
    return value


def finite(value: Any, field: str) -> float:
    """``value`` as a finite float: NaN, an infinity and an integer too large for a float (YAML
    reads ``1e400`` as inf, ``10**400`` written out as an int) are refused in one line."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(f"{field} must be a number", field)
    try:
        out = float(value)
    except OverflowError:
        raise SpecError(f"{field} is too large (above {1.8e308:g})", field) from None
    if not math.isfinite(out):
        raise SpecError(f"{field} must be a finite number (got {out})", field)
    return out


def in_range(value: Any, field: str, lo: float, hi: float, unit: str = "") -> float:
    """A finite number in [lo, hi]; the message names the range."""
    out = finite(value, field)
    if not lo <= out <= hi:
        unit = f" {unit}" if unit else ""
        raise SpecError(f"{field} must be between {lo:g} and {hi:g}{unit} (got {out:g})", field)
    return out


def printable(text: str) -> str:
    """``text`` fit to print on a terminal: each control, bidi or line-break character is
    written as its ``\\x``/``\\u`` escape, so a file name or a value from a log cannot move the
    cursor, recolour the screen or reorder what is read (an ESC sequence, U+202E)."""
    if bad_character(text) is None:
        return text
    out = []
    for c in text:
        if unicodedata.category(c) in _UNPRINTABLE:
            code = ord(c)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
        else:
            out.append(c)
    return "".join(out)


def printable_path(path: object) -> str:
    """A file name fit to print: undecodable bytes (a non-UTF-8 name, which Python holds as
    lone surrogates) and control characters escaped."""
    text = str(path)
    try:
        text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return printable(text)
