"""Alembic keeps the version from here on, in flm_alembic_version (version 3).

No table changes. ``flm_meta.schema_version`` was the version before Alembic; it is set to 3 and
stays there, so that an older frontier_llm (which reads only that row) refuses this database as
newer than itself instead of taking a missing row for an empty database.
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("UPDATE flm_meta SET value = '3' WHERE key = 'schema_version'")


def downgrade() -> None:
    raise NotImplementedError
