"""Linear storage of recorded requests: what a turn stores, and how whole requests come back.

A turn's ``request_messages`` column holds its canonical request as one JSON object with a
``"messages"`` array. ``messages_inherited`` says which of two forms it is:

- ``NULL``, whole: the object is the whole request. Roots, turns whose request shares no
  leading message with their parent's conversation, and every row written before
  migration 0005.
- ``n >= 1``, inherited: the turn continues ``parent_turn_id``, whose *conversation* is its
  own request's messages followed by its answer (``response_message`` read as an
  assistant message, ``recorder.answers.Answer.as_message``). The request's messages are
  the first ``n`` of that conversation followed by the object's ``"messages"``; every
  other key the object holds replaces the parent's value, and a key it lacks has the
  parent's value.

So each message of a session is stored about once, whatever the session's length: the
bytes grow with what each turn adds, not with turns x conversation.

Contract: ``rebuild(session_id, rows, wanted=None)`` returns the ``Conversation`` (the
whole request, message by message) of every wanted turn, all rows by default, resolving
each parent once: every stored message is parsed once and the rebuilt message tuples share
their elements, so the work is linear in the stored bytes plus one reference per message
per turn. A wanted id with no row is left out. A parent missing from ``rows`` (or a
cycle), ``n`` past the parent's conversation, or a blob that is not a JSON object raises
``RecorderError``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from kernel.errors import RecorderError
from recorder.answers import Answer
from recorder.records import TurnRecord

EMPTY_OBJECT = b"{}"


@dataclass(frozen=True, slots=True)
class StoredRequest:
    """The columns of one turn row that hold its request (see the module docstring)."""

    turn_id: str
    parent_turn_id: str | None
    messages_inherited: int | None
    request: bytes
    answer: bytes

    @classmethod
    def of(cls, record: TurnRecord) -> StoredRequest:
        return cls(
            record.id,
            record.parent_turn_id,
            record.messages_inherited,
            record.request_messages,
            record.response_message,
        )

    @classmethod
    def of_row(cls, row: Any) -> StoredRequest:
        """From a selected ``turns`` row holding those columns."""
        return cls(
            row.id,
            row.parent_turn_id,
            row.messages_inherited,
            bytes(row.request_messages),
            bytes(row.response_message),
        )


@dataclass(frozen=True, slots=True)
class Conversation:
    """One turn's whole recorded request, rebuilt, and its recorded answer."""

    turn_id: str
    fields: bytes  # JSON object: every key of the request but "messages"
    messages: tuple[bytes, ...]  # one JSON object per request message, in order
    answer: bytes  # ``response_message`` as recorded

    def request_json(self) -> bytes:
        """The whole request as one JSON object (``"messages"`` first)."""
        head = b'{"messages":[' + b",".join(self.messages) + b"]"
        if self.fields == EMPTY_OBJECT:
            return head + b"}"
        return head + b"," + self.fields[1:]


def rebuild(
    session_id: str, rows: Iterable[StoredRequest], wanted: Iterable[str] | None = None
) -> dict[str, Conversation]:
    by_id = {row.turn_id: row for row in rows}
    targets = list(by_id) if wanted is None else list(wanted)
    done: dict[str, Conversation] = {}
    for turn_id in targets:
        row = by_id.get(turn_id)
        if row is None or turn_id in done:
            continue
        chain = [row]  # rows to resolve, nearest first
        while chain[-1].messages_inherited is not None:
            parent_id = chain[-1].parent_turn_id
            if parent_id is not None and parent_id in done:
                break
            parent = by_id.get(parent_id) if parent_id is not None else None
            if parent is None or len(chain) > len(by_id):  # missing, or a cycle
                raise RecorderError(
                    f"turn {chain[-1].turn_id} of session {session_id} inherits messages of "
                    f"turn {parent_id!r}, which is not recorded in that session"
                )
            chain.append(parent)
        for item in reversed(chain):
            done[item.turn_id] = _resolve(item, done)
    return done if wanted is None else {t: done[t] for t in targets if t in done}


def _resolve(row: StoredRequest, done: dict[str, Conversation]) -> Conversation:
    stored = _object(row.request, f"the request of turn {row.turn_id}")
    raw_messages = stored.pop("messages", None) or []
    if not isinstance(raw_messages, list):
        raise RecorderError(f"the request of turn {row.turn_id} has no message array")
    own = tuple(orjson.dumps(m) for m in raw_messages)
    inherited = row.messages_inherited
    if inherited is None:
        return Conversation(row.turn_id, orjson.dumps(stored), own, row.answer)
    assert row.parent_turn_id is not None  # rebuild() resolved the parent first
    parent = done[row.parent_turn_id]
    count = len(parent.messages)
    if inherited <= count:
        head = parent.messages[:inherited]
    elif inherited == count + 1:
        head = (*parent.messages, Answer.decode(parent.answer).as_message())
    else:
        raise RecorderError(
            f"turn {row.turn_id} inherits {inherited} messages of a conversation that has "
            f"{count + 1}"
        )
    fields = parent.fields
    if stored:
        merged = _object(parent.fields, f"the request of turn {row.parent_turn_id}")
        merged.update(stored)
        fields = orjson.dumps(merged)
    return Conversation(row.turn_id, fields, head + own, row.answer)


def _object(data: bytes, what: str) -> dict[str, Any]:
    if not data:
        return {}  # records written before the column was filled
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise RecorderError(f"{what} is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise RecorderError(f"{what} is not a JSON object")
    return value
