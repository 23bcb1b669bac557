"""Indexes for the query paths: runs of a sweep, runs of a layout, jobs by state (version 2)."""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_flm_runs_sweep_name", "flm_runs", ["sweep_name"])
    op.create_index("ix_flm_runs_layout_id", "flm_runs", ["layout_id"])
    op.create_index("ix_flm_jobs_state", "flm_jobs", ["state"])
    op.execute("UPDATE flm_meta SET value = '2' WHERE key = 'schema_version'")


def downgrade() -> None:
    raise NotImplementedError
