"""``flm_layouts.etp``: the experts' tensor-parallel degree (version 14).

0 stands for "the same as tp" (specs/axes.py), the degree every layout stored before this
column ran its experts at (Megatron-Core's and torchtitan's default), so that is what existing
rows get.
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A plain ALTER TABLE ADD COLUMN, as in 0008-0013 (no table rebuild).
    op.add_column("flm_layouts", sa.Column("etp", sa.Integer(), nullable=False,
                                           server_default=sa.text("0")))


def downgrade() -> None:
    raise NotImplementedError
