"""``flm_layouts.cp``: the context-parallel degree (version 9).

Every layout stored before this column split no sequence (cp 1), so that is what existing rows
get.
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A plain ALTER TABLE ADD COLUMN, as in 0008: a batch operation would rebuild flm_layouts,
    # which the runs' and jobs' foreign keys refer to.
    op.add_column("flm_layouts", sa.Column("cp", sa.Integer(), nullable=False,
                                           server_default=sa.text("1")))


def downgrade() -> None:
    raise NotImplementedError
