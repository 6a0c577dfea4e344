"""One session as the Live UI shows it: the tree of turns, with what each turn saw and did.

Contract: ``load_session(store, session_id)`` raises ``NotFound`` for an unknown session
and otherwise returns a ``SessionView`` in two SQL statements: the session's reward as the
recorder's reward rule reads it (a vector as a tuple of floats), the trial's stage timings
and defense events as its finish reported them (``recorder.rows``), and its turns in tree
order (depth-first from each root, children by seq) with their depth, classification and
fork reason (re-labels applied, ``recorder.rows.SideRequests``), the messages the turn
added to its parent's conversation (all of them for a root; whole requests are rebuilt
from linear storage, ``recorder.conversations``), the recorded answer's text, reasoning
and tool calls (``recorder.answers``), the finish reason, the timings, and up to
``MAX_TOKENS`` sampled tokens as (token id, logprob). A turn's ``number`` is its place in
the session's order of arrival (1 for the first), and ``parent_number`` its parent's;
``seq`` is the recorder's clock, not a count. An ``edited_history`` fork carries what it
changed against its parent (``edit``, ``recorder.read_models.forks``): the messages
compared as the model saw them (role, text, tool calls with their arguments' JSON
normalised, tool call id; reasoning left out, as templates drop it), the tokens compared
after rebuilding both full prompts (``recorder.prompts``). Token text is not the
recorder's to know: whoever renders the page decodes the ids with the served tokenizer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy import select

from kernel.errors import NotFound
from recorder import codec
from recorder.answers import Answer
from recorder.conversations import Conversation, StoredRequest, rebuild
from recorder.prompts import full_prompts
from recorder.read_models.forks import EDITED_HISTORY, HistoryEdit, history_edit
from recorder.records import DefenseEvent, StageTimes
from recorder.rows import Reward, SideRequests, events_of, reward_of, stages_of
from recorder.schema import sessions, turns
from recorder.store import Store

MAX_TOKENS = 2000  # per turn; the rest is summarized, so a long answer stays readable


@dataclass(frozen=True, slots=True)
class ShownMessage:
    role: str
    content: str
    reasoning: str | None
    tool_calls: tuple[tuple[str, str], ...]  # (name, arguments)
    tool_call_id: str | None


@dataclass(frozen=True, slots=True)
class SampledToken:
    token_id: int
    logprob: float


@dataclass(frozen=True, slots=True)
class TurnView:
    id: str
    seq: int
    number: int  # 1-based order of arrival in the session
    parent_number: int | None
    depth: int
    parent_turn_id: str | None
    classification: str
    fork_reason: str | None
    status: str
    finish_reason: str
    weight_version: str
    adapter: str
    error: str | None
    prompt_tokens: int
    output_tokens: int
    malformed_tool_calls: int
    first_token_s: float | None
    finished_s: float | None
    backend_s: float | None
    new_messages: tuple[ShownMessage, ...]
    reply: ShownMessage
    tokens: tuple[SampledToken, ...]
    edit: HistoryEdit[ShownMessage] | None = None


@dataclass(frozen=True, slots=True)
class SessionView:
    id: str
    run_id: str
    task_id: str
    group_id: str
    sample_index: int
    harness: str
    status: str
    termination: str | None
    reward: Reward
    turns: tuple[TurnView, ...]
    stages: StageTimes | None = None
    defense_events: tuple[DefenseEvent, ...] = ()


def _message(data: Mapping[str, Any], default_role: str) -> ShownMessage:
    calls = data.get("tool_calls") or ()
    return ShownMessage(
        role=str(data.get("role") or default_role),
        content=str(data.get("content") or ""),
        reasoning=data.get("reasoning") or None,
        tool_calls=tuple(
            (str(c.get("name", "")), str(c.get("arguments", "")))
            for c in calls
            if isinstance(c, Mapping)
        ),
        tool_call_id=data.get("tool_call_id"),
    )


def _reply(answer: Answer) -> ShownMessage:
    calls = tuple((c.name, c.arguments) for c in answer.tool_calls)
    return ShownMessage("assistant", answer.content, answer.reasoning or None, calls, None)


async def load_session(store: Store, session_id: str) -> SessionView:
    query = (
        select(
            turns.c.id,
            turns.c.seq,
            turns.c.parent_turn_id,
            turns.c.classification,
            turns.c.fork_reason,
            turns.c.status,
            turns.c.finish_reason,
            turns.c.weight_version,
            turns.c.adapter,
            turns.c.error,
            turns.c.prompt_offset,
            turns.c.prompt_ids,
            turns.c.output_ids,
            turns.c.logprobs,
            turns.c.malformed_tool_calls,
            turns.c.first_token_s,
            turns.c.finished_s,
            turns.c.backend_s,
            turns.c.request_messages,
            turns.c.messages_inherited,
            turns.c.response_message,
            turns.c.side_requests,
        )
        .where(turns.c.session_id == session_id)
        .order_by(turns.c.seq)
    )
    async with store.engine.connect() as conn:
        session = (await conn.execute(select(sessions).where(sessions.c.id == session_id))).first()
        if session is None:
            raise NotFound(f"no session {session_id!r}")
        rows = (await conn.execute(query)).all()

    by_id = {row.id: row for row in rows}
    children: dict[str | None, list[Any]] = {}
    for row in rows:
        parent = row.parent_turn_id if row.parent_turn_id in by_id else None
        children.setdefault(parent, []).append(row)
    conversations = rebuild(session_id, (StoredRequest.of_row(row) for row in rows))
    labels = SideRequests.of_rows(row._mapping for row in rows)
    numbers = {row.id: n for n, row in enumerate(rows, start=1)}

    views: list[TurnView] = []
    stack = [(row, 0) for row in reversed(children.get(None, []))]
    while stack:
        row, depth = stack.pop()
        view = _turn_view(row, depth, conversations, labels, numbers)
        if view.fork_reason == EDITED_HISTORY and row.parent_turn_id in by_id:
            edit = _edit(session_id, row, by_id, conversations)
            view = dataclasses.replace(view, edit=edit)
        views.append(view)
        stack.extend((child, depth + 1) for child in reversed(children.get(row.id, [])))
    return SessionView(
        id=str(session.id),
        run_id=str(session.run_id),
        task_id=str(session.task_id),
        group_id=str(session.group_id),
        sample_index=int(session.sample_index),
        harness=str(session.harness),
        status=str(session.status),
        termination=session.termination,
        reward=reward_of(session.reward, session.reward_vector),
        turns=tuple(views),
        stages=stages_of(session.stages),
        defense_events=events_of(session.defense_events),
    )


def _shown_key(message: ShownMessage) -> tuple[object, ...]:
    """What the model saw of a message: reasoning aside, arguments' JSON normalised."""
    calls = tuple((name, _normalised_json(arguments)) for name, arguments in message.tool_calls)
    return (message.role, message.content.strip(), calls, message.tool_call_id)


