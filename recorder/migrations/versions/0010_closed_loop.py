"""What the closed loop records: why a session was sampled, and why a step was flagged.

``sessions.purpose`` is ``train`` or ``validation``.

A closed loop (``lego-proxy loop``) scores held-out tasks every K trainer steps with the
same harness, proxy and grader as its training rollouts. Those sessions are recorded like
any other (the Live UI charts their reward as the validation curve), but the export never
hands them to a trainer: a validation sample that reached the gradient would no longer
measure held-out performance. Sessions created before this revision are training samples.

``alignment_reports.reasons`` is the list of the trainer's reasons for flagging a step (a
threshold and the value that crossed it, in words); reports posted before it have none.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0010"
down_revision: str | None = "0009"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # In place (SQLite adds a NOT NULL column with a default itself): a rebuild of
    # ``sessions`` would drop a table that ``turns`` rows reference.
    with op.batch_alter_table("sessions", recreate="never") as batch:
        batch.add_column(
            sa.Column("purpose", sa.Text(), nullable=False, server_default=sa.text("'train'"))
        )
    column_type = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
    with op.batch_alter_table("alignment_reports", recreate="never") as batch:
        batch.add_column(sa.Column("reasons", column_type, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("alignment_reports", recreate="never") as batch:
        batch.drop_column("reasons")
    with op.batch_alter_table("sessions", recreate="never") as batch:
        batch.drop_column("purpose")
