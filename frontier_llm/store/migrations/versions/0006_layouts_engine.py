"""``flm_layouts.engine``: the training engine that ran (or would run) the layout (version 6).

Every layout stored before this column was run by ``flm bench``'s own engine, ``native``, so
that is what existing rows get.
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("flm_layouts") as batch:
        batch.add_column(sa.Column("engine", sa.String(32), nullable=False,
                                   server_default="native"))


def downgrade() -> None:
    raise NotImplementedError
