"""Tables a person reads: the columns that matter, each number in its unit at the precision it
carries. ``flm results`` and ``flm validate`` print these; ``--all`` (and csv, json) keep every
column at full precision. A step time measured on a shared machine holds three significant
figures at best, so six decimals of it (and of bytes, and of MFU as a fraction) only widened the
table past the terminal."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pandas as pd

from frontier_llm.specs.forms import display_layouts


def _sig3(x: float) -> str:
    return f"{x:.3g}"


def _whole(x: float) -> str:
    return f"{x:,.0f}"


def _percent_of_fraction(x: float) -> str:
    return f"{100 * x:.3g}"


def _bytes(x: float) -> str:
    """Each value in its own unit: a tiny CPU model's 5.73 MB and a GPU's 61.2 GB both read."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.0f} B"


def _signed_percent(x: float) -> str:
    return f"{x:+.1f}"


Format = tuple[str, Callable[[float], str]]
# flm results: the run, its layout's varying columns, then these (header, format).
RESULT_FIGURES: Mapping[str, Format] = {
    "step_time_s": ("step_s", _sig3),
    "predicted_step_time_s": ("predicted_s", _sig3),
    "tokens_per_s": ("tokens/s", _whole),
    "mfu": ("MFU_%", _percent_of_fraction),
    "peak_memory_bytes": ("memory", _bytes),
}
# flm validate: predicted beside measured, with the signed errors.
VALIDATION_FIGURES: Mapping[str, Format] = {
    "measured_step_time_s": ("step_s", _sig3),
    "predicted_step_time_s": ("predicted_s", _sig3),
    "step_time_error_pct": ("step_error_%", _signed_percent),
    "measured_peak_memory_bytes": ("memory", _bytes),
    "predicted_peak_memory_bytes": ("predicted_memory", _bytes),
    "memory_error_pct": ("memory_error_%", _signed_percent),
}
RUN_COLUMNS: Mapping[str, str] = {"run_id": "run_id", "sweep_name": "sweep", "status": "status",
                                  "model": "model", "system": "system"}


def figures(df: pd.DataFrame, formats: Mapping[str, Format]) -> pd.DataFrame:
    """The columns of ``formats`` that ``df`` has, as text in their unit; blank where empty."""
    out = pd.DataFrame(index=df.index)
    for col, (header, fmt) in formats.items():
        if col in df:
            values = pd.to_numeric(df[col], errors="coerce")
            out[header] = [fmt(float(v)) if pd.notna(v) else "" for v in values]
    return out


def run_table(df: pd.DataFrame, formats: Mapping[str, Format]) -> pd.DataFrame:
    """The run's identity, the layout columns that differ between the rows (or are not at
    their default), and ``formats``' figures."""
    if df.empty:
        return df
    ident = df[[c for c in RUN_COLUMNS if c in df]].rename(columns=RUN_COLUMNS)
    return pd.concat([ident, display_layouts(df), figures(df, formats)], axis=1)


def rounded_stats(df: pd.DataFrame) -> pd.DataFrame:
    """Error statistics with percentages to one decimal."""
    return df.round({c: 1 for c in df.columns if c.endswith("_pct")})
