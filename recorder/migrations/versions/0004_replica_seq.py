"""What several proxy replicas need to share: turn order, and a run's pause.

``turns.seq`` becomes the request's arrival time in microseconds (64-bit) instead of a
per-process counter, and loses its uniqueness: two replicas may stamp the same value, and
a clash must never make the recorder refuse a turn. Existing rows keep their small
counters, which still order correctly among themselves. ``runs.paused`` makes a pause
around a weight sync reach every replica, not just the one that was asked.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    with op.batch_alter_table("turns") as batch:
        batch.drop_constraint("uq_turns_session_id_seq", type_="unique")
        batch.alter_column("seq", type_=sa.BigInteger(), existing_nullable=False)
        batch.create_index("ix_turns_session_id", ["session_id", "seq"])
    with op.batch_alter_table("runs") as batch:
        batch.add_column(
            sa.Column("paused", sa.Boolean(), nullable=False, server_default=sa.false())
        )


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("paused")
    with op.batch_alter_table("turns") as batch:
        batch.drop_index("ix_turns_session_id")
        batch.alter_column("seq", type_=sa.Integer(), existing_nullable=False)
        batch.create_unique_constraint("uq_turns_session_id_seq", ["session_id", "seq"])
