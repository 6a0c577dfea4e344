"""Server-sent-event framing shared by the streaming adapters.

Owns the byte layout of one SSE frame: an optional ``event:`` line, one ``data:`` line holding
compact JSON (orjson), and the blank line that ends the frame. Payloads are serialized on one
line, so a frame never needs multi-line ``data:`` continuation.
"""

from __future__ import annotations

import orjson


def sse_frame(payload: object, *, event: str | None = None) -> bytes:
    """One SSE frame carrying ``payload`` as JSON, optionally tagged with an event name."""
    data = b"data: " + orjson.dumps(payload) + b"\n\n"
    if event is None:
        return data
    return b"event: " + event.encode() + b"\n" + data
