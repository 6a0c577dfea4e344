"""The per-turn operations on Postgres (``recorder.per_turn.PerTurn``), on asyncpg directly.

SQLAlchemy's async engine reaches asyncpg through a greenlet per statement and a DBAPI
adaptation layer; on the turn's hot path that cost 1.3 ms of CPU per turn against 0.35 ms
for the same work here (measured on the development machine with 250-token turns). Every
other statement of the recorder stays on SQLAlchemy.

- ``status``: one prepared ``SELECT`` on a pooled connection, outside any transaction;
  ``pause_state`` the same.
- ``write``: ONE statement, committed by itself. A ``WITH`` clause locks the batch's
  session rows ``FOR SHARE`` (a finish running now waits for this statement, one committed
  before it is seen), the rows are inserted from ``unnest`` of one array per column (the
  same statement text for any batch size, so it is prepared once; a batch of one row,
  every lone turn's, from ``VALUES`` of one parameter per column instead: 40 arrays cost
  asyncpg and the server about 100 us of CPU each per row more than 40 scalars,
  ``docs/performance.md``), ``ON CONFLICT (id) DO
  NOTHING`` makes it idempotent by id, and a completed turn of a finished session goes in
  ``failed`` with ``LATE_ERROR`` directly. A turn of no session still fails its foreign key
  (the lock is a left join). A batch that re-labels side requests runs the insert and the
  updates in one transaction.
- Values are bound as SQLAlchemy binds them (``recorder.per_turn.TurnColumns``), so a row
  reads back the same whichever path wrote it.
- Failures become the project's errors (``recorder.database.translated_asyncpg``). A
  statement that finds its pooled connection gone (a database restart, an idle timeout)
  expires the pool's connections and runs once more on a new one: both operations are
  idempotent. A cancelled ``write`` may still commit on the server, as with any driver.
- A statement runs on the **lane**, one connection held for the store's life, whenever
  the lane is free: a turn alone in flight (c=1) then pays no pool checkout and return,
  which cost asyncpg's pool about 40 us of CPU per statement on the development machine
  (``docs/performance.md``), two statements a turn. Statements that find the lane busy
  take a pooled connection. A lane statement cut short by anything but the server's own
  error (a cancel, a lost connection) drops the lane, which reconnects on its next use.
- The pool holds at most ``POOL_SIZE`` connections of its own, beside the lane and the
  engine's, and connects on first use.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import asyncpg
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncEngine

from kernel.errors import LegoError, RecorderUnavailable
from recorder import rows
from recorder.database import translated_asyncpg
from recorder.per_turn import (
    LATE_ERROR,
    PAUSE_STATE_SQL,
    Relabels,
    TurnColumns,
    Values,
    pause_state_of,
)
from recorder.records import PauseState, SessionStatus, TurnStatus
from recorder.schema import turns

POOL_SIZE = 10
LANE_CLOSE_TIMEOUT_S = 5.0
T = TypeVar("T")
if TYPE_CHECKING:  # the proxy is generic in asyncpg-stubs only
    Connection = (
        asyncpg.pool.PoolConnectionProxy[asyncpg.Record] | asyncpg.Connection[asyncpg.Record]
    )
    Connect = Callable[[], Awaitable[asyncpg.Connection[asyncpg.Record]]]


@dataclass(frozen=True, slots=True)
class _Sql:
    columns: TurnColumns
    status: str
    insert: str  # rows from unnest(one array per column): any number of rows
    insert_one: str  # the same for one row, from VALUES(one parameter per column)
    relabel: str

    @classmethod
    def build(cls) -> _Sql:
        dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
        columns = TurnColumns.of_table()
        names = columns.names
        types = {column.name: column.type.compile(dialect=dialect) for column in turns.columns}
        late = (
            f"u.status = '{TurnStatus.COMPLETED.value}' "
            f"AND s.status = '{SessionStatus.FINISHED.value}'"
        )
        sessions_arg, late_error_arg = len(names) + 1, len(names) + 2
        chosen = {
            "status": f"CASE WHEN {late} THEN '{TurnStatus.FAILED.value}' ELSE u.status END",
            "error": f"CASE WHEN {late} THEN ${late_error_arg}::text ELSE u.error END",
        }
        selected = ", ".join(chosen.get(name, f"u.{name}") for name in names)
        arrays = ", ".join(f"${i}::{types[name]}[]" for i, name in enumerate(names, 1))
        scalars = ", ".join(f"${i}::{types[name]}" for i, name in enumerate(names, 1))

        def insert_from(source: str) -> str:
            return (
                f"WITH s AS (SELECT id, status FROM sessions "
                f"WHERE id = ANY(${sessions_arg}::text[]) FOR SHARE) "
                f"INSERT INTO turns ({', '.join(names)}) SELECT {selected} "
                f"FROM {source} AS u({', '.join(names)}) LEFT JOIN s ON s.id = u.session_id "
                "ON CONFLICT (id) DO NOTHING RETURNING id, status"
            )

        relabel = (
            "UPDATE turns SET classification = $3, fork_reason = $4 "
            "WHERE session_id = $1 AND id = ANY($2::text[]) AND classification = 'root'"
        )
        return cls(
            columns=columns,
            status="SELECT status, termination FROM sessions WHERE id = $1",
            insert=insert_from(f"unnest({arrays})"),
            insert_one=insert_from(f"(VALUES ({scalars}))"),
            relabel=relabel,
        )

    def arguments(self, values: Values) -> tuple[str, list[object]]:
        """The insert for ``values`` and its column arguments, in ``columns.names`` order:
        one row's values, or one array per column."""
        rows = [self.columns.values(row) for row in values]
        if len(rows) == 1:
            return self.insert_one, rows[0]
        return self.insert, [list(column) for column in zip(*rows, strict=True)]


