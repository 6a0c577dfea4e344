"""The recorder's storage API: runs, sessions and turns over one pooled ``AsyncEngine``.

Contract:
- ``Store.open(url)`` connects lazily and never migrates (``recorder.migrate`` does).
- Lookups of unknown runs/sessions raise ``NotFound``; finishing a finished session and
  reusing a run name raise ``Conflict``; a turn that can never be stored (its seq taken by
  another turn, its session unknown, arrays that do not encode) raises ``Conflict`` or
  ``InvalidRequest``; every other database failure raises ``RecorderError``. Driver
  exceptions never escape (they stay attached as ``__cause__`` for the logs).
- ``write_turns`` is one transaction and idempotent by turn id: writing a turn again is a
  no-op, so a writer may retry a batch after an ambiguous failure.
- Finish is a barrier (``write_rows``/``finish_session``): a completed turn whose row
  reaches the database after its session was finished is stored ``failed`` with
  ``recorder.per_turn.LATE_ERROR`` (``write_rows`` returns those ids), so a finished
  session's turns, and the group exported from them, never change. The session rows are
  locked ``FOR SHARE`` in the write's transaction (SQLite: the write lock serializes), so
  a finish either sees the turn or the turn sees the finish, on every replica.
- The two operations every turn makes (admission's status read, the writer's batch) run
  the fastest way each database has (``recorder.per_turn``): on its driver directly
  (``recorder.postgres_turns``, ``recorder.sqlite_turns``).
- ``finish_session`` stores the trial's report with the reward (``stages``, the
  ``defense_events``; ``recorder.rows.trial_values``), in the same guarded update, and
  every session read gives it back (none: ``stages`` None, no events).
- ``list_turns`` gives back exactly what was written, in seq order, except that logprobs
  are float32-rounded (see ``codec``). ``list_turn_arrays`` gives the same turns as
  ``TurnArrays`` (what the export needs): numpy views of the stored bytes, routed experts
  in their stored dtype, without the conversation blobs.
- Rows and records are translated by ``recorder.rows`` alone: prompts stored linearly
  (``recorder.prompts``) and rebuilt by walking each parent chain inside the session
  once (a parent outside the session raises ``RecorderError``), rewards (a vector is
  stored in ``reward_vector``, ``reward`` NULL) and the side-request re-label rule.
- Requests are stored linearly too (``recorder.conversations``): ``list_turns`` gives back
  ``request_messages``/``messages_inherited`` as written; ``conversations`` rebuilds whole
  requests for a session, or for some of its turns, from one query.
- Re-labels: a turn whose ``side_requests`` names earlier turns of its session (roots found
  to be side requests) is written in the same transaction as an update of those turns'
  ``classification``/``fork_reason`` to ``fork``/``side_request``; readers apply the rule
  as well (``recorder.rows.SideRequests``), so a re-label written before the turn it names
  still holds.
- ``engine`` is for the recorder's own read models (``recorder.read_models``).
"""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import Collection, Sequence
from typing import Any

from sqlalchemy import ColumnElement, func, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from kernel.errors import Conflict, NotFound, RecorderError
from recorder import groups, rows
from recorder.conversations import Conversation, StoredRequest, rebuild
from recorder.database import create_engine, is_sqlite, parse_url, transaction
from recorder.per_turn import OverSqlAlchemy, PerTurn
from recorder.postgres_turns import PostgresTurns
from recorder.records import (
    DefenseEvent,
    PauseState,
    RunInfo,
    SessionInfo,
    SessionSpec,
    SessionStatus,
    StageTimes,
    TurnArrays,
    TurnRecord,
    TurnStatus,
)
from recorder.schema import recorder_identity, runs, sessions, turns
from recorder.sqlite_turns import SqliteTurns

SESSION_KEY_PREFIX = "lego-sk-"


