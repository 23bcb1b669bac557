"""``flm_layouts.first_stage_layers`` / ``last_stage_layers``: given end stages (version 13).

Every layout stored before these columns split its layers by its engine's own rule; they get
the knobs' default, 0 ("not given").
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A plain ALTER TABLE ADD COLUMN, as in 0008-0012 (no table rebuild).
    for name in ("first_stage_layers", "last_stage_layers"):
        op.add_column("flm_layouts", sa.Column(name, sa.Integer, nullable=False,
                                               server_default="0"))


def downgrade() -> None:
    raise NotImplementedError
