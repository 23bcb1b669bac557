"""Saving ``flm calibrate`` results into the store and reading them back.

The tables themselves, ``flm_calibrations`` (one row per microbenchmark run, with its
provenance: dates, hosts, node count, world size, library versions) and
``flm_calibration_samples`` (its timings, one row per GEMM or per library, operation, tier,
group size and message size), are in :mod:`frontier_llm.store.schema` and are created by the
Alembic revision ``0004``.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import TYPE_CHECKING

import pandas as pd
from sqlalchemy import select

from frontier_llm.store.schema import flm_calibration_samples, flm_calibrations

if TYPE_CHECKING:
    from frontier_llm.store import Store

__all__ = ["calibrations_frame", "flm_calibration_samples", "flm_calibrations", "save_results"]


def _time(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


def save_results(store: Store, doc: dict, path: str, raw: bytes) -> tuple[str, bool]:
    """Store a results document; returns (calibration id, whether it was new)."""
    cid = hashlib.sha256(raw).hexdigest()
    prov = doc["provenance"]
    with store.write() as conn:
        found = conn.execute(select(flm_calibrations.c.id).where(
            flm_calibrations.c.calibration_id == cid)).scalar_one_or_none()
        if found is not None:
            return cid, False
        key = conn.execute(flm_calibrations.insert().values(
            calibration_id=cid, started_at=_time(prov.get("started_at")),
            finished_at=_time(prov.get("finished_at")), system_name=prov.get("system"),
            model_name=prov.get("model"), dtype=prov.get("dtype"),
            backend=prov.get("versions", {}).get("backend"),
            hosts=",".join(prov.get("hosts", [])), node_count=int(prov.get("node_count", 1)),
            world_size=int(prov.get("world_size", 1)),
            versions_json=json.dumps(prov.get("versions", {}), sort_keys=True),
            provenance_json=json.dumps(prov, sort_keys=True), results_path=path,
        )).inserted_primary_key[0]
        rows = [{"calibration": key, "kind": "matmul", "op": r.get("name"), "tp": r.get("tp"),
                 "hidden": r.get("hidden"), "m": r.get("m"), "n": r.get("n"), "k": r.get("k"),
                 "dtype": r.get("dtype"), "reps": r.get("reps"), "time_s": r["time_s"],
                 "library": None, "tier": None, "group_size": None, "nbytes": None}
                for r in doc["matmul"]]
        rows += [{"calibration": key, "kind": "collective", "library": r["library"],
                  "op": r["op"], "tier": r["tier"], "group_size": r["group_size"],
                  "nbytes": r["nbytes"], "reps": r.get("reps"), "time_s": r["time_s"],
                  "tp": None, "hidden": None, "m": None, "n": None, "k": None, "dtype": None}
                 for r in doc["collectives"]]
        if rows:
            conn.execute(flm_calibration_samples.insert(), rows)
    return cid, True


def calibrations_frame(store: Store) -> pd.DataFrame:
    """One row per stored calibration, newest first."""
    c = flm_calibrations
    with store.read() as conn:
        result = conn.execute(select(c.c.calibration_id, c.c.finished_at, c.c.system_name,
                                     c.c.model_name, c.c.dtype, c.c.backend, c.c.hosts,
                                     c.c.node_count, c.c.world_size)
                              .order_by(c.c.finished_at.desc()))
        return pd.DataFrame([tuple(r) for r in result], columns=list(result.keys()))
