"""What every turn asks of the database, and the way each database answers it fastest.

A turn costs the store two operations: its admission's status read, and its share of the
writer's batch (insert the turns, idempotent by id; store ``failed`` with ``LATE_ERROR``
the completed turns whose session is already finished; re-label the turns named in
``side_requests``). Both sit on every turn's hot path, so each database gets its own
implementation of this one contract (``PerTurn``):

- ``status(session_id, action)``: ``(status, termination)`` of the session, or None for an
  unknown one; no transaction of its own.
- ``write(values, relabels, action)``: the rows in one transaction; the ids of the
  completed turns stored late. The session rows are locked ``FOR SHARE`` (SQLite: the
  write lock serializes) so a concurrent finish either sees the turn or the turn sees
  the finish. Writing a turn again is a no-op.
- ``close()``; both raise database failures as the project's errors naming ``action``
  (``recorder.database``).

``OverSqlAlchemy`` (SQLite, and any ``Store`` built on an engine alone) runs them as
SQLAlchemy statements built once (SQLAlchemy memoizes a statement object's cache key), on
a ``recorder.runner``. Postgres gets ``recorder.postgres_turns``: the same contract on
asyncpg directly, without SQLAlchemy's greenlet adaptation of the driver.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import Insert, Select, Update, bindparam, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection
from sqlalchemy.sql.dml import ReturningInsert

from recorder import rows
from recorder.records import SessionStatus, TurnStatus
from recorder.runner import Runner
from recorder.schema import sessions, turns

LATE_ERROR = "the session was finished before this turn was recorded"

Values = Sequence[dict[str, object]]  # encoded ``turns`` rows (``recorder.rows``), unique ids
Relabels = Sequence[tuple[object, list[object]]]  # (session id, ids its turn named)


class PerTurn(Protocol):
    async def status(self, session_id: str, action: str) -> tuple[str, str | None] | None: ...

    async def write(self, values: Values, relabels: Relabels, action: str) -> set[str]: ...

    async def close(self) -> None: ...


def late_turns(values: Values, inserted: set[str], finished: set[str]) -> set[str]:
    """The completed turns, inserted now, of sessions already finished."""
    return {
        str(row["id"])
        for row in values
        if row["id"] in inserted
        and row["session_id"] in finished
        and row["status"] == TurnStatus.COMPLETED.value
    }


class OverSqlAlchemy:
    """The per-turn operations as SQLAlchemy statements, each transaction run whole by a
    ``recorder.runner``."""

    def __init__(self, runner: Runner, *, sqlite_dialect: bool) -> None:
        self._runner = runner
        dialect = sqlite if sqlite_dialect else postgresql
        # Only a clash on the id is a duplicate; a clash on (session_id, seq) with another
        # id is a real conflict and must fail rather than silently drop a turn.
        self._statements = _Statements.build(
            dialect.insert(turns).on_conflict_do_nothing(index_elements=["id"])
        )

    async def status(self, session_id: str, action: str) -> tuple[str, str | None] | None:
        query, params = self._statements.status, {"b_session": session_id}
        row = await self._runner.read(lambda conn: conn.execute(query, params).first(), action)
        return None if row is None else (str(row.status), row.termination)

    async def write(self, values: Values, relabels: Relabels, action: str) -> set[str]:
        statements = self._statements
        return await self._runner.run(
            lambda conn: _write_rows(conn, statements, values, relabels), action
        )

    async def close(self) -> None:
        await self._runner.close()


@dataclass(frozen=True, slots=True)
class _Statements:
    """Built once per store: executing the same statement object again skips building its
    cache key (the database layer of ``bench.hotpath`` went from 1.0 to 0.7 ms per turn)."""

    status: Select[Any]
    insert: ReturningInsert[Any]
    finished: Select[Any]
    late: Update
    relabel: Update

    @classmethod
    def build(cls, insert: Insert) -> _Statements:
        # Bind names differ from column names: an UPDATE reserves those for its values.
        return cls(
            status=select(sessions.c.status, sessions.c.termination).where(
                sessions.c.id == bindparam("b_session")
            ),
            insert=insert.returning(turns.c.id),
            # After the insert (SQLite: the write lock is held now), so that a finish
            # committed before this point is seen, and one still running waits for this
            # transaction (Postgres: FOR SHARE conflicts with its row update).
            finished=select(sessions.c.id)
            .where(sessions.c.id.in_(bindparam("b_sessions", expanding=True)))
            .where(sessions.c.status == SessionStatus.FINISHED.value)
            .with_for_update(read=True),
            late=update(turns)
            .where(turns.c.id.in_(bindparam("b_turns", expanding=True)))
            .values(status=TurnStatus.FAILED.value, error=LATE_ERROR),
            relabel=update(turns)
            .where(turns.c.session_id == bindparam("b_session"))
            .where(turns.c.id.in_(bindparam("b_turns", expanding=True)))
            .where(turns.c.classification == "root")
            .values(
                classification=rows.SIDE_REQUEST_CLASSIFICATION,
                fork_reason=rows.SIDE_REQUEST_REASON,
            ),
        )


def _write_rows(
    conn: Connection, statements: _Statements, values: Values, relabels: Relabels
) -> set[str]:
    inserted = set(conn.execute(statements.insert, list(values)).scalars())
    finished = set(
        conn.scalars(
            statements.finished, {"b_sessions": sorted({str(row["session_id"]) for row in values})}
        )
    )
    late = late_turns(values, inserted, finished)
    if late:
        conn.execute(statements.late, {"b_turns": sorted(late)})
    for session_id, named in relabels:
        conn.execute(statements.relabel, {"b_session": session_id, "b_turns": named})
    return late
