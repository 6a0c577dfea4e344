"""The recorder's tables (SQLAlchemy Core), portable between Postgres and SQLite.

This module is the schema's source of truth for queries; ``migrations/`` creates it, and a
test checks that a migrated database matches this ``metadata`` exactly.

Encodings (see ``codec``): token ids are little-endian int32 bytes, logprobs little-endian
float32 bytes, routed experts the smallest unsigned integer type that holds every expert
id (``routed_experts_dtype``) with their ``[rows, layers, top_k]`` shape in
``routed_experts_num_layers``/``routed_experts_top_k``. Timestamps are epoch seconds.
JSON columns are ``JSONB`` on Postgres so they can be queried and indexed later.

Linear storage: a turn that continues a parent stores only ``prompt_ids`` after
``prompt_offset`` (the ids shared with the parent's prompt + output); readers rebuild the
full prompt by walking ``parent_turn_id`` within the session (``store``). On Postgres the
array columns are stored uncompressed (``STORAGE EXTERNAL``, migration 0003): token ids and
routing ids barely compress, and trying costs ingest throughput. Requests are stored the
same way (migration 0005): a turn that continues its parent's conversation stores only the
messages it adds, and ``messages_inherited`` says how many leading messages it shares with
that conversation (``recorder.conversations`` owns the format and the rebuild).

Export bookkeeping: ``prompt_groups`` says when a group is complete (its declared
``size``, or ``closed_at``); ``weight_versions`` is the announced policy order of a run;
``group_leases`` holds one row per prompt group ever handed out (or skipped), pointing at
the ``batches`` row whose lease currently owns it; ``alignment_reports`` stores the
trainer's rollout/trainer agreement per step.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Double,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.sql.expression import false, text

# Deterministic constraint names, so migrations can refer to them on every dialect.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

JsonColumn = JSON().with_variant(JSONB(), "postgresql")

metadata = MetaData(naming_convention=NAMING_CONVENTION)

runs = Table(
    "runs",
    metadata,
    Column("id", Text, primary_key=True),
    Column("name", Text, nullable=False, unique=True),
    Column("created_at", Double, nullable=False),
    # Paused around a weight sync: every replica holds the run's new turns (proxy.gate).
    Column("paused", Boolean, nullable=False, server_default=false()),
)

sessions = Table(
    "sessions",
    metadata,
    Column("id", Text, primary_key=True),
    Column("key", Text, nullable=False),
    Column("run_id", Text, ForeignKey("runs.id"), nullable=False),
    Column("task_id", Text, nullable=False),
    Column("group_id", Text, nullable=False),
    Column("sample_index", Integer, nullable=False),
    Column("harness", Text, nullable=False),
    Column("sampling", JsonColumn, nullable=False),
    Column("max_prompt_tokens", Integer, nullable=True),
    Column("max_output_tokens", Integer, nullable=True),
    Column("status", Text, nullable=False),
    Column("termination", Text, nullable=True),
    Column("reward", Double, nullable=True),
    Column("reward_details", JsonColumn, nullable=True),
    Column("created_at", Double, nullable=False),
    Column("finished_at", Double, nullable=True),
    Column("reward_vector", JsonColumn, nullable=True),  # set instead of reward for vectors
    # What the trial reported at finish (migration 0009): {stage: seconds} and the
    # defenses' events as a list of {"kind", ...}; NULL when it reported none.
    Column("stages", JsonColumn, nullable=True),
    Column("defense_events", JsonColumn, nullable=True),
    # recorder.records.PURPOSES (migration 0010): the export hands out "train" only.
    Column("purpose", Text, nullable=False, server_default=text("'train'")),
    Index(None, "key", unique=True),
    Index(None, "run_id"),
)

turns = Table(
    "turns",
    metadata,
    Column("id", Text, primary_key=True),
    Column("session_id", Text, ForeignKey("sessions.id"), nullable=False),
    # Arrival order across every replica: microseconds since the epoch when the request was
    # received (a continuation always arrives after the turn it continues finished).
    Column("seq", BigInteger, nullable=False),
    Column("adapter", Text, nullable=False),
    Column("requested_model", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("finish_reason", Text, nullable=False),
    Column("weight_version", Text, nullable=False),
    Column("prompt_ids", LargeBinary, nullable=False),
    Column("output_ids", LargeBinary, nullable=False),
    Column("logprobs", LargeBinary, nullable=False),
    Column("routed_experts", LargeBinary, nullable=True),
    Column("routed_experts_start", Integer, nullable=True),
    Column("routed_experts_num_layers", Integer, nullable=True),
    Column("routed_experts_top_k", Integer, nullable=True),
    Column("routed_experts_dtype", Text, nullable=True),
    Column("sampling_params", JsonColumn, nullable=False),
    Column("request_messages", LargeBinary, nullable=False),
    Column("response_message", LargeBinary, nullable=False),
    Column("ignored_fields", JsonColumn, nullable=False),
    Column("malformed_tool_calls", Integer, nullable=False),
    Column("resumptions", Integer, nullable=False),
    Column("error", Text, nullable=True),
    # History ledger: the turn this one continues and how (see proxy.ledger).
    Column("parent_turn_id", Text, nullable=True),
    Column("classification", Text, nullable=False, server_default="root"),
    Column("fork_reason", Text, nullable=True),
    Column("reused_prefix_len", Integer, nullable=False, server_default="0"),
    Column("received_at", Double, nullable=False),
    Column("first_token_s", Double, nullable=True),
    Column("finished_s", Double, nullable=True),
    Column("backend_s", Double, nullable=True),
    Column("created_at", Double, nullable=False),
    Column("prompt_offset", Integer, nullable=False, server_default="0"),
    Column("weight_version_spans", JsonColumn, nullable=True),
    # NULL: request_messages holds the whole request; n: its first n messages are the
    # parent's conversation's (recorder.conversations).
    Column("messages_inherited", Integer, nullable=True),
    # Earlier turns of the session this one showed to be side requests (migration 0006).
    Column("side_requests", JsonColumn, nullable=True),
    # Not unique: replicas stamp seq independently, and a clash must never cost a turn.
    Index(None, "session_id", "seq"),
)

weight_versions = Table(
    "weight_versions",
    metadata,
    Column("run_id", Text, ForeignKey("runs.id"), primary_key=True),
    Column("idx", Integer, primary_key=True),
    Column("version", Text, nullable=False),
    Column("created_at", Double, nullable=False),
    UniqueConstraint("run_id", "version"),
)

batches = Table(
    "batches",
    metadata,
    Column("id", Text, primary_key=True),
    Column("run_id", Text, ForeignKey("runs.id"), nullable=False),
    Column("created_at", Double, nullable=False),
    Column("lease_expires_at", Double, nullable=False),
    Column("acked_at", Double, nullable=True),
    Column("group_count", Integer, nullable=False),
)

group_leases = Table(
    "group_leases",
    metadata,
    Column("run_id", Text, ForeignKey("runs.id"), primary_key=True),
    Column("group_id", Text, primary_key=True),
    Column("state", Text, nullable=False),  # leased | acked | skipped
    Column("batch_id", Text, nullable=True),
    Column("lease_expires_at", Double, nullable=True),
    Column("updated_at", Double, nullable=False),
)

# One row: this database's random id (migration 0007); journals and spools are kept per id.
recorder_identity = Table(
    "recorder_identity",
    metadata,
    Column("id", Text, primary_key=True),
    Column("created_at", Double, nullable=False),
)

# One row per prompt group: the size the orchestrator declared, and whether it is closed.
prompt_groups = Table(
    "prompt_groups",
    metadata,
    Column("run_id", Text, ForeignKey("runs.id"), primary_key=True),
    Column("group_id", Text, primary_key=True),
    Column("size", Integer, nullable=True),
    Column("closed_at", Double, nullable=True),
    Column("created_at", Double, nullable=False),
)

alignment_reports = Table(
    "alignment_reports",
    metadata,
    Column("run_id", Text, ForeignKey("runs.id"), primary_key=True),
    Column("step", Integer, primary_key=True),
    Column("weight_version", Text, nullable=False),
    Column("metrics", JsonColumn, nullable=False),
    Column("flagged", Integer, nullable=False),
    Column("created_at", Double, nullable=False),
    Column("reasons", JsonColumn, nullable=True),  # migration 0010: why it was flagged
)

# Backend workers a trainer took out of rotation after a failed weight sync (migration
# 0008): every replica reads this, as it reads paused runs, and routes no turn to them.
worker_exclusions = Table(
    "worker_exclusions",
    metadata,
    Column("url", Text, primary_key=True),
    Column("reason", Text, nullable=False),
    Column("created_at", Double, nullable=False),
)
