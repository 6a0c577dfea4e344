"""The JSON forms of what the pipeline records, both ways, so requests are stored linearly
and the ledger (and ``previous_response_id``) can be rebuilt from recorded turns.

Owns the canonical request's JSON: ``orjson.dumps`` of the ``ChatRequest`` dataclass
(tuples as lists, enums as their values); and the answer as the canonical assistant
``Message`` it was (its JSON is the recorder's, ``recorder.answers``).

- ``encode_request(request, inherited, parent)``: what ``TurnRecord.request_messages``
  holds: the whole request when ``inherited`` is 0, else (``recorder.conversations``) only
  ``messages[inherited:]`` and the fields whose values differ from ``parent``'s. The
  inherited messages are never serialized, so its cost grows with what the turn adds.
- ``decode_request(data)``: a whole request; ``RequestDecoder.decode(conversation)``: a
  request rebuilt by ``recorder.conversations``; one decoder shares the ``Message`` of
  every message JSON it has seen, so decoding a session costs its distinct messages.
  ``decode(encode(r))`` equals ``r``.
- ``answer_of(message)``: the recorded ``Answer`` of an assistant message;
  ``decode_message(data)``: a recorded answer, as the assistant message it was
  (``RecorderError`` if the recorder cannot read it).

Request decoders raise ``InvalidRequest`` on data that does not have that shape.
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

import orjson

from kernel.errors import InvalidRequest
from proxy.canonical import (
    ChatRequest,
    Message,
    Role,
    SamplingRequest,
    ToolCall,
    ToolChoice,
    ToolChoiceMode,
    ToolSpec,
)
from recorder.answers import Answer, AnswerCall
from recorder.conversations import Conversation

_ROLES: dict[str, Role] = {r: r for r in ("system", "user", "assistant", "tool")}
_CONTEXT_FIELDS = tuple(f.name for f in fields(ChatRequest) if f.name != "messages")
_DECODE_ERRORS = (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError)


def encode_request(
    request: ChatRequest, inherited: int = 0, parent: ChatRequest | None = None
) -> bytes:
    if not inherited or parent is None:
        return orjson.dumps(request)
    body: dict[str, object] = {"messages": request.messages[inherited:]}
    for name in _CONTEXT_FIELDS:
        value = getattr(request, name)
        if value != getattr(parent, name):
            body[name] = value
    return orjson.dumps(body)


def decode_request(data: bytes) -> ChatRequest:
    try:
        raw = orjson.loads(data)
        return _request(raw, tuple(_message(m) for m in raw["messages"]))
    except _DECODE_ERRORS as exc:
        raise InvalidRequest(f"a recorded request cannot be decoded: {exc!r}") from exc


class RequestDecoder:
    """Decodes rebuilt requests, sharing what several turns of a session have in common."""

    def __init__(self) -> None:
        self._messages: dict[bytes, Message] = {}
        self._contexts: dict[bytes, ChatRequest] = {}

    def decode(self, conversation: Conversation) -> ChatRequest:
        try:
            context = self._contexts.get(conversation.fields)
            if context is None:
                context = _request(orjson.loads(conversation.fields), ())
                self._contexts[conversation.fields] = context
            messages = []
            for data in conversation.messages:
                message = self._messages.get(data)
                if message is None:
                    message = self._messages[data] = _message(orjson.loads(data))
                messages.append(message)
        except _DECODE_ERRORS as exc:
            raise InvalidRequest(
                f"the recorded request of turn {conversation.turn_id} cannot be decoded: {exc!r}"
            ) from exc
        return replace(context, messages=tuple(messages))


def answer_of(message: Message) -> Answer:
    return Answer(
        content=message.content,
        reasoning=message.reasoning,
        tool_calls=tuple(AnswerCall(c.id, c.name, c.arguments) for c in message.tool_calls),
    )


def decode_message(data: bytes) -> Message:
    answer = Answer.decode(data)
    return Message(
        role="assistant",
        content=answer.content,
        reasoning=answer.reasoning,
        tool_calls=tuple(ToolCall(c.id, c.name, c.arguments) for c in answer.tool_calls),
    )


def _request(raw: dict[str, Any], messages: tuple[Message, ...]) -> ChatRequest:
    choice = raw.get("tool_choice") or {}
    sampling = raw.get("sampling") or {}
    return ChatRequest(
        adapter=str(raw["adapter"]),
        model=str(raw["model"]),
        messages=messages,
        tools=tuple(
            ToolSpec(
                name=str(t["name"]),
                description=str(t.get("description") or ""),
                parameters=dict(t.get("parameters") or {}),
            )
            for t in raw.get("tools") or ()
        ),
        tool_choice=ToolChoice(
            mode=ToolChoiceMode(choice.get("mode", "auto")), name=choice.get("name")
        ),
        sampling=SamplingRequest(
            max_tokens=sampling.get("max_tokens"),
            temperature=sampling.get("temperature"),
            top_p=sampling.get("top_p"),
            top_k=sampling.get("top_k"),
            stop=tuple(sampling.get("stop") or ()),
            seed=sampling.get("seed"),
        ),
        stream=bool(raw.get("stream", False)),
        include_usage=bool(raw.get("include_usage", False)),
        enable_thinking=raw.get("enable_thinking"),
        ignored_fields=tuple(raw.get("ignored_fields") or ()),
        instructions=raw.get("instructions"),
        previous_response_id=raw.get("previous_response_id"),
        store=raw.get("store"),
    )


def _message(raw: dict[str, Any]) -> Message:
    role = _ROLES.get(raw["role"])
    if role is None:
        raise ValueError(f"unknown role {raw['role']!r}")
    return Message(
        role=role,
        content=str(raw.get("content") or ""),
        reasoning=raw.get("reasoning"),
        tool_calls=tuple(_call(c) for c in raw.get("tool_calls") or ()),
        tool_call_id=raw.get("tool_call_id"),
        name=raw.get("name"),
    )


def _call(raw: dict[str, Any]) -> ToolCall:
    return ToolCall(id=str(raw["id"]), name=str(raw["name"]), arguments=str(raw["arguments"]))
