"""Linear request storage: a turn stores only the messages it adds to its parent's.

Adds ``turns.messages_inherited`` (nullable). ``NULL`` keeps meaning what every existing
row holds, the whole request in ``request_messages``, so the upgrade rewrites nothing: old
rows are read as they are (``recorder.conversations``), and it is a catalogue-only change
on Postgres, however large the table. Rewriting them into the new form would save their
space, but it would hold the upgrade lock, and every replica waiting on it, for as long
as reading and rewriting the whole table takes.

New rows with a number ``n`` continue ``parent_turn_id``'s conversation: their request's
first ``n`` messages are that turn's request messages followed by its answer, and
``request_messages`` holds the rest plus the fields that differ from the parent's request.
The downgrade turns such rows back into whole requests, session by session, before it
drops the column, so the older code reads every row correctly.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

from typing import Any

import orjson
import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision: str | None = "0004"
branch_labels: str | None = None
depends_on: str | None = None

# The columns this migration reads and writes, as they are at this revision.
_turns = sa.table(
    "turns",
    sa.column("id", sa.Text()),
    sa.column("session_id", sa.Text()),
    sa.column("parent_turn_id", sa.Text()),
    sa.column("messages_inherited", sa.Integer()),
    sa.column("request_messages", sa.LargeBinary()),
    sa.column("response_message", sa.LargeBinary()),
)


def upgrade() -> None:
    with op.batch_alter_table("turns") as batch:
        batch.add_column(sa.Column("messages_inherited", sa.Integer(), nullable=True))


def downgrade() -> None:
    bind = op.get_bind()
    sessions = bind.execute(
        sa.select(_turns.c.session_id).where(_turns.c.messages_inherited.is_not(None)).distinct()
    ).scalars()
    for session_id in list(sessions):
        rows = bind.execute(sa.select(_turns).where(_turns.c.session_id == session_id)).mappings()
        whole = _whole_requests({row["id"]: dict(row) for row in rows})
        bind.execute(
            sa.update(_turns)
            .where(_turns.c.id == sa.bindparam("turn_id"))
            .values(request_messages=sa.bindparam("whole")),
            [{"turn_id": turn_id, "whole": data} for turn_id, data in whole.items()],
        )
    with op.batch_alter_table("turns") as batch:
        batch.drop_column("messages_inherited")


def _whole_requests(rows: dict[str, dict[str, Any]]) -> dict[str, bytes]:
    """The whole request JSON of every row stored in the inherited form (self-contained:
    a migration must not depend on application code that may change after it)."""
    whole: dict[str, dict[str, Any]] = {}

    def resolve(turn_id: str) -> dict[str, Any]:
        pending = [turn_id]
        while pending:
            current = rows[pending[-1]]
            if current["id"] in whole:
                pending.pop()
                continue
            stored = orjson.loads(bytes(current["request_messages"]) or b"{}")
            if current["messages_inherited"] is None:
                whole[current["id"]] = stored
                pending.pop()
                continue
            parent_id = current["parent_turn_id"]
            if parent_id not in whole:
                if parent_id not in rows or len(pending) > len(rows):
                    raise RuntimeError(f"turn {current['id']}: parent {parent_id!r} missing")
                pending.append(parent_id)
                continue
            parent = whole[parent_id]
            conversation = list(parent.get("messages") or [])
            answer = orjson.loads(bytes(rows[parent_id]["response_message"]) or b"{}")
            conversation.append(
                {
                    "role": "assistant",
                    "content": answer.get("content") or "",
                    "reasoning": answer.get("reasoning"),
                    "tool_calls": answer.get("tool_calls") or [],
                    "tool_call_id": None,
                    "name": None,
                }
            )
            merged = {**parent, **stored}
            merged["messages"] = conversation[: current["messages_inherited"]] + (
                stored.get("messages") or []
            )
            whole[current["id"]] = merged
            pending.pop()
        return whole[turn_id]

    return {
        turn_id: orjson.dumps(resolve(turn_id))
        for turn_id, row in rows.items()
        if row["messages_inherited"] is not None
    }
