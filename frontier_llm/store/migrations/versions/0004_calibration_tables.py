"""The calibration tables: ``flm calibrate``'s microbenchmark runs and their timings (version 4).

``flm_calibrations`` holds one row per run with its provenance; ``flm_calibration_samples`` one
row per timed GEMM or collective. Written out here, not taken from ``schema.py``.
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "flm_calibrations",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("calibration_id", sa.String(64), nullable=False, unique=True),
        sa.Column("started_at", sa.DateTime(timezone=True)),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.Column("system_name", sa.String(200)),
        sa.Column("model_name", sa.String(200)),
        sa.Column("dtype", sa.String(16)),
        sa.Column("backend", sa.String(32)),
        sa.Column("hosts", sa.Text(), nullable=False),
        sa.Column("node_count", sa.Integer(), nullable=False),
        sa.Column("world_size", sa.Integer(), nullable=False),
        sa.Column("versions_json", sa.Text(), nullable=False),
        sa.Column("provenance_json", sa.Text(), nullable=False),
        sa.Column("results_path", sa.Text()),
    )
    op.create_table(
        "flm_calibration_samples",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("calibration", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("library", sa.String(32)),
        sa.Column("op", sa.String(32)),
        sa.Column("tier", sa.String(16)),
        sa.Column("group_size", sa.Integer()),
        sa.Column("nbytes", sa.BigInteger()),
        sa.Column("tp", sa.Integer()),
        sa.Column("hidden", sa.Integer()),
        sa.Column("m", sa.Integer()),
        sa.Column("n", sa.Integer()),
        sa.Column("k", sa.Integer()),
        sa.Column("dtype", sa.String(16)),
        sa.Column("reps", sa.Integer()),
        sa.Column("time_s", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["calibration"], ["flm_calibrations.id"], ondelete="CASCADE"),
    )


def downgrade() -> None:
    raise NotImplementedError
