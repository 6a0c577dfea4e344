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
- ``list_turns`` gives back exactly what was written, in seq order, except that logprobs
  are float32-rounded (see ``codec``).
"""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy import Insert, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import RowMapping
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from proxy.errors import Conflict, LegoError, NotFound, RecorderError
from recorder import codec
from recorder.database import create_engine, describe_error, is_sqlite, parse_url
from recorder.records import (
    RunInfo,
    SessionInfo,
    SessionSpec,
    SessionStatus,
    TurnRecord,
    TurnStatus,
    TurnTimings,
)
from recorder.schema import runs, sessions, turns

SESSION_KEY_PREFIX = "lego-sk-"


class Store:
    def __init__(self, engine: AsyncEngine, *, sqlite_dialect: bool) -> None:
        self._engine = engine
        self._sqlite = sqlite_dialect

    @classmethod
    async def open(cls, url: str) -> Store:
        return cls(create_engine(url), sqlite_dialect=is_sqlite(parse_url(url)))

    async def close(self) -> None:
        await self._engine.dispose()

    @property
    def engine(self) -> AsyncEngine:
        return self._engine

    # -- runs -----------------------------------------------------------------
    async def create_run(self, name: str) -> RunInfo:
        run = RunInfo(id=uuid.uuid4().hex, name=name, created_at=time.time())
        async with self._transaction(f"create run {name!r}") as conn:
            taken = await conn.scalar(select(runs.c.id).where(runs.c.name == name))
            if taken is not None:
                raise Conflict(f"run name {name!r} is taken (run {taken})", param="name")
            await conn.execute(
                runs.insert().values(id=run.id, name=run.name, created_at=run.created_at)
            )
        return run

    async def get_run(self, run_id: str) -> RunInfo:
        async with self._transaction(f"read run {run_id}") as conn:
            row = (await conn.execute(select(runs).where(runs.c.id == run_id))).first()
        if row is None:
            raise NotFound(f"run {run_id!r} not found")
        return RunInfo(id=row.id, name=row.name, created_at=row.created_at)

    # -- sessions -------------------------------------------------------------
    async def create_session(self, spec: SessionSpec) -> SessionInfo:
        info = SessionInfo(
            id=uuid.uuid4().hex,
            key=SESSION_KEY_PREFIX + secrets.token_urlsafe(24),
            spec=spec,
            status=SessionStatus.ACTIVE,
            created_at=time.time(),
        )
        async with self._transaction("create session") as conn:
            if await conn.scalar(select(runs.c.id).where(runs.c.id == spec.run_id)) is None:
                raise NotFound(f"run {spec.run_id!r} not found", param="run_id")
            await conn.execute(
                sessions.insert().values(
                    id=info.id,
                    key=info.key,
                    run_id=spec.run_id,
                    task_id=spec.task_id,
                    group_id=spec.group_id,
                    sample_index=spec.sample_index,
                    harness=spec.harness,
                    sampling=spec.sampling,
                    max_prompt_tokens=spec.max_prompt_tokens,
                    max_output_tokens=spec.max_output_tokens,
                    status=info.status.value,
                    created_at=info.created_at,
                )
            )
        return info

    async def get_session(self, session_id: str) -> SessionInfo:
        async with self._transaction(f"read session {session_id}") as conn:
            info = await self._session_where(conn, sessions.c.id == session_id)
        if info is None:
            raise NotFound(f"session {session_id!r} not found")
        return info

    async def get_session_by_key(self, key: str) -> SessionInfo | None:
        async with self._transaction("read session by key") as conn:
            return await self._session_where(conn, sessions.c.key == key)

    async def finish_session(
        self,
        session_id: str,
        termination: str,
        reward: float | None,
        reward_details: dict[str, object] | None,
    ) -> SessionInfo:
        async with self._transaction(f"finish session {session_id}") as conn:
            # The status guard makes finishing atomic: of two concurrent calls one wins.
            result = await conn.execute(
                update(sessions)
                .where(sessions.c.id == session_id)
                .where(sessions.c.status == SessionStatus.ACTIVE.value)
                .values(
                    status=SessionStatus.FINISHED.value,
                    termination=termination,
                    reward=reward,
                    reward_details=reward_details,
                    finished_at=time.time(),
                )
            )
            info = await self._session_where(conn, sessions.c.id == session_id)
        if info is None:
            raise NotFound(f"session {session_id!r} not found")
        if result.rowcount == 0:
            raise Conflict(f"session {session_id!r} is already finished")
        return info

    async def _session_where(self, conn: AsyncConnection, condition: Any) -> SessionInfo | None:
        turn_count = (
            select(func.count())
            .select_from(turns)
            .where(turns.c.session_id == sessions.c.id)
            .scalar_subquery()
        )
        row = (await conn.execute(select(sessions, turn_count).where(condition))).first()
        if row is None:
            return None
        data = row._mapping
        return SessionInfo(
            id=data["id"],
            key=data["key"],
            spec=SessionSpec(
                run_id=data["run_id"],
                task_id=data["task_id"],
                group_id=data["group_id"],
                sample_index=data["sample_index"],
                harness=data["harness"],
                sampling=data["sampling"],
                max_prompt_tokens=data["max_prompt_tokens"],
                max_output_tokens=data["max_output_tokens"],
            ),
            status=SessionStatus(data["status"]),
            created_at=data["created_at"],
            termination=data["termination"],
            reward=data["reward"],
            reward_details=data["reward_details"],
            turn_count=int(row[-1]),
        )

    # -- turns ----------------------------------------------------------------
    async def write_turns(self, records: Sequence[TurnRecord]) -> None:
        unique = {record.id: record for record in reversed(records)}  # first copy wins
        rows = [_turn_to_row(record) for record in reversed(unique.values())]
        if not rows:
            return
        async with self._transaction(f"write {len(rows)} turns") as conn:
            await conn.execute(self._insert_turns_ignoring_known_ids(), rows)

    async def list_turns(self, session_id: str) -> list[TurnRecord]:
        async with self._transaction(f"read turns of session {session_id}") as conn:
            result = await conn.execute(
                select(turns).where(turns.c.session_id == session_id).order_by(turns.c.seq)
            )
            return [_row_to_turn(row._mapping) for row in result]

    def _insert_turns_ignoring_known_ids(self) -> Insert:
        # Only a clash on the id is a duplicate; a clash on (session_id, seq) with another
        # id is a real conflict and must fail rather than silently drop a turn.
        if self._sqlite:
            return sqlite.insert(turns).on_conflict_do_nothing(index_elements=["id"])
        return postgresql.insert(turns).on_conflict_do_nothing(index_elements=["id"])

    @asynccontextmanager
    async def _transaction(self, action: str) -> AsyncIterator[AsyncConnection]:
        try:
            async with self._engine.begin() as conn:
                yield conn
        except LegoError:
            raise
        except IntegrityError as exc:
            raise Conflict(f"cannot {action}: {describe_error(exc)}") from exc
        except (SQLAlchemyError, OSError) as exc:
            # OSError: asyncpg reports refused/reset connections as plain socket errors.
            raise RecorderError(f"cannot {action}: database error: {describe_error(exc)}") from exc


def _turn_to_row(record: TurnRecord) -> dict[str, object]:
    experts = (
        codec.encode_experts(record.routed_experts) if record.routed_experts is not None else None
    )
    return {
        "id": record.id,
        "session_id": record.session_id,
        "seq": record.seq,
        "adapter": record.adapter,
        "requested_model": record.requested_model,
        "status": record.status.value,
        "finish_reason": record.finish_reason,
        "weight_version": record.weight_version,
        "prompt_ids": codec.encode_ids(record.prompt_ids),
        "output_ids": codec.encode_ids(record.output_ids),
        "logprobs": codec.encode_logprobs(record.logprobs),
        "routed_experts": experts.data if experts else None,
        "routed_experts_start": experts.start if experts else None,
        "routed_experts_num_layers": experts.num_layers if experts else None,
        "routed_experts_top_k": experts.top_k if experts else None,
        "routed_experts_dtype": experts.dtype if experts else None,
        "sampling_params": record.sampling_params,
        "request_messages": record.request_messages,
        "response_message": record.response_message,
        "ignored_fields": list(record.ignored_fields),
        "malformed_tool_calls": record.malformed_tool_calls,
        "resumptions": record.resumptions,
        "error": record.error,
        "parent_turn_id": record.parent_turn_id,
        "classification": record.classification,
        "fork_reason": record.fork_reason,
        "reused_prefix_len": record.reused_prefix_len,
        "received_at": record.timings.received_at,
        "first_token_s": record.timings.first_token_s,
        "finished_s": record.timings.finished_s,
        "backend_s": record.timings.backend_s,
        "created_at": time.time(),
    }


def _row_to_turn(row: RowMapping) -> TurnRecord:
    experts = None
    if row["routed_experts"] is not None:
        experts = codec.decode_experts(
            codec.EncodedExperts(
                data=bytes(row["routed_experts"]),
                start=row["routed_experts_start"],
                num_layers=row["routed_experts_num_layers"],
                top_k=row["routed_experts_top_k"],
                dtype=row["routed_experts_dtype"],
            )
        )
    return TurnRecord(
        id=row["id"],
        session_id=row["session_id"],
        seq=row["seq"],
        adapter=row["adapter"],
        requested_model=row["requested_model"],
        status=TurnStatus(row["status"]),
        prompt_ids=codec.decode_ids(bytes(row["prompt_ids"])),
        output_ids=codec.decode_ids(bytes(row["output_ids"])),
        logprobs=codec.decode_logprobs(bytes(row["logprobs"])),
        routed_experts=experts,
        finish_reason=row["finish_reason"],
        weight_version=row["weight_version"],
        sampling_params=row["sampling_params"],
        request_messages=bytes(row["request_messages"]),
        response_message=bytes(row["response_message"]),
        ignored_fields=tuple(row["ignored_fields"]),
        malformed_tool_calls=row["malformed_tool_calls"],
        resumptions=row["resumptions"],
        error=row["error"],
        parent_turn_id=row["parent_turn_id"],
        classification=row["classification"],
        fork_reason=row["fork_reason"],
        reused_prefix_len=row["reused_prefix_len"],
        timings=TurnTimings(
            received_at=row["received_at"],
            first_token_s=row["first_token_s"],
            finished_s=row["finished_s"],
            backend_s=row["backend_s"],
        ),
    )
