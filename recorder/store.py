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
  are float32-rounded (see ``codec``). ``list_turn_arrays`` gives the same turns as
  ``TurnArrays`` (what the export needs): numpy views of the stored bytes, routed experts
  in their stored dtype, without the conversation blobs.
- Linear storage: a turn with a parent stores only ``prompt_ids[reused_prefix_len:]``; the
  leading ids are the parent's prompt + output, which the ledger guarantees (its contract).
  ``list_turns`` rebuilds every full prompt by walking the parent chain inside the session
  (each parent resolved once per call), so a session's bytes grow with its new tokens,
  not with turns x context. A parent outside the session raises ``RecorderError``.
- Requests are stored linearly too (``recorder.conversations``): ``list_turns`` gives back
  ``request_messages``/``messages_inherited`` as written; ``conversations`` rebuilds whole
  requests for a session, or for some of its turns, from one query.
- A vector reward is stored in ``reward_vector`` (``reward`` stays NULL) and read back as a
  tuple of floats.
- Re-labels: a turn whose ``side_requests`` names earlier turns of its session (roots found
  to be side requests) is written in the same transaction as an update of those turns'
  ``classification``/``fork_reason`` to ``fork``/``side_request``; ``list_turns`` applies
  the lists as well, so a re-label written before the turn it names still holds.
