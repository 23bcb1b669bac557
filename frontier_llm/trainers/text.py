"""How a name or a path is written into a trainer's file: one way per format, and none lets the
value leave its comment or its quotes (issue 38 item 1).

A model or system name, a path, any free text a user gave, may hold a newline, a quote or a
terminal escape. Written raw into a ``#`` comment a newline would start a live line (``--load DIR
--finetune`` after a flags file's header); in a TOML string it would end the string. So: a
comment gets the value on one line with every non-printable character spelled as its Python
escape (``\\n``); a TOML string escapes what TOML's basic strings require (``"``, ``\\`` and every
control character, toml.io v1.0.0 "String"); a shell word is ``shlex.quote``'s; JSON is
``json.dumps``'s, which escapes control characters itself.
"""

from __future__ import annotations

import json
import shlex
from typing import Any


def one_line(text: object) -> str:
    """``text`` on one line: every non-printable character (newline, carriage return, tab, escape,
    Unicode line and paragraph separators) as its backslash escape."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in str(text))


def comment_lines(lines: list[str], mark: str = "#") -> str:
    """Comment lines, each value one line (see :func:`one_line`)."""
    return "".join(f"{mark} {one_line(line)}\n" for line in lines)


def toml_string(text: str) -> str:
    """A TOML basic string: quote, backslash and control characters escaped."""
    out = []
    for c in text:
        if c in '"\\':
            out.append("\\" + c)
        elif c.isprintable():
            out.append(c)
        elif ord(c) <= 0xFFFF:
            out.append(f"\\u{ord(c):04X}")
        else:
            out.append(f"\\U{ord(c):08X}")
    return '"' + "".join(out) + '"'


def toml_value(value: Any) -> str:
    """A TOML value: booleans, integers, strings and (nested) lists of them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return toml_string(value)
    return "[" + ", ".join(toml_value(v) for v in value) + "]"


def shell_word(value: object) -> str:
    """One shell word, whatever it holds."""
    return shlex.quote(str(value))


def json_text(doc: dict) -> str:
    return json.dumps(doc, indent=2) + "\n"
