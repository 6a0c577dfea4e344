"""Linear turn storage, reward vectors, and the export API's tables.

Existing turns keep their full prompts (``prompt_offset`` 0). On Postgres the per-token
array columns switch to uncompressed out-of-line storage: they do not compress, and pglz
trying on every write costs ingest throughput.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None

_ARRAY_COLUMNS = ("prompt_ids", "output_ids", "logprobs", "routed_experts")


def _json() -> sa.JSON:
    return sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("turns") as batch:
        batch.add_column(
            sa.Column("prompt_offset", sa.Integer(), nullable=False, server_default="0")
        )
        batch.add_column(sa.Column("weight_version_spans", _json(), nullable=True))
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("reward_vector", _json(), nullable=True))
    if op.get_bind().dialect.name == "postgresql":
        for column in _ARRAY_COLUMNS:
            op.execute(f"ALTER TABLE turns ALTER COLUMN {column} SET STORAGE EXTERNAL")
    op.create_table(
        "weight_versions",
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("version", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_weight_versions_run_id_runs"),
        sa.PrimaryKeyConstraint("run_id", "idx", name="pk_weight_versions"),
        sa.UniqueConstraint("run_id", "version", name="uq_weight_versions_run_id_version"),
    )
    op.create_table(
        "batches",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("lease_expires_at", sa.Double(), nullable=False),
        sa.Column("acked_at", sa.Double(), nullable=True),
        sa.Column("group_count", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_batches_run_id_runs"),
        sa.PrimaryKeyConstraint("id", name="pk_batches"),
    )
    op.create_table(
        "group_leases",
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("group_id", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("batch_id", sa.Text(), nullable=True),
        sa.Column("lease_expires_at", sa.Double(), nullable=True),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_group_leases_run_id_runs"),
        sa.PrimaryKeyConstraint("run_id", "group_id", name="pk_group_leases"),
    )
    op.create_table(
        "alignment_reports",
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("weight_version", sa.Text(), nullable=False),
        sa.Column("metrics", _json(), nullable=False),
        sa.Column("flagged", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_alignment_reports_run_id_runs"),
        sa.PrimaryKeyConstraint("run_id", "step", name="pk_alignment_reports"),
    )


def downgrade() -> None:
    op.drop_table("alignment_reports")
    op.drop_table("group_leases")
    op.drop_table("batches")
    op.drop_table("weight_versions")
    if op.get_bind().dialect.name == "postgresql":
        for column in _ARRAY_COLUMNS:
            op.execute(f"ALTER TABLE turns ALTER COLUMN {column} SET STORAGE EXTENDED")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("reward_vector")
    with op.batch_alter_table("turns") as batch:
        batch.drop_column("weight_version_spans")
        batch.drop_column("prompt_offset")
