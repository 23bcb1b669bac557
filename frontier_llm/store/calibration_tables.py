"""The store's calibration tables (schema version 3), their migration, and how a results file
is saved into them.

Kept in this one module on purpose: the store's hand-written migrations are being converted to
Alembic, and everything schema version 3 adds is here (the two tables, the function that
creates them, the save and read functions), so it becomes one revision as it stands.

``flm_calibrations``: one row per microbenchmark run, with its provenance (date, hosts, node
count, world size, library versions). ``flm_calibration_samples``: its timings, one row per GEMM
or per (library, operation, tier, group size, message size).
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import TYPE_CHECKING

import pandas as pd
from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    DateTime,
    Float,
    ForeignKeyConstraint,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    inspect,
    select,
)

if TYPE_CHECKING:  # the store package imports this module (its migrations)
    from frontier_llm.store import Store

# Its own MetaData: migration 1 creates schema.TABLES as they were at version 2, and this
# migration adds these, on new and old databases alike.
metadata = MetaData()

flm_calibrations = Table(
    "flm_calibrations", metadata,
    Column("id", Integer, primary_key=True),
    # sha256 of the results file's bytes: saving the same file twice stores it once.
    Column("calibration_id", String(64), nullable=False, unique=True),
    Column("started_at", DateTime(timezone=True)),
    Column("finished_at", DateTime(timezone=True)),
    Column("system_name", String(200)),
    Column("model_name", String(200)),
    Column("dtype", String(16)),
    Column("backend", String(32)),
    Column("hosts", Text, nullable=False),  # comma-separated, sorted
    Column("node_count", Integer, nullable=False),
    Column("world_size", Integer, nullable=False),
    Column("versions_json", Text, nullable=False),
    Column("provenance_json", Text, nullable=False),
    Column("results_path", Text),
)

flm_calibration_samples = Table(
    "flm_calibration_samples", metadata,
    Column("id", Integer, primary_key=True),
    Column("calibration", Integer, nullable=False),
    Column("kind", String(16), nullable=False),  # 'matmul' | 'collective'
    Column("library", String(32)),
    Column("op", String(32)),  # GEMM name for matmul rows
    Column("tier", String(16)),
    Column("group_size", Integer),
    Column("nbytes", BigInteger),
    Column("tp", Integer),
    Column("hidden", Integer),
    Column("m", Integer),
    Column("n", Integer),
    Column("k", Integer),
    Column("dtype", String(16)),
    Column("reps", Integer),
    Column("time_s", Float, nullable=False),
    ForeignKeyConstraint(["calibration"], ["flm_calibrations.id"], ondelete="CASCADE"),
)


def migrate_v3(conn: Connection) -> None:
    """Create the calibration tables where they are missing."""
    existing = set(inspect(conn).get_table_names())
    for table in metadata.sorted_tables:
        if table.name not in existing:
            table.create(conn)


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