class Store:
    def __init__(
        self, engine: AsyncEngine, *, sqlite_dialect: bool, per_turn: PerTurn | None = None
    ) -> None:
        self._engine = engine
        self._sqlite = sqlite_dialect
        # The per-turn operations (status read, turn write): recorder.per_turn.
        self._per_turn = (
            per_turn
            if per_turn is not None
            else OverSqlAlchemy(engine, sqlite_dialect=sqlite_dialect)
        )

    @classmethod
    async def open(cls, url: str) -> Store:
        engine = create_engine(url)
        parsed = parse_url(url)
        sqlite_dialect = is_sqlite(parsed)
        per_turn: PerTurn
        if sqlite_dialect and parsed.database in (None, "", ":memory:"):
            per_turn = OverSqlAlchemy(engine, sqlite_dialect=True)  # one database per engine
        elif sqlite_dialect:
            per_turn = SqliteTurns(str(parsed.database))
        else:
            # A restart that broke the per-turn pool's connections broke the engine's too.
            per_turn = await PostgresTurns.open(engine, on_lost=engine.dispose)
        return cls(engine, sqlite_dialect=sqlite_dialect, per_turn=per_turn)

    async def close(self) -> None:
        await self._per_turn.close()
        await self._engine.dispose()

    @property
    def engine(self) -> AsyncEngine:
        """For the recorder's own read models (``recorder.read_models``); nothing above
        the recorder runs SQL (``tests/test_layers.py``)."""
        return self._engine

    async def identity(self) -> str:
        """This database's random id (migration 0007): what journals and spools are kept
        under, so none is ever replayed into another database."""
        async with transaction(self._engine, "read the database identity") as conn:
            found = await conn.scalar(select(recorder_identity.c.id))
        if found is None:
            raise RecorderError("the database has no identity row: run 'lego-proxy db upgrade'")
        return str(found)

    async def ping(self) -> None:
        """One round trip to the database; its driver's exception if there is none."""
        async with self._engine.connect() as conn:
            await conn.execute(text("SELECT 1"))

    # -- runs -----------------------------------------------------------------
    async def create_run(self, name: str) -> RunInfo:
        run = RunInfo(id=uuid.uuid4().hex, name=name, created_at=time.time())
        async with transaction(self._engine, f"create run {name!r}") as conn:
            taken = await conn.scalar(select(runs.c.id).where(runs.c.name == name))
            if taken is not None:
                raise Conflict(f"run name {name!r} is taken (run {taken})", param="name")
            await conn.execute(
                runs.insert().values(id=run.id, name=run.name, created_at=run.created_at)
            )
        return run

    async def get_run(self, run_id: str) -> RunInfo:
        async with transaction(self._engine, f"read run {run_id}") as conn:
            row = (await conn.execute(select(runs).where(runs.c.id == run_id))).first()
        if row is None:
            raise NotFound(f"run {run_id!r} not found")
        return RunInfo(id=row.id, name=row.name, created_at=row.created_at)

    async def list_runs(
        self, *, after: tuple[float, str] | None = None, limit: int = 100
    ) -> list[RunInfo]:
        """Runs in (created_at, id) order, strictly after ``after``."""
        query = select(runs).order_by(runs.c.created_at, runs.c.id).limit(limit)
        if after is not None:
            created, run_id = after
            query = query.where(
                (runs.c.created_at > created)
                | ((runs.c.created_at == created) & (runs.c.id > run_id))
            )
        async with transaction(self._engine, "list runs") as conn:
            rows = (await conn.execute(query)).all()
        return [RunInfo(id=row.id, name=row.name, created_at=row.created_at) for row in rows]

    # -- sessions -------------------------------------------------------------
    async def create_session(
        self, spec: SessionSpec, *, group_size: int | None = None
    ) -> SessionInfo:
        """A new session in ``spec.group_id``; ``group_size`` declares how many the group
        has (``recorder.groups``: ``Conflict`` when it may not join the group)."""
        info = SessionInfo(
            id=uuid.uuid4().hex,
            key=SESSION_KEY_PREFIX + secrets.token_urlsafe(24),
            spec=spec,
            status=SessionStatus.ACTIVE,
            created_at=time.time(),
        )
        async with transaction(self._engine, "create session") as conn:
            if await conn.scalar(select(runs.c.id).where(runs.c.id == spec.run_id)) is None:
                raise NotFound(f"run {spec.run_id!r} not found", param="run_id")
            await groups.join(
                conn, spec.run_id, spec.group_id, group_size, sqlite_dialect=self._sqlite
            )
            await conn.execute(sessions.insert().values(**rows.session_values(info)))
        return info

    async def close_group(self, run_id: str, group_id: str) -> groups.GroupInfo:
        async with transaction(self._engine, f"close group {group_id!r}") as conn:
            return await groups.close(conn, run_id, group_id)

    async def get_session(self, session_id: str) -> SessionInfo:
        async with transaction(self._engine, f"read session {session_id}") as conn:
            info = await self._session_where(conn, sessions.c.id == session_id)
        if info is None:
            raise NotFound(f"session {session_id!r} not found")
        return info

    async def finished_termination(self, session_id: str) -> str | None:
        """The session's termination once it is finished; None while it is active (or
        unknown). One indexed lookup: what each turn's admission asks."""
        found = await self._per_turn.status(session_id, f"read status of session {session_id}")
        if found is None or found[0] != SessionStatus.FINISHED.value:
            return None
        return str(found[1])

    async def pause_state(self) -> PauseState:
        """The paused runs and the workers out of rotation, read together: what every
        replica polls (on the per-turn path: ``recorder.per_turn``)."""
        return await self._per_turn.pause_state("read the paused runs and worker exclusions")

    async def get_session_by_key(self, key: str) -> SessionInfo | None:
        async with transaction(self._engine, "read session by key") as conn:
            return await self._session_where(conn, sessions.c.key == key)

    async def finish_session(
        self,
        session_id: str,
        termination: str,
        reward: float | tuple[float, ...] | None,
        reward_details: dict[str, object] | None,
        *,
        stages: StageTimes | None = None,
        defense_events: Sequence[DefenseEvent] = (),
    ) -> SessionInfo:
        async with transaction(self._engine, f"finish session {session_id}") as conn:
            # The status guard makes finishing atomic: of two concurrent calls one wins.
            result = await conn.execute(
                update(sessions)
                .where(sessions.c.id == session_id)
                .where(sessions.c.status == SessionStatus.ACTIVE.value)
                .values(
                    status=SessionStatus.FINISHED.value,
                    termination=termination,
                    **rows.reward_values(reward),
                    reward_details=reward_details,
                    **rows.trial_values(stages, defense_events),
                    finished_at=time.time(),
                )
            )
            info = await self._session_where(conn, sessions.c.id == session_id)
        if info is None:
            raise NotFound(f"session {session_id!r} not found")
        if result.rowcount == 0:
            raise Conflict(f"session {session_id!r} is already finished")
        return info

    async def list_sessions(
        self,
        run_id: str,
        *,
        after: tuple[float, str] | None = None,
        limit: int = 100,
        finished: bool | None = None,
        group_ids: Sequence[str] | None = None,
    ) -> list[SessionInfo]:
        """Sessions of a run in (created_at, id) order, strictly after ``after``."""
        conditions: list[ColumnElement[bool]] = [sessions.c.run_id == run_id]
        if after is not None:
            created, sid = after
            conditions.append(
                (sessions.c.created_at > created)
                | ((sessions.c.created_at == created) & (sessions.c.id > sid))
            )
        if finished is not None:
            wanted = SessionStatus.FINISHED if finished else SessionStatus.ACTIVE
            conditions.append(sessions.c.status == wanted.value)
        if group_ids is not None:
            conditions.append(sessions.c.group_id.in_(list(group_ids)))
        async with transaction(self._engine, f"list sessions of run {run_id}") as conn:
            result = await conn.execute(
                select(sessions, _turn_count())
                .where(*conditions)
                .order_by(sessions.c.created_at, sessions.c.id)
                .limit(limit)
            )
            return [rows.session_of(row._mapping, int(row[-1])) for row in result]

    async def storage_bytes(self, session_id: str) -> int:
        """Bytes of the per-token arrays stored for a session (what linear storage bounds)."""
        columns = (turns.c.prompt_ids, turns.c.output_ids, turns.c.logprobs)
        total = sum(func.coalesce(func.sum(func.length(c)), 0) for c in columns)
        experts = func.coalesce(func.sum(func.length(turns.c.routed_experts)), 0)
        async with transaction(self._engine, f"measure session {session_id}") as conn:
            value = await conn.scalar(
                select(total + experts).where(turns.c.session_id == session_id)
            )
        return int(value or 0)

    async def _session_where(self, conn: AsyncConnection, condition: Any) -> SessionInfo | None:
        row = (await conn.execute(select(sessions, _turn_count()).where(condition))).first()
        if row is None:
            return None
        return rows.session_of(row._mapping, int(row[-1]))

    # -- turns ----------------------------------------------------------------
    async def write_turns(self, records: Sequence[TurnRecord]) -> None:
        await self.write_rows([rows.encode_turn(record) for record in records])

    async def write_rows(self, stored: Sequence[rows.StoredTurn]) -> set[str]:
        """Insert encoded turns in one transaction, idempotent by id; the ids of completed
        turns stored ``failed`` because their session was already finished."""
        values, relabels = _batch(stored)
        if not values:
            return set()
        return await self._per_turn.write(values, relabels, f"write {len(values)} turns")

    @property
    def writes_now(self) -> bool:
        """Whether ``write_rows_now`` would try to write now."""
        return self._per_turn.can_write_now()

    def write_rows_now(self, stored: Sequence[rows.StoredTurn]) -> set[str] | None:
        """``write_rows`` done at once, awaiting nothing, or None (nothing written) when the
        database cannot be written that way now (``recorder.per_turn``)."""
        values, relabels = _batch(stored)
        return self._per_turn.write_now(values, relabels, f"write {len(values)} turns")

    async def conversations(
        self,
        session_id: str,
        turn_ids: Collection[str] | None = None,
        *,
        completed_only: bool = False,
    ) -> dict[str, Conversation]:
        """Whole recorded requests (and answers) of a session's turns, all by default.

        One query reads the session's request columns, no token arrays; each parent chain
        is resolved once (``recorder.conversations.rebuild``). Unknown ids are left out,
        and so are turns that did not complete when ``completed_only``."""
        async with transaction(self._engine, f"read requests of session {session_id}") as conn:
            result = await conn.execute(
                select(
                    turns.c.id,
                    turns.c.status,
                    turns.c.parent_turn_id,
                    turns.c.messages_inherited,
                    turns.c.request_messages,
                    turns.c.response_message,
                ).where(turns.c.session_id == session_id)
            )
            rows = result.all()
        wanted = [row.id for row in rows] if turn_ids is None else list(turn_ids)
        if completed_only:
            completed = {row.id for row in rows if row.status == TurnStatus.COMPLETED.value}
            wanted = [turn_id for turn_id in wanted if turn_id in completed]
        stored = [StoredRequest.of_row(row) for row in rows]
        return rebuild(session_id, stored, wanted)

    async def count_completed_turns(self, session_id: str) -> int:
        """Completed turns of a session: a replica compares it with what its ledger holds."""
        async with transaction(self._engine, f"count turns of {session_id}") as conn:
            count = await conn.scalar(
                select(func.count())
                .select_from(turns)
                .where(turns.c.session_id == session_id)
                .where(turns.c.status == TurnStatus.COMPLETED.value)
            )
        return int(count or 0)

    async def list_turns(self, session_id: str) -> list[TurnRecord]:
        async with transaction(self._engine, f"read turns of session {session_id}") as conn:
            result = await conn.execute(
                select(turns)
                .where(turns.c.session_id == session_id)
                .order_by(turns.c.seq, turns.c.id)
            )
            found = [row._mapping for row in result]
        return rows.turns_of(session_id, found)

    async def list_turn_arrays(self, session_id: str) -> list[TurnArrays]:
        async with transaction(self._engine, f"read turn arrays of session {session_id}") as conn:
            result = await conn.execute(
                select(*(turns.c[name] for name in rows.ARRAY_COLUMNS))
                .where(turns.c.session_id == session_id)
                .order_by(turns.c.seq, turns.c.id)
            )
            found = [row._mapping for row in result]
        return rows.arrays_of(session_id, found)


def _turn_count() -> Any:
    return (
        select(func.count())
        .select_from(turns)
        .where(turns.c.session_id == sessions.c.id)
        .scalar_subquery()
    )


def _batch(
    stored: Sequence[rows.StoredTurn],
) -> tuple[list[dict[str, object]], list[tuple[object, list[object]]]]:
    """A batch's rows (the first copy of each id) and its side-request relabels."""
    unique = {turn.id: turn for turn in reversed(stored)}  # first copy wins
    values = [dict(turn.row) for turn in reversed(unique.values())]
    relabels: list[tuple[object, list[object]]] = []
    for row in values:
        named = row.setdefault("side_requests", None)  # None: spooled before the column
        if isinstance(named, list) and named:
            relabels.append((row["session_id"], named))
    return values, relabels
