"""Fixtures and helpers for the store's tests (the fixtures are offered to every module by
tests/conftest.py; the helpers are imported by tests/test_store_*.py and the ingest benchmark):
a realistic trace factory and a real PostgreSQL started by scripts/postgres.sh.

The PostgreSQL server is one per test session: a module-level singleton started on first use and
stopped at exit, because a session fixture imported into several test modules would otherwise
start one server per module. Each test gets its own fresh database on it.
"""

from __future__ import annotations

import atexit
import itertools
import random
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from frontier_llm.catalog import load_model
from frontier_llm.specs import axes
from frontier_llm.specs.identity import layout_hash
from frontier_llm.specs.parallel import ParallelConfig

REPO = Path(__file__).resolve().parents[1]
PG_SCRIPT = REPO / "scripts" / "postgres.sh"

_MODEL_KEYS = ("name", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "seq_len", "vocab",
               "activation")


def make_trace(run_id: str, *, model: str = "tiny-gpt", system: str = "cpu-local", tp: int = 1,
               pp: int = 1, dp: int = 1, micro_batch: int = 1, global_batch: int | None = None,
               zero: int = 0, steps: int = 10, warmup: int = 2, status: str = "completed",
               labels: dict | None = None, seed: int = 0, costmodel_version: str = "test-1",
               predicted_step_time_s: float | None = None, engine: str = "native",
               cp: int = 1) -> dict:
    """A valid trace as ``flm bench`` writes it: one memory entry per rank, per-step times
    around a base time with noise, summary = median of measured steps, and a prediction."""
    rng = random.Random(f"{run_id}:{seed}")
    spec = load_model(model)
    gb = global_batch or micro_batch * dp * max(pp, 1) * 2
    layout = ParallelConfig(tp=tp, cp=cp, pp=pp, dp=dp, micro_batch=micro_batch, global_batch=gb,
                            sharding=zero, dtype="fp32", engine=engine)
    ldict = layout.to_dict()
    mdict = spec.to_dict()
    base = 0.05 * gb / (tp * pp * dp) + 0.01
    step_rows = [
        {"step": i, "time_s": round(base * rng.uniform(0.9, 1.3 if i < warmup else 1.1), 6),
         "loss": round(5.5 - 0.1 * i + rng.uniform(-0.05, 0.05), 5), "warmup": i < warmup}
        for i in range(steps)
    ]
    measured = sorted(s["time_s"] for s in step_rows if not s["warmup"])
    step_time = measured[len(measured) // 2] if measured else None
    world = axes.world_size(layout)
    params = spec.num_params() * 4 // (tp * pp)
    memory = []
    for rank in range(world):
        act = int(2e6 * micro_batch * rng.uniform(0.95, 1.05))
        memory.append({
            "rank": rank, **axes.rank_fields(axes.coords(rank, layout)),
            "params_bytes": params, "grads_bytes": params,
            "optimizer_bytes": 2 * params // (dp if zero >= 1 else 1),
            "activations_peak_bytes": act,
            "device_allocated_peak_bytes": 4 * params + act,
            "device_reserved_peak_bytes": 4 * params + act + (1 << 20),
            "host_rss_peak_bytes": 400_000_000 + rank,
        })
    peak = max(m["device_allocated_peak_bytes"] for m in memory)
    tokens = gb * spec.seq_len
    ok = status == "completed"
    flops = 6 * spec.num_params() * tokens
    tflops = flops / step_time / world / 1e12 if ok and step_time else None
    return {
        "schema_version": 1,
        "run_id": run_id,
        "status": status,
        "error": None if ok else f"{status}: injected by the test",
        "engine": engine,
        "started_at": "2025-01-02T03:04:05+00:00",
        "finished_at": "2025-01-02T03:05:05+00:00",
        "model": {k: mdict[k] for k in _MODEL_KEYS},
        "system": {"name": system},
        "layout": ldict,
        "layout_hash": layout_hash(spec, system, layout),
        "labels": dict(labels or {}),
        "environment": {
            "hostnames": ["node001"], "world_size": world, "backend": "gloo", "device": "cpu",
            "launcher": "local", "versions": {"torch": "2.13.0", "python": "3.11.7"},
            "slurm_job_id": None,
        },
        "steps": step_rows,
        "memory": memory,
        "summary": {
            "steps_measured": len(measured),
            "step_time_s": step_time if ok else None,
            "step_time_mean_s": sum(measured) / len(measured) if ok and measured else None,
            "step_time_std_s": 0.001 if ok else None,
            "tokens_per_s": tokens / step_time if ok and step_time else None,
            "model_tflops_per_gpu": tflops,
            "hardware_tflops_per_gpu": tflops,
            "mfu": tflops / 1.0 if tflops else None,
            "hfu": tflops / 1.0 if tflops else None,
            "peak_memory_bytes": peak,
        },
        "prediction": {
            "costmodel_version": costmodel_version,
            "step_time_s": predicted_step_time_s or (step_time or base) * 1.1,
            "model_tflops_per_gpu": (tflops or 1e-3) / 1.1,
            "hardware_tflops_per_gpu": (tflops or 1e-3) / 1.1,
            "mfu": 0.01,
            "hfu": 0.01,
            "peak_memory_bytes": int(peak * 0.9),
            "fits": True,
            "tokens_per_s": tokens / ((step_time or base) * 1.1),
            "breakdown": {"time": {"compute_s": base, "bubble_s": 0.0},
                          "memory": {"params": params, "activations": 2e6}},
        },
    }


LAYOUTS = ((1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2), (2, 2, 1), (2, 1, 2), (1, 2, 2),
           (2, 2, 2), (4, 1, 1), (1, 1, 4), (4, 2, 1), (1, 4, 2))


def many_traces(n: int, prefix: str = "run", **kw) -> list[dict]:
    """``n`` traces cycling over layouts, micro-batches and ZeRO stages (realistic variety:
    many runs share a layout, as repeated sweeps do)."""
    combos = list(itertools.product(LAYOUTS, (1, 2), (0, 1)))
    out = []
    for i in range(n):
        (tp, pp, dp), mb, zero = combos[i % len(combos)]
        out.append(make_trace(f"{prefix}-{i:05d}", tp=tp, pp=pp, dp=dp, micro_batch=mb,
                              zero=zero, seed=i, **kw))
    return out


class _PostgresServer:
    """The session's PostgreSQL (scripts/postgres.sh start/stop), shared by all store tests."""

    def __init__(self) -> None:
        self.dir: Path | None = None
        self.url: str | None = None

    def start(self) -> str:
        if self.url is None:
            subprocess.run([str(PG_SCRIPT), "install"], check=True)
            # Under /tmp directly: pytest's tmp folders are private to root, and the server runs
            # as the postgres user.
            self.dir = Path(tempfile.mkdtemp(prefix="flm-pg-"))
            out = subprocess.run([str(PG_SCRIPT), "start", str(self.dir)], check=True,
                                 capture_output=True, text=True)
            self.url = out.stdout.strip().splitlines()[-1]
            atexit.register(self.stop)
        return self.url

    def stop(self) -> None:
        if self.dir is not None:
            subprocess.run([str(PG_SCRIPT), "stop", str(self.dir)], check=False)
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = self.url = None

    @property
    def port(self) -> int:
        assert self.dir is not None
        return int((self.dir / "port").read_text())

    @property
    def password(self) -> str:
        assert self.dir is not None
        return (self.dir / "password").read_text().strip()

    def new_database(self) -> str:
        """A fresh, empty database on the server; returns its URL."""
        from sqlalchemy import create_engine

        url = self.start()
        name = f"flm_t_{uuid.uuid4().hex[:12]}"
        engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1),
                               isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        engine.dispose()
        return url.replace("/flm?", f"/{name}?", 1)


POSTGRES = _PostgresServer()

DIALECTS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres),
]


@pytest.fixture(params=DIALECTS)
def db_url(request, tmp_path) -> str:
    """A URL of a new, empty database: a SQLite file, or a database on the session's
    PostgreSQL (a real server from Debian's package, not a mock)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'flm.db'}"
    return POSTGRES.new_database()


@pytest.fixture
def pg_server() -> _PostgresServer:
    POSTGRES.start()
    return POSTGRES
