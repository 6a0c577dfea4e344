"""Side requests found after the fact: the turns a root re-labelled.

``turns.side_requests`` lists, on the turn that showed it, the ids of earlier turns of the
session that were recorded as roots but were side requests (a title request that arrived
before the main conversation; see ``proxy.ledger.classify``). Writing such a turn also
updates those turns' ``classification``/``fork_reason``; readers apply the list too, so
the re-label holds whatever order the rows reach the database in. Existing rows: NULL.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0006"
down_revision: str | None = "0005"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    column_type = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
    with op.batch_alter_table("turns") as batch:
        batch.add_column(sa.Column("side_requests", column_type, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("turns") as batch:
        batch.drop_column("side_requests")
