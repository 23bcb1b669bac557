"""${message}

Revision ${up_revision} (schema version ${int(up_revision)}), after ${down_revision}.
"""

import sqlalchemy as sa
from alembic import op

revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = None
depends_on = None


def upgrade() -> None:
    ${upgrades if upgrades else "pass"}


def downgrade() -> None:
    # frontier_llm never downgrades: an older frontier_llm refuses a newer database instead.
    raise NotImplementedError