async def _nothing_to_reset(_conn: asyncpg.Connection[asyncpg.Record]) -> None:
    """A released connection keeps its session as it is: nothing here sets, listens or
    locks anything that outlives a statement, and the pool itself rolls back a
    transaction left open (a cancelled write). asyncpg's default reset is a round trip
    (``RESET ALL``, ``UNLISTEN *``, ...) on every release: one per status read."""


class PostgresTurns:
    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        connect: Connect | None = None,
        on_lost: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """``connect`` opens the lane's connection (None: no lane, every statement on
        the pool)."""
        self._pool = pool
        self._connect = connect
        self._lane: asyncpg.Connection[asyncpg.Record] | None = None
        self._lane_busy = False
        self._on_lost = on_lost
        self._sql = _Sql.build()

    @classmethod
    async def open(
        cls, engine: AsyncEngine, *, on_lost: Callable[[], Awaitable[None]] | None = None
    ) -> PostgresTurns:
        """A pool on the database ``engine`` (the store's, on a ``postgresql+asyncpg://``
        URL) connects to, with the connect arguments its dialect passes asyncpg; it
        connects on first use. ``on_lost`` is awaited when a statement found its
        connection gone (the store drops its engine's idle connections too: they went with
        the same restart)."""
        _, arguments = engine.dialect.create_connect_args(engine.url)
        if "prepared_statement_cache_size" in arguments:
            arguments["statement_cache_size"] = arguments.pop("prepared_statement_cache_size")
        arguments.pop("prepared_statement_name_func", None)
        pool = await asyncpg.create_pool(
            min_size=0, max_size=POOL_SIZE, reset=_nothing_to_reset, **arguments
        )

        async def connect() -> asyncpg.Connection[asyncpg.Record]:
            return await asyncpg.connect(**arguments)

        return cls(pool, connect=connect, on_lost=on_lost)

    async def status(self, session_id: str, action: str) -> tuple[str, str | None] | None:
        row = await self._run(lambda conn: conn.fetchrow(self._sql.status, session_id), action)
        return None if row is None else (str(row["status"]), row["termination"])

    async def pause_state(self, action: str) -> PauseState:
        found = await self._run(lambda conn: conn.fetch(PAUSE_STATE_SQL), action)
        return pause_state_of([tuple(row) for row in found])

    def write_now(self, values: Values, relabels: Relabels, action: str) -> set[str] | None:
        """Never: every statement is a round trip to the server, awaited."""
        return None

    def can_write_now(self) -> bool:
        return False

    async def write(self, values: Values, relabels: Relabels, action: str) -> set[str]:
        statement, arguments = self._sql.arguments(values)
        session_ids = sorted({str(row["session_id"]) for row in values})

        async def insert(conn: Connection) -> list[asyncpg.Record]:
            return list(await conn.fetch(statement, *arguments, session_ids, LATE_ERROR))

        async def insert_and_relabel(conn: Connection) -> list[asyncpg.Record]:
            async with conn.transaction():
                inserted = await insert(conn)
                for session_id, named in relabels:
                    await conn.execute(
                        self._sql.relabel,
                        session_id,
                        [str(turn_id) for turn_id in named],
                        rows.SIDE_REQUEST_CLASSIFICATION,
                        rows.SIDE_REQUEST_REASON,
                    )
                return inserted

        stored = await self._run(insert_and_relabel if relabels else insert, action)
        # A completed turn that went in failed was late (its session finished first).
        completed = TurnStatus.COMPLETED.value
        sent = {str(row["id"]) for row in values if row["status"] == completed}
        failed = TurnStatus.FAILED.value
        return {str(row["id"]) for row in stored if row["id"] in sent and row["status"] == failed}

    async def close(self) -> None:
        lane, self._lane, self._connect = self._lane, None, None
        if lane is not None:
            try:
                await lane.close(timeout=LANE_CLOSE_TIMEOUT_S)
            except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError):
                lane.terminate()  # the server is away: nothing to say goodbye to
        await self._pool.close()

    async def _run(self, operation: Callable[[Connection], Awaitable[T]], action: str) -> T:
        try:
            return await self._attempt(operation, action)
        except RecorderUnavailable:
            # Its connection was gone (a restart, an idle timeout): so may be every idle
            # one in the pool. Both operations are idempotent; the second failure stands.
            if not self._lane_busy:  # a lane in use now proves itself (or is dropped)
                self._drop_lane()
            await self._pool.expire_connections()
            if self._on_lost is not None:
                await self._on_lost()
            return await self._attempt(operation, action)

    async def _attempt(self, operation: Callable[[Connection], Awaitable[T]], action: str) -> T:
        try:
            if not self._lane_busy and self._connect is not None:
                return await self._on_lane(self._connect, operation)
            async with self._pool.acquire() as conn:
                return await operation(conn)
        except LegoError:
            raise
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError) as exc:
            # asyncpg reports a value it cannot encode as DataError (SQLSTATE 22000).
            raise translated_asyncpg(exc, action) from exc

    async def _on_lane(
        self, connect: Connect, operation: Callable[[Connection], Awaitable[T]]
    ) -> T:
        self._lane_busy = True
        try:
            lane = self._lane
            if lane is None or lane.is_closed():
                lane = self._lane = await connect()
            try:
                return await operation(lane)
            except asyncpg.PostgresError:
                # The server refused the statement and said so: the connection is as
                # good as before, unless something left a transaction open on it.
                if lane.is_in_transaction():
                    self._drop_lane()
                raise
            except BaseException:
                # Cancelled, or the connection failed mid-statement: its state is
                # unknown, so it goes; the next statement on the lane reconnects.
                self._drop_lane()
                raise
        finally:
            self._lane_busy = False

    def _drop_lane(self) -> None:
        lane, self._lane = self._lane, None
        if lane is not None:
            lane.terminate()
