"""``flm_layouts.ep`` and ``flm_rank_memory.ep_rank``: the expert-parallel degree and each
rank's index in its expert-parallel group (version 11).

Every layout stored before these columns ran without expert parallelism (ep 1, every rank's
index 0), so that is what existing rows get.
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ALTER TABLE ADD COLUMNs, as in 0009 and 0010 (no table rebuild).
    op.add_column("flm_layouts", sa.Column("ep", sa.Integer(), nullable=False,
                                           server_default=sa.text("1")))
    op.add_column("flm_rank_memory", sa.Column("ep_rank", sa.Integer(), nullable=False,
                                               server_default=sa.text("0")))


def downgrade() -> None:
    raise NotImplementedError
