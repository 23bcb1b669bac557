"""``flm_rank_memory.cp_rank``: each rank's index in its context-parallel group (version 10).

Every rank stored before this column ran at cp 1, where every rank's index is 0, so that is
what existing rows get.
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A plain ALTER TABLE ADD COLUMN, as in 0009 (no table rebuild).
    op.add_column("flm_rank_memory", sa.Column("cp_rank", sa.Integer(), nullable=False,
                                               server_default=sa.text("0")))


def downgrade() -> None:
    raise NotImplementedError
