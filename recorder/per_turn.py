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
- ``write_now(values, relabels, action)``: the same write done at once on the calling
  thread, without awaiting anything, or None (nothing written) when this database cannot
  (only a SQLite file's connection on the event loop can: ``recorder.sqlite_turns``). The
  turn writer takes a lone turn this way, without its queue's task hand-offs.
- ``pause_state(action)``: the paused runs and the workers out of rotation, what every
  replica polls twice a second (``PAUSE_STATE_SQL``: one statement, so one snapshot, on
  any database). With that poll through SQLAlchemy's async engine an idle proxy on SQLite
  spent 6.7-8.0 ms of CPU a second; on this path 3.3-4.0.
- ``close()``; all raise database failures as the project's errors naming ``action``
  (``recorder.database``).

Each runs on its driver directly: ``recorder.postgres_turns`` (asyncpg) and
``recorder.sqlite_turns`` (``sqlite3`` on the event loop, on threads of its own when a lock
must be waited for): through SQLAlchemy's async
engine every DBAPI call is a greenlet switch (and on SQLite a thread hop), more CPU than
the statements themselves. ``OverSqlAlchemy`` is the same contract on the store's async
engine, for an in-memory SQLite database (a second connection would see another, empty
database) and any ``Store`` built on an engine alone: each transaction runs whole in one
greenlet (``AsyncConnection.run_sync``), its statements built once (SQLAlchemy memoizes a
statement object's cache key).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import (
    JSON,
    DefaultClause,
    Insert,
    LargeBinary,
    Select,
    Update,
    bindparam,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql.dml import ReturningInsert

from recorder import rows
from recorder.database import autocommit, transaction
from recorder.records import PauseState, SessionStatus, TurnStatus
from recorder.schema import sessions, turns

LATE_ERROR = "the session was finished before this turn was recorded"

Values = Sequence[dict[str, object]]  # encoded ``turns`` rows (``recorder.rows``), unique ids
Relabels = Sequence[tuple[object, list[object]]]  # (session id, ids its turn named)
# (kind, key, reason) rows: ('run', run id, NULL) per paused run, ('worker', url, why) per
# excluded worker. Plain SQL that SQLite and Postgres both read the same way.
PAUSE_STATE_SQL = (
    "SELECT 'run', id, NULL FROM runs WHERE paused "
    "UNION ALL SELECT 'worker', url, reason FROM worker_exclusions"
)


class PerTurn(Protocol):
    async def status(self, session_id: str, action: str) -> tuple[str, str | None] | None: ...

    async def write(self, values: Values, relabels: Relabels, action: str) -> set[str]: ...

    def write_now(self, values: Values, relabels: Relabels, action: str) -> set[str] | None: ...

    def can_write_now(self) -> bool:
        """Whether ``write_now`` would try (it may still find SQLite busy)."""
        ...

    async def pause_state(self, action: str) -> PauseState: ...

    async def close(self) -> None: ...


def pause_state_of(found: Sequence[Sequence[Any]]) -> PauseState:
    """``PAUSE_STATE_SQL``'s rows as the state they say."""
    return PauseState(
        paused_runs=frozenset(str(key) for kind, key, _ in found if kind == "run"),
        worker_exclusions={str(key): str(why) for kind, key, why in found if kind == "worker"},
    )


@dataclass(frozen=True, slots=True)
class TurnColumns:
    """The ``turns`` columns in table order, and each row's values for them bound the way
    SQLAlchemy binds them (JSON columns ``json.dumps``'d, ``None`` as JSON ``null``), so a
    row reads back the same whichever path wrote it."""

    names: tuple[str, ...]
    json_columns: frozenset[str]
    defaults: dict[str, object]  # for a column a row spooled before it existed lacks
    # Per column in ``names`` order: (name, its default, is JSON), built once, so that a
    # row's values cost one dict lookup a column (``values`` runs on every turn's path).
    layout: tuple[tuple[str, object, bool], ...]
    # Where ``values`` puts the columns whose size varies with the turn (token arrays,
    # messages, JSON): what a write adds to the database beyond its fixed-size fields.
    sized: tuple[int, ...]

    @classmethod
    def of_table(cls) -> TurnColumns:
        names = tuple(column.name for column in turns.columns)
        json_columns = frozenset(
            column.name for column in turns.columns if isinstance(column.type, JSON)
        )
        defaults = {
            column.name: _literal(column.server_default.arg, column.type.python_type)
            for column in turns.columns
            if isinstance(column.server_default, DefaultClause)
        }
        return cls(
            names=names,
            json_columns=json_columns,
            defaults=defaults,
            layout=tuple((name, defaults.get(name), name in json_columns) for name in names),
            sized=tuple(
                index
                for index, column in enumerate(turns.columns)
                if isinstance(column.type, (JSON, LargeBinary))
            ),
        )

    def values(self, row: dict[str, object]) -> list[object]:
        """One row's values, in ``names`` order."""
        get = row.get
        return [
            json.dumps(get(name, default)) if is_json else get(name, default)
            for name, default, is_json in self.layout
        ]

    def size(self, values: list[object]) -> int:
        """The bytes of ``values``' variable-size columns (``values``' own output)."""
        return sum(
            len(value) for index in self.sized if isinstance(value := values[index], (bytes, str))
        )


def _literal(arg: object, python_type: type) -> object:
    # The schema's server defaults are plain literals ('root', '0').
    return python_type(str(getattr(arg, "text", arg)).strip("'"))


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
    """The per-turn operations as SQLAlchemy statements on an async engine (which belongs
    to the store: ``close`` leaves it be)."""

    def __init__(self, engine: AsyncEngine, *, sqlite_dialect: bool) -> None:
        self._engine = engine
        dialect = sqlite if sqlite_dialect else postgresql
        # Only a clash on the id is a duplicate; a clash on (session_id, seq) with another
        # id is a real conflict and must fail rather than silently drop a turn.
        self._statements = _Statements.build(
            dialect.insert(turns).on_conflict_do_nothing(index_elements=["id"])
        )

    async def status(self, session_id: str, action: str) -> tuple[str, str | None] | None:
        query, params = self._statements.status, {"b_session": session_id}
        # No BEGIN and COMMIT around one read: two round trips fewer on Postgres.
        async with autocommit(self._engine, action) as conn:
            row = await conn.run_sync(lambda sync: sync.execute(query, params).first())
        return None if row is None else (str(row.status), row.termination)

    async def write(self, values: Values, relabels: Relabels, action: str) -> set[str]:
        statements = self._statements
        async with transaction(self._engine, action) as conn:
            return await conn.run_sync(lambda sync: _write_rows(sync, statements, values, relabels))

    def write_now(self, values: Values, relabels: Relabels, action: str) -> set[str] | None:
        """Never: the async engine's statements are awaited."""
        return None

    def can_write_now(self) -> bool:
        return False

    async def pause_state(self, action: str) -> PauseState:
        async with autocommit(self._engine, action) as conn:
            found = await conn.run_sync(lambda sync: sync.execute(_PAUSE_STATE).all())
        return pause_state_of(found)

    async def close(self) -> None:
        """The engine belongs to the store, which disposes of it."""


_PAUSE_STATE = text(PAUSE_STATE_SQL)


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