"""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import ColumnElement, Insert, func, select, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from kernel.errors import Conflict, NotFound, RecorderError
from recorder import codec
from recorder.conversations import Conversation, StoredRequest, rebuild
from recorder.database import create_engine, is_sqlite, parse_url, transaction
from recorder.records import (
    RunInfo,
    SessionInfo,
    SessionSpec,
    SessionStatus,
    TurnArrays,
    TurnRecord,
    TurnStatus,
    TurnTimings,
)
from recorder.schema import runs, sessions, turns

SESSION_KEY_PREFIX = "lego-sk-"
# Binary columns of a turn row (everything else in a row is JSON-serializable).
BLOB_COLUMNS = (
    "prompt_ids",
    "output_ids",
    "logprobs",
    "routed_experts",
    "request_messages",
    "response_message",
)
# What a root named in a later turn's ``side_requests`` becomes (proxy.ledger.classify).
SIDE_REQUEST_CLASSIFICATION, SIDE_REQUEST_REASON = "fork", "side_request"


@dataclass(frozen=True, slots=True)
class StoredTurn:
    """A turn encoded as its ``turns`` row (linear storage applied): what gets written."""

    id: str
    row: Mapping[str, object]


def encode_turn(record: TurnRecord) -> StoredTurn:
    """Encode a record for storage; ``InvalidRequest`` if it can never be stored."""
    return StoredTurn(id=record.id, row=_turn_to_row(record))


def decode_stored(turn: StoredTurn) -> TurnRecord:
    """Inverse of ``encode_turn`` for a turn stored without a parent prefix."""
    if turn.row["prompt_offset"]:
        raise RecorderError(f"turn {turn.id} needs its parent to rebuild its prompt")
    return _rebuild_prompts("", [turn.row])[0]


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
        """For the recorder's own read models (``recorder.read_models``); nothing above
        the recorder runs SQL (``tests/test_layers.py``)."""
        return self._engine

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

    # -- sessions -------------------------------------------------------------
    async def create_session(self, spec: SessionSpec) -> SessionInfo:
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
        async with transaction(self._engine, f"read session {session_id}") as conn:
            info = await self._session_where(conn, sessions.c.id == session_id)
        if info is None:
            raise NotFound(f"session {session_id!r} not found")
        return info

    async def get_session_by_key(self, key: str) -> SessionInfo | None:
        async with transaction(self._engine, "read session by key") as conn:
            return await self._session_where(conn, sessions.c.key == key)

    async def finish_session(
        self,
        session_id: str,
        termination: str,
        reward: float | tuple[float, ...] | None,
        reward_details: dict[str, object] | None,
    ) -> SessionInfo:
        scalar = reward if isinstance(reward, float | int) or reward is None else None
        vector = list(reward) if isinstance(reward, tuple) else None
        async with transaction(self._engine, f"finish session {session_id}") as conn:
            # The status guard makes finishing atomic: of two concurrent calls one wins.
            result = await conn.execute(
                update(sessions)
                .where(sessions.c.id == session_id)
                .where(sessions.c.status == SessionStatus.ACTIVE.value)
                .values(
                    status=SessionStatus.FINISHED.value,
                    termination=termination,
                    reward=scalar,
                    reward_vector=vector,
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
            return [_row_to_session(row._mapping, int(row[-1])) for row in result]

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
        return _row_to_session(row._mapping, int(row[-1]))

    # -- turns ----------------------------------------------------------------
    async def write_turns(self, records: Sequence[TurnRecord]) -> None:
        await self.write_rows([encode_turn(record) for record in records])

    async def write_rows(self, stored: Sequence[StoredTurn]) -> None:
        """Insert encoded turns in one transaction (one executemany), idempotent by id."""
        unique = {turn.id: turn for turn in reversed(stored)}  # first copy wins
        rows = [dict(turn.row) for turn in reversed(unique.values())]
        if not rows:
            return
        relabels: list[tuple[object, list[object]]] = []
        for row in rows:
            named = row.setdefault("side_requests", None)  # None: spooled before the column
            if isinstance(named, list) and named:
                relabels.append((row["session_id"], named))
        async with transaction(self._engine, f"write {len(rows)} turns") as conn:
            await conn.execute(self._insert_turns_ignoring_known_ids(), rows)
            for session_id, named in relabels:
                await conn.execute(
                    update(turns)
                    .where(turns.c.session_id == session_id)
                    .where(turns.c.id.in_(named))
                    .where(turns.c.classification == "root")
                    .values(
                        classification=SIDE_REQUEST_CLASSIFICATION, fork_reason=SIDE_REQUEST_REASON
                    )
                )

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
            rows = [row._mapping for row in result]
        return _relabel_side_requests(_rebuild_prompts(session_id, rows))

    async def list_turn_arrays(self, session_id: str) -> list[TurnArrays]:
        async with transaction(self._engine, f"read turn arrays of session {session_id}") as conn:
            result = await conn.execute(
                select(*(turns.c[name] for name in _ARRAY_COLUMNS))
                .where(turns.c.session_id == session_id)
                .order_by(turns.c.seq, turns.c.id)
            )
            rows = [row._mapping for row in result]
        prompts = _full_prompts(session_id, rows)
        named = {turn_id for row in rows for turn_id in row["side_requests"] or ()}
        return [
            _row_to_arrays(row, prompt, relabelled=row["id"] in named)
            for row, prompt in zip(rows, prompts, strict=True)
        ]

    def _insert_turns_ignoring_known_ids(self) -> Insert:
        # Only a clash on the id is a duplicate; a clash on (session_id, seq) with another
        # id is a real conflict and must fail rather than silently drop a turn.
        if self._sqlite:
            return sqlite.insert(turns).on_conflict_do_nothing(index_elements=["id"])
        return postgresql.insert(turns).on_conflict_do_nothing(index_elements=["id"])


def _turn_count() -> Any:
    return (
        select(func.count())
        .select_from(turns)
        .where(turns.c.session_id == sessions.c.id)
        .scalar_subquery()
    )


def _row_to_session(data: RowMapping, turn_count: int) -> SessionInfo:
    vector = data["reward_vector"]
    reward: float | tuple[float, ...] | None = (
        tuple(float(x) for x in vector) if vector is not None else data["reward"]
    )
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
        reward=reward,
        reward_details=data["reward_details"],
        turn_count=turn_count,
    )


def prompt_offset(record: TurnRecord) -> int:
    """Leading prompt ids not stored because the parent turn's tokens hold them."""
    if record.parent_turn_id is None:
        return 0
    return max(0, min(record.reused_prefix_len, len(record.prompt_ids)))