def _normalised_json(text: str) -> str:
    try:
        return orjson.dumps(orjson.loads(text), option=orjson.OPT_SORT_KEYS).decode()
    except orjson.JSONDecodeError:
        return text


def _edit(
    session_id: str, fork: Any, by_id: Mapping[str, Any], conversations: Mapping[str, Conversation]
) -> HistoryEdit[ShownMessage]:
    parent = by_id[fork.parent_turn_id]
    # Only the rows whose prompts the two full prompts are rebuilt from: the parent's chain.
    chain = [fork, parent]
    while chain[-1].prompt_offset and chain[-1].parent_turn_id in by_id:
        chain.append(by_id[chain[-1].parent_turn_id])
    prompts = full_prompts(session_id, [row._mapping for row in reversed(chain)])
    parent_prompt, fork_prompt = prompts[-2], prompts[-1]
    parent_tokens = [*parent_prompt.tolist(), *codec.decode_ids(parent.output_ids)]
    before = conversations[parent.id]
    shown_before = [_message(orjson.loads(m), "user") for m in before.messages]
    shown_before.append(_reply(Answer.decode(before.answer)))
    shown_after = [_message(orjson.loads(m), "user") for m in conversations[fork.id].messages]
    return history_edit(
        str(parent.id), shown_before, shown_after, _shown_key, parent_tokens, fork_prompt.tolist()
    )


def _turn_view(
    row: Any,
    depth: int,
    conversations: Mapping[str, Conversation],
    labels: SideRequests,
    numbers: Mapping[str, int],
) -> TurnView:
    parent = conversations.get(row.parent_turn_id) if row.parent_turn_id else None
    # A continuation repeats its parent's messages and reply; show only what it added.
    skip = len(parent.messages) + 1 if parent is not None else 0
    messages = [orjson.loads(m) for m in conversations[row.id].messages[skip:]]
    output_ids = codec.decode_ids(row.output_ids)
    logprobs = codec.decode_logprobs(row.logprobs)
    shown = zip(output_ids[:MAX_TOKENS], logprobs[:MAX_TOKENS], strict=False)
    classification, fork_reason = labels.label(row.id, row.classification, row.fork_reason)
    return TurnView(
        id=str(row.id),
        seq=int(row.seq),
        number=numbers[row.id],
        parent_number=numbers.get(row.parent_turn_id) if row.parent_turn_id else None,
        depth=depth,
        parent_turn_id=row.parent_turn_id,
        classification=classification,
        fork_reason=fork_reason,
        status=str(row.status),
        finish_reason=str(row.finish_reason),
        weight_version=str(row.weight_version),
        adapter=str(row.adapter),
        error=row.error,
        prompt_tokens=int(row.prompt_offset) + len(row.prompt_ids) // codec.ID_BYTES,
        output_tokens=len(output_ids),
        malformed_tool_calls=int(row.malformed_tool_calls),
        first_token_s=row.first_token_s,
        finished_s=row.finished_s,
        backend_s=row.backend_s,
        new_messages=tuple(_message(m, "user") for m in messages if isinstance(m, Mapping)),
        reply=_reply(Answer.decode(row.response_message)),
        tokens=tuple(SampledToken(i, lp) for i, lp in shown),
    )
