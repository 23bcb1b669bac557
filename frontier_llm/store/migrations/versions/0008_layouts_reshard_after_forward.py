"""``flm_layouts.reshard_after_forward``: whether sharded parameters are freed after each
layer's forward (version 8).

Every layout stored before this column resharded (FSDP's default, ZeRO-3's only way), so that is
what existing rows get.
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A plain ALTER TABLE ADD COLUMN (SQLite takes it with a constant default): a batch
    # operation would rebuild flm_layouts, which the runs' and jobs' foreign keys refer to.
    op.add_column("flm_layouts", sa.Column("reshard_after_forward", sa.Boolean(),
                                           nullable=False, server_default=sa.true()))


def downgrade() -> None:
    raise NotImplementedError
