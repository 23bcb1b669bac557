"""The results database's tables (SQLAlchemy 2 Core).

Every table name starts with ``flm_`` so that Optuna's tables (studies, trials, alembic_version,
...) live in the same database without clashing. These definitions are what the code reads and
writes; the database gets them from the Alembic revisions in ``store/migrations/versions/`` (see
:mod:`frontier_llm.store.migrate`), and a test checks that the newest revision builds exactly
these tables. A change here is a new revision file there.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)

from frontier_llm.specs.axes import RANK_FIELDS
from frontier_llm.specs.layout import DType, Sharding, layout_types

metadata = MetaData()

# Byte counts overflow 32-bit integers (a 175B model's states are terabytes).
Bytes = BigInteger

flm_meta = Table(
    "flm_meta", metadata,
    # schema_version: the version before Alembic; 3 for good since (see revision 0003).
    Column("key", String(64), primary_key=True),
    Column("value", Text, nullable=False),
)

flm_sweeps = Table(
    "flm_sweeps", metadata,
    Column("id", Integer, primary_key=True),
    Column("name", String(200), nullable=False, unique=True),
    Column("spec_yaml", Text),
    Column("directory", Text),
    Column("created_at", DateTime(timezone=True)),
)

def _layout_columns() -> list[Column]:
    """One column per Layout field (frontier_llm.specs.layout): integers, booleans, a vocabulary
    as its word, the sharding as its ``Sharding.describe`` text beside its ZeRO stage."""
    cols = []
    for name, kind in layout_types().items():
        if kind is Sharding:
            cols += [Column(name, String(200), nullable=False), Column("zero_stage", Integer)]
        elif kind is bool:
            cols.append(Column(name, Boolean, nullable=False))
        elif kind is int:
            cols.append(Column(name, Integer, nullable=False))
        else:
            cols.append(Column(name, String(_WORD_LENGTH.get(kind, 32)), nullable=False))
    return cols


# Vocabulary columns are String(32) but for the dtype, which schema version 1 made String(16).
_WORD_LENGTH = {DType: 16}

flm_layouts = Table(
    "flm_layouts", metadata,
    Column("id", Integer, primary_key=True),
    Column("layout_hash", String(16), nullable=False, unique=True),
    Column("model_name", String(200), nullable=False),
    Column("system_name", String(200), nullable=False),
    *_layout_columns(),
    Column("model_json", Text, nullable=False),
    Column("layout_json", Text, nullable=False),
)
# The flm_layouts columns that hold the layout itself, in field order.
LAYOUT_COLUMNS = tuple(c.name for c in _layout_columns())

flm_jobs = Table(
    "flm_jobs", metadata,
    Column("id", Integer, primary_key=True),
    Column("sweep_id", Integer, ForeignKey("flm_sweeps.id", ondelete="CASCADE"), nullable=False),
    Column("job_key", String(200), nullable=False),
    Column("layout_id", Integer, ForeignKey("flm_layouts.id"), nullable=True),
    Column("script_path", Text),
    Column("executor", String(16)),  # 'slurm' | 'local'
    Column("scheduler_job_id", String(64)),
    Column("array_index", Integer),
    Column("state", String(32), nullable=False),
    Column("reason", Text),
    Column("exit_code", String(32)),
    Column("nodelist", Text),  # SLURM node list (revision 0005; "nodes" before)
    Column("submitted_at", DateTime(timezone=True)),
    Column("started_at", DateTime(timezone=True)),
    Column("finished_at", DateTime(timezone=True)),
    Column("attempts", Integer, nullable=False, default=0),
    Column("run_id", String(128)),
    Column("updated_at", DateTime(timezone=True)),
    UniqueConstraint("sweep_id", "job_key", name="uq_flm_jobs_sweep_key"),
)

# One row per ended attempt of a job that ran again (SLURM requeued it after a node failure or
# a preemption, or flm sweep retry resubmitted it); the job's current attempt is its flm_jobs
# row. Revision 0007.
flm_attempts = Table(
    "flm_attempts", metadata,
    Column("id", Integer, primary_key=True),
    Column("sweep_id", Integer, ForeignKey("flm_sweeps.id", ondelete="CASCADE"), nullable=False),
    Column("job_key", String(200), nullable=False),
    Column("attempt", Integer, nullable=False),  # 1 = the job's first run
    Column("scheduler_job_id", String(64)),
    Column("run_id", String(128)),
    Column("state", String(32), nullable=False),
    Column("reason", Text),
    Column("exit_code", String(32)),
    Column("nodelist", Text),
    Column("started_at", DateTime(timezone=True)),
    Column("finished_at", DateTime(timezone=True)),
    Column("log_path", Text),
    UniqueConstraint("sweep_id", "job_key", "attempt", name="uq_flm_attempts_job_attempt"),
)

flm_runs = Table(
    "flm_runs", metadata,
    Column("id", Integer, primary_key=True),
    Column("run_id", String(128), nullable=False, unique=True),
    Column("layout_id", Integer, ForeignKey("flm_layouts.id"), nullable=False),
    Column("sweep_name", String(200)),
    Column("job_key", String(200)),
    Column("status", String(16), nullable=False),
    Column("error", Text),
    Column("engine", String(64), nullable=False),
    Column("started_at", DateTime(timezone=True)),
    Column("finished_at", DateTime(timezone=True)),
    Column("world_size", Integer, nullable=False),
    Column("steps_measured", Integer, nullable=False),
    Column("step_time_s", Float),
    Column("tokens_per_s", Float),
    Column("model_tflops_per_gpu", Float),
    Column("hardware_tflops_per_gpu", Float),
    Column("mfu", Float),
    Column("hfu", Float),
    Column("peak_memory_bytes", Bytes),
    # Which cost-model version the trace's own prediction came from: the default join key
    # into flm_predictions, so a run is compared with what was predicted when it ran.
    Column("costmodel_version", String(64)),
    Column("trace_path", Text, nullable=False),
    # sha256 of the trace file's bytes: equal digest = nothing to do; a new one = rewritten.
    Column("trace_digest", String(64), nullable=False),
    Column("labels_json", Text, nullable=False),
    Column("environment_json", Text, nullable=False),
)

flm_steps = Table(
    "flm_steps", metadata,
    Column("run", Integer, primary_key=True),
    Column("step", Integer, primary_key=True),
    Column("time_s", Float, nullable=False),
    Column("loss", Float),
    Column("warmup", Boolean, nullable=False),
    ForeignKeyConstraint(["run"], ["flm_runs.id"], ondelete="CASCADE"),
)

flm_rank_memory = Table(
    "flm_rank_memory", metadata,
    Column("run", Integer, primary_key=True),
    Column("rank", Integer, primary_key=True),
    # A rank's index along each mesh axis (specs.axes: pp_stage, tp_rank, cp_rank, ...); ranks
    # stored before an axis existed have index 0 along it (migration 0010: cp_rank; 0011: ep_rank).
    *(Column(name, Integer, nullable=False) for name in RANK_FIELDS),
    Column("params_bytes", Bytes),
    Column("grads_bytes", Bytes),
    Column("optimizer_bytes", Bytes),
    Column("activations_peak_bytes", Bytes),
    Column("device_allocated_peak_bytes", Bytes),
    Column("device_reserved_peak_bytes", Bytes),
    Column("host_rss_peak_bytes", Bytes),
    ForeignKeyConstraint(["run"], ["flm_runs.id"], ondelete="CASCADE"),
)

flm_predictions = Table(
    "flm_predictions", metadata,
    Column("id", Integer, primary_key=True),
    Column("layout_id", Integer, ForeignKey("flm_layouts.id"), nullable=False),
    Column("costmodel_version", String(64), nullable=False),
    Column("step_time_s", Float),
    Column("model_tflops_per_gpu", Float),
    Column("hardware_tflops_per_gpu", Float),
    Column("mfu", Float),
    Column("peak_memory_bytes", Bytes),
    Column("fits", Boolean),
    Column("breakdown_json", Text),
    UniqueConstraint("layout_id", "costmodel_version", name="uq_flm_predictions_layout_version"),
)

# flm calibrate's microbenchmark runs and their timings (docs/calibrate.md; revision 0004).
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

# Schema version 2 (revision 0002): indexes for the query paths (runs of a sweep, runs of a
# layout, jobs by state).
INDEXES_V2 = (
    Index("ix_flm_runs_sweep_name", flm_runs.c.sweep_name),
    Index("ix_flm_runs_layout_id", flm_runs.c.layout_id),
    Index("ix_flm_jobs_state", flm_jobs.c.state),
)

TABLES = tuple(metadata.sorted_tables)
