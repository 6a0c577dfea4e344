"""The adapter contract: named hooks every wire protocol implements, in this order.

An adapter is pure wire translation (no IO, no database, no backend): it parses a request
body into a ``ChatRequest``, renders a finished ``AssistantTurn`` or a stream of
``OutputEvent``s into its wire format, and maps a ``LegoError`` to its error shape. The
routes drive the hooks; sibling adapters keep the same section order so a diff between two
of them shows only protocol differences.

Streaming hooks are given a ``StreamState`` the route creates per response; adapters keep
whatever per-stream bookkeeping they need in it (its ``extra`` slot), never in globals.
The route calls ``stream_start`` once, ``stream_ping`` any number of times while the first
output is slow to come (keep-alive), ``stream_event`` per event, then ``stream_end`` or
``stream_error``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from pydantic import BaseModel

from kernel.errors import LegoError
from proxy.canonical import AssistantTurn, ChatRequest, OutputEvent


@dataclass(slots=True)
class StreamState:
    """Per-response bookkeeping for one streamed answer (mutable, owned by one response)."""

    response_id: str
    model: str
    created: int
    include_usage: bool = False
    prompt_tokens: int = 0
    extra: dict[str, object] = field(default_factory=dict)


class Adapter(Protocol):
    name: str

    @property
    def request_model(self) -> type[BaseModel]:
        """The wire body's model, which the OpenAPI document describes."""
        ...

    # -- request --------------------------------------------------------------
    def parse_request(self, body: bytes) -> ChatRequest:
        """Validate and translate a wire body; raise ``InvalidRequest``/``Unsupported``."""
        ...

    # -- non-streaming response ----------------------------------------------
    def render_response(self, turn: AssistantTurn, *, model: str, created: int) -> bytes:
        """The whole JSON body of a successful non-streaming answer."""
        ...

    # -- streaming response ---------------------------------------------------
    def stream_start(self, state: StreamState) -> list[bytes]:
        """SSE frames sent before the first model output (may be empty)."""
        ...

    def stream_ping(self, state: StreamState) -> list[bytes]:
        """A keep-alive frame sent while the stream waits for its first output event."""
        ...

    def stream_event(self, state: StreamState, event: OutputEvent) -> list[bytes]:
        """SSE frames for one output event (the final ``TurnFinished`` included)."""
        ...

    def stream_end(self, state: StreamState) -> list[bytes]:
        """SSE frames closing a successful stream (e.g. ``data: [DONE]``)."""
        ...

    # -- errors ---------------------------------------------------------------
    def error_response(self, error: LegoError) -> tuple[int, bytes]:
        """Status code and JSON body for an error raised before streaming started."""
        ...

    def stream_error(self, state: StreamState, error: LegoError) -> list[bytes]:
        """In-band SSE frames for an error after the stream started (the SDK must raise)."""
        ...
