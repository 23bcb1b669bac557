"""``flm_attempts``: the ended attempts of jobs that ran again (version 7).

SLURM requeues a job after a node failure or a preemption under the same job id, and
``flm sweep retry`` resubmits one: each earlier attempt keeps its own row here (its state,
reason, run id and log), while ``flm_jobs`` holds the current one. Written out here, not taken
from ``schema.py``.
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "flm_attempts",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("sweep_id", sa.Integer(), nullable=False),
        sa.Column("job_key", sa.String(200), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("scheduler_job_id", sa.String(64)),
        sa.Column("run_id", sa.String(128)),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("reason", sa.Text()),
        sa.Column("exit_code", sa.String(32)),
        sa.Column("nodelist", sa.Text()),
        sa.Column("started_at", sa.DateTime(timezone=True)),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.Column("log_path", sa.Text()),
        sa.ForeignKeyConstraint(["sweep_id"], ["flm_sweeps.id"], ondelete="CASCADE"),
        sa.UniqueConstraint("sweep_id", "job_key", "attempt",
                            name="uq_flm_attempts_job_attempt"),
    )


def downgrade() -> None:
    raise NotImplementedError
