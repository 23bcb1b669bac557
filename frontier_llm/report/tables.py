"""Tables as files: a CSV with every column at full precision, and a Markdown table of the
columns a reader wants, rounded, with missing values written as an en dash."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd


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
    csv, md = out / f"{name}.csv", out / f"{name}.md"
    full.to_csv(csv, index=False)
    text = f"# {title}\n\n" + markdown(shown)
    if notes:
        text += "\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    md.write_text(text)
    return [csv, md]
