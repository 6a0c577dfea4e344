"""The recorder's tables (SQLAlchemy Core), portable between Postgres and SQLite.

This module is the schema's source of truth for queries; ``migrations/`` creates it, and a
test checks that a migrated database matches this ``metadata`` exactly.

Encodings (see ``codec``): token ids are little-endian int32 bytes, logprobs little-endian
float32 bytes, routed experts the smallest unsigned integer type that holds every expert
id (``routed_experts_dtype``) with their ``[rows, layers, top_k]`` shape in
``routed_experts_num_layers``/``routed_experts_top_k``. Timestamps are epoch seconds.
JSON columns are ``JSONB`` on Postgres so they can be queried and indexed later.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
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
    Index(None, "key", unique=True),
    Index(None, "run_id"),
)

turns = Table(
    "turns",
    metadata,
    Column("id", Text, primary_key=True),
    Column("session_id", Text, ForeignKey("sessions.id"), nullable=False),
    Column("seq", Integer, nullable=False),
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
    # Its index leads with session_id, so it also serves "turns of a session" lookups; a
    # separate session_id index would only slow every insert down.
    UniqueConstraint("session_id", "seq"),
)
