"""Tables as files: a CSV with every column at full precision, and a Markdown table of the
columns a reader wants, rounded, with missing values written as an en dash."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd

from frontier_llm.errors import UserError

# What a spreadsheet reads as the start of a formula: =, +, -, @, and a tab or carriage return
# before one (OWASP, "CSV Injection": prefix such a cell with a single quote, which the
# spreadsheet shows as text). A name from a file (a model's, a label) reaches these cells.
_FORMULA = ("=", "+", "-", "@", "\t", "\r")
_NOT_FILE_CHAR = re.compile(r"[^A-Za-z0-9._-]")


def spreadsheet_safe(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with each text cell that starts like a formula prefixed by ``'`` (numbers, which
    may be negative, are left alone: only text cells can hold a formula)."""
    text = [c for c in df.columns
            if df[c].dtype == object or pd.api.types.is_string_dtype(df[c].dtype)]
    if not text:
        return df
    out = df.copy()
    for c in text:
        out[c] = out[c].map(lambda v: "'" + v if isinstance(v, str) and v.startswith(_FORMULA)
                            else v)
    return out


def file_word(text: str) -> str:
    """``text`` (a model's or system's name) as one file name: each character outside the
    portable file name set becomes ``_`` and leading dots go, so ``../..`` or ``/etc/x``
    cannot lead out of the folder it is written in."""
    return _NOT_FILE_CHAR.sub("_", text).lstrip(".") or "_"


def inside(out_dir: str | Path, name: str, suffix: str) -> Path:
    """``out_dir/name+suffix``, refused (UserError) unless it is a file name of its own inside
    ``out_dir``."""
    if name != file_word(name):
        raise UserError(f"report name {name!r} is not a file name (letters, digits, '.', '_', "
                        "'-'; it would be written outside --out)")
    return Path(out_dir) / f"{name}{suffix}"


def _cell(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value == 0:
            return "0"
        mag = abs(value)
        return f"{value:,.0f}" if mag >= 1000 else f"{value:.3g}" if mag < 1 else f"{value:.1f}"
    return str(value).replace("|", "\\|")


def markdown(df: pd.DataFrame) -> str:
    """A GitHub-flavoured Markdown table (numbers right-aligned)."""
    cols = list(df.columns)
    numeric = [pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c])
               for c in cols]
    lines = ["| " + " | ".join(cols) + " |",
             "|" + "|".join("---:" if n else "---" for n in numeric) + "|"]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(_cell(v) for v in row) + " |")
    return "\n".join(lines) + "\n"


def write_table(full: pd.DataFrame, shown: pd.DataFrame, out_dir: str | Path, name: str,
                title: str, notes: list[str] | None = None) -> list[Path]:
    """``name``.csv (``full``) and ``name``.md (a title, ``shown`` and notes)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    csv, md = inside(out, name, ".csv"), inside(out, name, ".md")
    spreadsheet_safe(full).to_csv(csv, index=False)
    text = f"# {title}\n\n" + markdown(shown)
    if notes:
        text += "\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    md.write_text(text)
    return [csv, md]
