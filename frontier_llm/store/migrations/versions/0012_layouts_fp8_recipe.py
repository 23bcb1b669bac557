"""``flm_layouts.fp8_recipe``: how an fp8 layout scales its FP8 tensors (version 12).

Every layout stored before this column trained in fp32, bf16 or fp16, where the recipe is not
read; they get the knob's default, tensorwise.
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A plain ALTER TABLE ADD COLUMN, as in 0008-0011 (no table rebuild).
    op.add_column("flm_layouts", sa.Column("fp8_recipe", sa.String(32), nullable=False,
                                           server_default="tensorwise"))


def downgrade() -> None:
    raise NotImplementedError
