"""Workers taken out of rotation: a weight sync that failed on a worker of a plain list.

With an smg router the trainer removes such a worker from the router; with a plain
``LEGO_BACKEND_URL`` list there is no router, so the trainer records the worker here and
every replica stops routing turns to it (it would serve the old policy) until a later sync
succeeds on it.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision: str | None = "0007"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "worker_exclusions",
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("url", name=op.f("pk_worker_exclusions")),
    )


def downgrade() -> None:
    op.drop_table("worker_exclusions")
