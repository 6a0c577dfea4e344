"""The canonical form every wire protocol converts to and from (hub and spoke).

Adapters translate their wire request into a ``ChatRequest`` and turn the pipeline's
``OutputEvent`` stream back into their wire response. Nothing here does IO. All types are
frozen; sequences are tuples so a request can be hashed, compared and cached by the ledger.

Contract:
- ``Message.content`` is the text of the message (content parts joined in order);
  ``Message.reasoning`` is the reasoning the harness sent back (``None`` when it sent none).
- ``ToolCall.arguments`` is the JSON text of the arguments exactly as received or produced.
- The pipeline emits, per turn, any number of ``ReasoningDelta``/``TextDelta``/``ToolCallDelta``
  events, then exactly one ``TurnFinished``. A ``ToolCallDelta`` carries one whole call.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal, TypeAlias

JsonValue: TypeAlias = "bool | int | float | str | list[JsonValue] | dict[str, JsonValue] | None"
JsonObject: TypeAlias = "dict[str, JsonValue]"

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Message:
    role: Role
    content: str = ""
    reasoning: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    description: str
    parameters: JsonObject = field(default_factory=dict, hash=False, compare=True)


class ToolChoiceMode(StrEnum):
    AUTO = "auto"
    NONE = "none"
    REQUIRED = "required"
    NAMED = "named"


@dataclass(frozen=True, slots=True)
class ToolChoice:
    mode: ToolChoiceMode = ToolChoiceMode.AUTO
    name: str | None = None


@dataclass(frozen=True, slots=True)
class SamplingRequest:
    """Sampling as the harness asked for it; session overrides are applied by the pipeline."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None


@dataclass(frozen=True, slots=True)
class ChatRequest:
    adapter: str
    model: str
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: ToolChoice = ToolChoice()
    sampling: SamplingRequest = SamplingRequest()
    stream: bool = False
    include_usage: bool = False
    enable_thinking: bool | None = None
    ignored_fields: tuple[str, ...] = ()
    # OpenAI Responses only: ``instructions`` is also ``messages[0]`` (a system message);
    # the route resolves ``previous_response_id`` into full ``messages`` before rendering.
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool | None = None


class FinishReason(StrEnum):
    STOP = "stop"
    LENGTH = "length"
    TOOL_CALLS = "tool_calls"


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    index: int
    call: ToolCall


@dataclass(frozen=True, slots=True)
class TurnFinished:
    turn_id: str
    finish_reason: FinishReason
    usage: Usage
    matched_stop: str | None = None


OutputEvent: TypeAlias = ReasoningDelta | TextDelta | ToolCallDelta | TurnFinished


@dataclass(frozen=True, slots=True)
class AssistantTurn:
    """A whole answer, for non-streaming responses."""

    turn_id: str
    message: Message
    finish_reason: FinishReason
    usage: Usage
    matched_stop: str | None = None


def collect(events: Iterable[OutputEvent]) -> AssistantTurn:
    """Fold a complete event stream into one assistant message."""
    reasoning: list[str] = []
    text: list[str] = []
    calls: list[ToolCall] = []
    finished: TurnFinished | None = None
    for event in events:
        if isinstance(event, ReasoningDelta):
            reasoning.append(event.text)
        elif isinstance(event, TextDelta):
            text.append(event.text)
        elif isinstance(event, ToolCallDelta):
            calls.append(event.call)
        else:
            finished = event
    if finished is None:
        raise ValueError("event stream ended without TurnFinished")
    message = Message(
        role="assistant",
        content="".join(text),
        reasoning="".join(reasoning) if reasoning else None,
        tool_calls=tuple(calls),
    )
    return AssistantTurn(
        finished.turn_id, message, finished.finish_reason, finished.usage, finished.matched_stop
    )
