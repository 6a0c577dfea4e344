"""Decoders for what the pipeline records, so the ledger can be rebuilt from ``TurnRecord``s.

Owns the inverse of two encodings the pipeline writes:

- ``decode_request(data)``: ``TurnRecord.request_messages`` is ``orjson.dumps`` of the
  canonical ``ChatRequest`` dataclass (tuples as lists, enums as their values);
- ``decode_message(data)``: ``TurnRecord.response_message`` is
  ``{"reasoning", "content", "tool_calls": [{"id", "name", "arguments"}]}``.

Both raise ``InvalidRequest`` on data that does not have that shape.
"""

from __future__ import annotations

from typing import Any

import orjson

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
from proxy.errors import InvalidRequest

_ROLES: dict[str, Role] = {r: r for r in ("system", "user", "assistant", "tool")}


def decode_request(data: bytes) -> ChatRequest:
    try:
        raw = orjson.loads(data)
        choice = raw.get("tool_choice") or {}
        sampling = raw.get("sampling") or {}
        return ChatRequest(
            adapter=str(raw["adapter"]),
            model=str(raw["model"]),
            messages=tuple(_message(m) for m in raw["messages"]),
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
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InvalidRequest(f"a recorded request cannot be decoded: {exc!r}") from exc


def decode_message(data: bytes) -> Message:
    try:
        raw = orjson.loads(data)
        return Message(
            role="assistant",
            content=str(raw.get("content") or ""),
            reasoning=raw.get("reasoning"),
            tool_calls=tuple(_call(c) for c in raw.get("tool_calls") or ()),
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise InvalidRequest(f"a recorded response cannot be decoded: {exc!r}") from exc


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
