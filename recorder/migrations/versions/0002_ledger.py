"""History ledger columns on turns: parent turn, classification, fork reason, reused prefix.

Existing rows predate the ledger: each becomes a root with no reused prefix, which is what
the proxy did before (it rendered every turn from scratch).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # Batch mode: SQLite rebuilds the table, Postgres runs plain ALTERs.
    with op.batch_alter_table("turns") as batch:
        batch.add_column(sa.Column("parent_turn_id", sa.Text(), nullable=True))
        batch.add_column(
            sa.Column("classification", sa.Text(), nullable=False, server_default="root")
        )
        batch.add_column(sa.Column("fork_reason", sa.Text(), nullable=True))
        batch.add_column(
            sa.Column("reused_prefix_len", sa.Integer(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("turns") as batch:
        batch.drop_column("reused_prefix_len")
        batch.drop_column("fork_reason")
        batch.drop_column("classification")
        batch.drop_column("parent_turn_id")
