"""What a trial reports at finish beside its reward: stage timings and defense events.

``sessions.stages`` holds ``{stage: seconds}`` for the stages of Table 4 the orchestrator
reported (``sandbox_setup``, ``agent_setup``, ``agent_execution``, ``verification``,
``other``); ``sessions.defense_events`` the list of what the reward-hack defenses did, each
``{"kind": ..., **details}``. Sessions finished before this revision (or without either)
keep NULL, which reads back as no stages and no events.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0009"
down_revision: str | None = "0008"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    column_type = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("stages", column_type, nullable=True))
        batch.add_column(sa.Column("defense_events", column_type, nullable=True))


def downgrade() -> None:
    # In place (SQLite >= 3.35 drops columns itself): rebuilding ``sessions`` would drop
    # a table that ``turns`` rows still reference, which SQLite's enforced keys refuse.
    with op.batch_alter_table("sessions", recreate="never") as batch:
        batch.drop_column("defense_events")
        batch.drop_column("stages")
