"""A microbenchmark results file (written by rank 0 of a calibration job) as DataFrames."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from frontier_llm.errors import UserError

SCHEMA = "flm-calibration/1"


@dataclass(frozen=True)
class Results:
    path: str
    provenance: dict
    matmul: pd.DataFrame
    collectives: pd.DataFrame

    @property
    def dtype(self) -> str:
        return str(self.provenance.get("dtype", "bf16"))


def from_document(doc: dict, path: str = "<results>") -> Results:
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise UserError(f"{path}: not a calibration results file (schema {SCHEMA})")
    for key in ("provenance", "matmul", "collectives"):
        if key not in doc:
            raise UserError(f"{path}: the results file has no '{key}' section")
    return Results(path=path, provenance=dict(doc["provenance"]),
                   matmul=pd.DataFrame(doc["matmul"]),
                   collectives=pd.DataFrame(doc["collectives"]))


def load_results(path: str | Path) -> Results:
    """Read a results JSON file; a missing or malformed one is a :class:`UserError`."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: no such results file") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not a text file (invalid UTF-8 at byte {exc.start}); expected "
                        "calibration results JSON") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"{path}: cannot read calibration results: {exc}") from None
    return from_document(doc, str(path))
