"""The recorded answer: what ``TurnRecord.response_message`` holds, and its one codec.

The bytes are one JSON object, ``{"reasoning", "content", "tool_calls": [{"id", "name",
"arguments"}]}`` in that key order: the pipeline writes them with ``Answer.encode`` and
every reader (the ledger, ``previous_response_id``, the linear request storage, the read
models) goes through ``Answer.decode``.

Contract:
- ``Answer.decode(answer.encode()) == answer``, and ``encode`` writes byte for byte what
  every earlier version wrote, so stored rows and their rebuilt requests never change.
- ``Answer.decode(b"")`` is the empty answer: rows written before the column was filled.
  Anything else that is not such an object raises ``RecorderError``.
- ``as_message()`` is the answer as the assistant message a harness sends back for it, in
  the canonical message's JSON form (``recorder.conversations`` inherits it into the next
  request of the conversation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from kernel.errors import RecorderError


@dataclass(frozen=True, slots=True)
class AnswerCall:
    id: str
    name: str
    arguments: str  # as the model wrote them (a JSON text, not parsed)


@dataclass(frozen=True, slots=True)
class Answer:
    content: str = ""
    reasoning: str | None = None  # None: the model did not reason; "" is kept as recorded
    tool_calls: tuple[AnswerCall, ...] = ()

    def encode(self) -> bytes:
        return orjson.dumps(
            {"reasoning": self.reasoning, "content": self.content, "tool_calls": self._calls()}
        )

    @classmethod
    def decode(cls, data: bytes) -> Answer:
        if not data:
            return cls()
        try:
            raw = orjson.loads(data)
            return cls(
                content=str(raw.get("content") or ""),
                reasoning=_text_or_none(raw.get("reasoning")),
                tool_calls=tuple(
                    AnswerCall(str(c["id"]), str(c["name"]), str(c["arguments"]))
                    for c in raw.get("tool_calls") or ()
                ),
            )
        except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError) as exc:
            raise RecorderError(f"a recorded answer cannot be decoded: {exc!r}") from exc

    def as_message(self) -> bytes:
        return orjson.dumps(
            {
                "role": "assistant",
                "content": self.content,
                "reasoning": self.reasoning,
                "tool_calls": self._calls(),
                "tool_call_id": None,
                "name": None,
            }
        )

    def _calls(self) -> list[dict[str, str]]:
        return [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in self.tool_calls]


def _text_or_none(value: Any) -> str | None:
    return None if value is None else str(value)
