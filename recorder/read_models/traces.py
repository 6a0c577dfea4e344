"""What the agent did in each graded session of a run: its turns' answers and tool results.

Owns ``SessionTrace`` (a session's main turns, in seq order: each answer's text,
reasoning, tool calls with the tool result a later request carried for them, malformed
count and finish reason) and ``load_traces(store, run_id, reduce)``, which reads them for
the run's most recent ``SESSION_LIMIT`` graded sessions (finished with a termination that
counts for training, ``recorder.records.EXCLUDED_TERMINATIONS``), oldest first.

Contract:
- A trace holds the turns that reached the harness (status ``completed``) and are not
  side requests (title requests and summaries, the re-label rule of
  ``recorder.rows.SideRequests`` applied): sub-agents and compacted branches are the
  agent's own actions and stay in.
- A call's result is the content of the first ``tool`` message, in any turn's stored
  request, whose ``tool_call_id`` is the call's id: linear storage keeps each message
  once, in the turn that added it (``recorder.conversations``), so nothing is rebuilt.
  None when no later request carried one (the session ended on that call).
- The reward is the session's scalar reward; a vector (no threshold to pass) or none
  reads as None, as in ``recorder.read_models.overview``.
- Memory stays bounded by one batch: turns are read ``BATCH`` sessions per statement and
  each trace is handed to ``reduce`` before the next batch is read, so the result holds
  only what ``reduce`` keeps. Statements: three, plus one per batch. ``NotFound`` for an
  unknown run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import orjson
from sqlalchemy import and_, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from kernel.errors import NotFound
from recorder.answers import Answer
from recorder.records import EXCLUDED_TERMINATIONS, TurnStatus
from recorder.rows import SIDE_REQUEST_REASON, Row, SideRequests, reward_of
from recorder.schema import runs, sessions, turns
from recorder.store import Store

SESSION_LIMIT = 2000  # the most recent graded sessions read; older ones are left out
BATCH = 50  # sessions whose turns one statement reads

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class TracedCall:
    name: str
    arguments: str  # as the model wrote them
    result: str | None  # the tool result sent back for this call; None if none was


@dataclass(frozen=True, slots=True)
class TracedTurn:
    content: str
    reasoning: str | None
    calls: tuple[TracedCall, ...]
    malformed: int  # tool-call blocks the parser could not read (not in ``calls``)
    finish_reason: str


@dataclass(frozen=True, slots=True)
class SessionTrace:
    id: str
    group_id: str
    harness: str
    created_at: float
    reward: float | None  # scalar only
    turns: tuple[TracedTurn, ...]


@dataclass(frozen=True, slots=True)
class SessionHead:
    id: str
    group_id: str
    harness: str
    created_at: float
    reward: float | None


@dataclass(frozen=True, slots=True)
class TracedRun(Generic[_T]):
    run_id: str
    run_name: str
    graded: int  # graded sessions the run has; ``len(items)`` of them were read
    limit: int
    items: tuple[_T, ...]  # ``reduce`` of each session read, oldest first


def trace_of(head: SessionHead, rows: Sequence[Row]) -> SessionTrace:
    """A trace from one session's ``turns`` rows in seq order (``load_traces``'s columns)."""
    labels = SideRequests.of_rows(rows)
    results: dict[str, str] = {}
    for row in rows:
        for message in _messages(row["request_messages"]):
            call_id = message.get("tool_call_id")
            if message.get("role") == "tool" and isinstance(call_id, str):
                results.setdefault(call_id, str(message.get("content") or ""))
    traced: list[TracedTurn] = []
    for row in rows:
        _, reason = labels.label(row["id"], row["classification"], row["fork_reason"])
        if row["status"] != TurnStatus.COMPLETED or reason == SIDE_REQUEST_REASON:
            continue
        answer = Answer.decode(bytes(row["response_message"]))
        calls = tuple(TracedCall(c.name, c.arguments, results.get(c.id)) for c in answer.tool_calls)
        traced.append(
            TracedTurn(
                answer.content,
                answer.reasoning,
                calls,
                int(row["malformed_tool_calls"]),
                str(row["finish_reason"]),
            )
        )
    return SessionTrace(
        head.id, head.group_id, head.harness, head.created_at, head.reward, tuple(traced)
    )


def _messages(blob: bytes | None) -> list[Mapping[str, Any]]:
    if not blob:
        return []
    try:
        stored = orjson.loads(blob)
    except orjson.JSONDecodeError:
        return []  # unreadable requests carry no results; the answers still count
    found = stored.get("messages") if isinstance(stored, dict) else None
    return [m for m in found if isinstance(m, dict)] if isinstance(found, list) else []


# Training samples only: held-out validation (another temperature, other tasks) and the
# loop's validation run would blur the first-third / last-third comparison.
_GRADED = and_(
    sessions.c.termination.is_not(None),
    sessions.c.termination.not_in(sorted(EXCLUDED_TERMINATIONS)),
    sessions.c.purpose == "train",
)
_TURN_COLUMNS = (
    turns.c.session_id,
    turns.c.id,
    turns.c.status,
    turns.c.classification,
    turns.c.fork_reason,
    turns.c.side_requests,
    turns.c.finish_reason,
    turns.c.malformed_tool_calls,
    turns.c.request_messages,
    turns.c.response_message,
)


async def load_traces(
    store: Store,
    run_id: str,
    reduce: Callable[[SessionTrace], _T],
    *,
    limit: int = SESSION_LIMIT,
) -> TracedRun[_T]:
    async with store.engine.connect() as conn:
        run = (await conn.execute(select(runs.c.name).where(runs.c.id == run_id))).first()
        if run is None:
            raise NotFound(f"no run {run_id!r}")
        graded_here = and_(sessions.c.run_id == run_id, _GRADED)
        graded = (await conn.execute(select(func.count()).where(graded_here))).scalar_one()
        newest = (
            select(
                sessions.c.id,
                sessions.c.group_id,
                sessions.c.harness,
                sessions.c.created_at,
                sessions.c.reward,
                sessions.c.reward_vector,
            )
            .where(graded_here)
            .order_by(sessions.c.created_at.desc(), sessions.c.id.desc())
            .limit(limit)
        )
        heads = [_head(row) for row in reversed((await conn.execute(newest)).all())]
        items: list[_T] = []
        for start in range(0, len(heads), BATCH):
            batch = heads[start : start + BATCH]
            by_session = await _turn_rows(conn, [h.id for h in batch])
            items += [reduce(trace_of(h, by_session.get(h.id, []))) for h in batch]
    return TracedRun(run_id, str(run.name), int(graded), limit, tuple(items))


def _head(row: Any) -> SessionHead:
    reward = reward_of(row.reward, row.reward_vector)
    return SessionHead(
        id=str(row.id),
        group_id=str(row.group_id),
        harness=str(row.harness),
        created_at=float(row.created_at),
        reward=reward if isinstance(reward, float) else None,
    )


async def _turn_rows(conn: AsyncConnection, session_ids: list[str]) -> dict[str, list[Row]]:
    query = (
        select(*_TURN_COLUMNS)
        .where(turns.c.session_id.in_(session_ids))
        .order_by(turns.c.session_id, turns.c.seq)
    )
    by_session: dict[str, list[Row]] = {}
    for row in await conn.execute(query):
        by_session.setdefault(str(row.session_id), []).append(row._mapping)
    return by_session
