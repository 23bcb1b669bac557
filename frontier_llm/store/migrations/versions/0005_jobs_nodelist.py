"""``flm_jobs.nodes`` becomes ``flm_jobs.nodelist`` (version 5).

The column holds SLURM's node list (``frontier[00001-00004]``); in this project *nodes* is a
count. A batch operation, so SQLite rebuilds the table where it cannot rename in place.
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("flm_jobs") as batch:
        batch.alter_column("nodes", new_column_name="nodelist")


def downgrade() -> None:
    raise NotImplementedError