def _turn_to_row(record: TurnRecord) -> dict[str, object]:
    offset = prompt_offset(record)
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
        "prompt_ids": codec.encode_ids(record.prompt_ids[offset:]),
        "prompt_offset": offset,
        "output_ids": codec.encode_ids(record.output_ids),
        "logprobs": codec.encode_logprobs(record.logprobs),
        "routed_experts": experts.data if experts else None,
        "routed_experts_start": experts.start if experts else None,
        "routed_experts_num_layers": experts.num_layers if experts else None,
        "routed_experts_top_k": experts.top_k if experts else None,
        "routed_experts_dtype": experts.dtype if experts else None,
        "sampling_params": record.sampling_params,
        "request_messages": record.request_messages,
        "messages_inherited": record.messages_inherited,
        "response_message": record.response_message,
        "ignored_fields": list(record.ignored_fields),
        "malformed_tool_calls": record.malformed_tool_calls,
        "resumptions": record.resumptions,
        "error": record.error,
        "parent_turn_id": record.parent_turn_id,
        "classification": record.classification,
        "fork_reason": record.fork_reason,
        "reused_prefix_len": record.reused_prefix_len,
        "weight_version_spans": [list(span) for span in record.weight_version_spans] or None,
        "side_requests": list(record.side_requests) or None,
        "received_at": record.timings.received_at,
        "first_token_s": record.timings.first_token_s,
        "finished_s": record.timings.finished_s,
        "backend_s": record.timings.backend_s,
        "created_at": time.time(),
    }


def _rebuild_prompts(session_id: str, rows: Sequence[Mapping[Any, Any]]) -> list[TurnRecord]:
    prompts = _full_prompts(session_id, rows)
    return [
        _row_to_turn(row, tuple(prompt.tolist())) for row, prompt in zip(rows, prompts, strict=True)
    ]


def _full_prompts(
    session_id: str, rows: Sequence[Mapping[Any, Any]]
) -> list[npt.NDArray[np.int32]]:
    """Each row's full prompt ids (linear storage undone), walking each parent chain once."""
    by_id = {row["id"]: row for row in rows}
    tokens: dict[str, npt.NDArray[np.int32]] = {}  # turn id -> full prompt + output

    def prompt_of(row: Mapping[Any, Any]) -> npt.NDArray[np.int32]:
        stored = np.frombuffer(row["prompt_ids"], dtype="<i4")
        offset = row["prompt_offset"]
        if offset == 0:
            return stored
        chain: list[Mapping[Any, Any]] = []  # unresolved ancestors, nearest first
        parent_id = row["parent_turn_id"]
        while parent_id not in tokens:
            parent = by_id.get(parent_id)
            if parent is None or len(chain) > len(rows):  # missing, or a cycle
                raise RecorderError(
                    f"turn {row['id']} of session {session_id} continues turn "
                    f"{parent_id!r}, which is not recorded in that session"
                )
            chain.append(parent)
            if parent["prompt_offset"] == 0:
                break
            parent_id = parent["parent_turn_id"]
        for ancestor in reversed(chain):
            full_prompt = prompt_of(ancestor)  # ancestors above it are resolved by now
            output = np.frombuffer(ancestor["output_ids"], dtype="<i4")
            tokens[ancestor["id"]] = np.concatenate([full_prompt, output])
        prefix = tokens[row["parent_turn_id"]][:offset]
        if len(prefix) != offset:
            raise RecorderError(
                f"turn {row['id']} reuses {offset} ids of a parent that has {len(prefix)}"
            )
        return np.concatenate([prefix, stored])

    prompts = []
    for row in rows:
        prompt = prompt_of(row)
        output = np.frombuffer(row["output_ids"], dtype="<i4")
        tokens[row["id"]] = np.concatenate([prompt, output])
        prompts.append(prompt)
    return prompts


