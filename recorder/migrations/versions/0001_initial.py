"""Initial schema: runs, sessions, turns.

Written out explicitly rather than derived from ``recorder.schema`` so that this revision
keeps meaning the same thing after the schema module moves on.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None


def _json() -> sa.JSON:
    return sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_runs"),
        sa.UniqueConstraint("name", name="uq_runs_name"),
    )
    op.create_table(
        "sessions",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("task_id", sa.Text(), nullable=False),
        sa.Column("group_id", sa.Text(), nullable=False),
        sa.Column("sample_index", sa.Integer(), nullable=False),
        sa.Column("harness", sa.Text(), nullable=False),
        sa.Column("sampling", _json(), nullable=False),
        sa.Column("max_prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("max_output_tokens", sa.Integer(), nullable=True),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("termination", sa.Text(), nullable=True),
        sa.Column("reward", sa.Double(), nullable=True),
        sa.Column("reward_details", _json(), nullable=True),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("finished_at", sa.Double(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_sessions_run_id_runs"),
        sa.PrimaryKeyConstraint("id", name="pk_sessions"),
    )
    op.create_index("ix_sessions_key", "sessions", ["key"], unique=True)
    op.create_index("ix_sessions_run_id", "sessions", ["run_id"])
    op.create_table(
        "turns",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("session_id", sa.Text(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("adapter", sa.Text(), nullable=False),
        sa.Column("requested_model", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("finish_reason", sa.Text(), nullable=False),
        sa.Column("weight_version", sa.Text(), nullable=False),
        sa.Column("prompt_ids", sa.LargeBinary(), nullable=False),
        sa.Column("output_ids", sa.LargeBinary(), nullable=False),
        sa.Column("logprobs", sa.LargeBinary(), nullable=False),
        sa.Column("routed_experts", sa.LargeBinary(), nullable=True),
        sa.Column("routed_experts_start", sa.Integer(), nullable=True),
        sa.Column("routed_experts_num_layers", sa.Integer(), nullable=True),
        sa.Column("routed_experts_top_k", sa.Integer(), nullable=True),
        sa.Column("routed_experts_dtype", sa.Text(), nullable=True),
        sa.Column("sampling_params", _json(), nullable=False),
        sa.Column("request_messages", sa.LargeBinary(), nullable=False),
        sa.Column("response_message", sa.LargeBinary(), nullable=False),
        sa.Column("ignored_fields", _json(), nullable=False),
        sa.Column("malformed_tool_calls", sa.Integer(), nullable=False),
        sa.Column("resumptions", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("received_at", sa.Double(), nullable=False),
        sa.Column("first_token_s", sa.Double(), nullable=True),
        sa.Column("finished_s", sa.Double(), nullable=True),
        sa.Column("backend_s", sa.Double(), nullable=True),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name="fk_turns_session_id_sessions"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_turns"),
        sa.UniqueConstraint("session_id", "seq", name="uq_turns_session_id_seq"),
    )


def downgrade() -> None:
    op.drop_table("turns")
    op.drop_index("ix_sessions_run_id", table_name="sessions")
    op.drop_index("ix_sessions_key", table_name="sessions")
    op.drop_table("sessions")
    op.drop_table("runs")
