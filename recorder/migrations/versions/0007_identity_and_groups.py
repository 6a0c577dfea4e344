"""What makes a recorder database tell itself apart, and a prompt group know its size.

``recorder_identity`` holds one random id, made when this migration first runs on a
database: a proxy journals and spools under that id, so a journal left by a proxy of
another database (or of a database since recreated at the same URL) is never replayed
into this one. ``prompt_groups`` holds one row per prompt group: the size the
orchestrator declared (``NULL``: none) and when the group was closed (``NULL``: open);
existing groups get a row each, undeclared and open.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import time
import uuid

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision: str | None = "0006"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    identity = op.create_table(
        "recorder_identity",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_recorder_identity"),
    )
    op.bulk_insert(identity, [{"id": uuid.uuid4().hex, "created_at": time.time()}])
    op.create_table(
        "prompt_groups",
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("group_id", sa.Text(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=True),
        sa.Column("closed_at", sa.Double(), nullable=True),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_prompt_groups_run_id_runs"),
        sa.PrimaryKeyConstraint("run_id", "group_id", name="pk_prompt_groups"),
    )
    op.execute(
        sa.text(
            "INSERT INTO prompt_groups (run_id, group_id, size, closed_at, created_at) "
            "SELECT run_id, group_id, NULL, NULL, MIN(created_at) FROM sessions "
            "GROUP BY run_id, group_id"
        )
    )


def downgrade() -> None:
    op.drop_table("prompt_groups")
    op.drop_table("recorder_identity")