# What ``list_turn_arrays`` reads: a segment's inputs and what rebuilding prompts needs.
_ARRAY_COLUMNS = (
    "id",
    "seq",
    "status",
    "classification",
    "side_requests",
    "weight_version",
    "weight_version_spans",
    "parent_turn_id",
    "prompt_ids",
    "prompt_offset",
    "output_ids",
    "logprobs",
    "routed_experts",
    "routed_experts_start",
    "routed_experts_num_layers",
    "routed_experts_top_k",
    "routed_experts_dtype",
)


def _row_to_arrays(
    row: Mapping[Any, Any], prompt_ids: npt.NDArray[np.int32], *, relabelled: bool
) -> TurnArrays:
    classification = row["classification"]
    if relabelled and classification == "root":  # as ``_relabel_side_requests``
        classification = SIDE_REQUEST_CLASSIFICATION
    routed = None
    if row["routed_experts"] is not None:
        routed = codec.stored_rows(_encoded_experts(row))
    return TurnArrays(
        id=row["id"],
        seq=row["seq"],
        status=TurnStatus(row["status"]),
        classification=classification,
        weight_version=row["weight_version"],
        weight_version_spans=_spans(row),
        prompt_ids=prompt_ids,
        output_ids=np.frombuffer(row["output_ids"], dtype="<i4"),
        logprobs=np.frombuffer(row["logprobs"], dtype="<f4"),
        routed_start=row["routed_experts_start"] if routed is not None else 0,
        routed_rows=routed,
    )


def _encoded_experts(row: Mapping[Any, Any]) -> codec.EncodedExperts:
    return codec.EncodedExperts(
        data=bytes(row["routed_experts"]),
        start=row["routed_experts_start"],
        num_layers=row["routed_experts_num_layers"],
        top_k=row["routed_experts_top_k"],
        dtype=row["routed_experts_dtype"],
    )


def _spans(row: Mapping[Any, Any]) -> tuple[tuple[str, int, int], ...]:
    return tuple((str(v), int(a), int(b)) for v, a, b in row["weight_version_spans"] or ())


def _relabel_side_requests(records: list[TurnRecord]) -> list[TurnRecord]:
    """Roots that a later turn of the session named as side requests read back as such."""
    named = {turn_id for record in records for turn_id in record.side_requests}
    if not named:
        return records
    return [
        replace(r, classification=SIDE_REQUEST_CLASSIFICATION, fork_reason=SIDE_REQUEST_REASON)
        if r.id in named and r.classification == "root"
        else r
        for r in records
    ]


def _row_to_turn(row: Mapping[Any, Any], prompt_ids: tuple[int, ...]) -> TurnRecord:
    experts = None
    if row["routed_experts"] is not None:
        experts = codec.decode_experts(_encoded_experts(row))
    return TurnRecord(
        id=row["id"],
        session_id=row["session_id"],
        seq=row["seq"],
        adapter=row["adapter"],
        requested_model=row["requested_model"],
        status=TurnStatus(row["status"]),
        prompt_ids=prompt_ids,
        output_ids=codec.decode_ids(bytes(row["output_ids"])),
        logprobs=codec.decode_logprobs(bytes(row["logprobs"])),
        routed_experts=experts,
        finish_reason=row["finish_reason"],
        weight_version=row["weight_version"],
        sampling_params=row["sampling_params"],
        request_messages=bytes(row["request_messages"]),
        messages_inherited=row["messages_inherited"],
        response_message=bytes(row["response_message"]),
        ignored_fields=tuple(row["ignored_fields"]),
        malformed_tool_calls=row["malformed_tool_calls"],
        resumptions=row["resumptions"],
        error=row["error"],
        parent_turn_id=row["parent_turn_id"],
        classification=row["classification"],
        fork_reason=row["fork_reason"],
        reused_prefix_len=row["reused_prefix_len"],
        side_requests=tuple(row.get("side_requests") or ()),
        weight_version_spans=_spans(row),
        timings=TurnTimings(
            received_at=row["received_at"],
            first_token_s=row["first_token_s"],
            finished_s=row["finished_s"],
            backend_s=row["backend_s"],
        ),
    )
