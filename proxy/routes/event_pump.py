"""One task that drains a turn's output events into a buffer while the stream writes them.

Owns: reading a streamed turn's events ahead of the frames that carry them. A task per
event (``anext`` in a task, then ``asyncio.wait`` on it, the connection and a ping timer)
cost a task, a waiter and a timer for every token of a real generation; the pump is one
task for the turn, and the stream wakes once per burst (the events of one backend read)
to take everything buffered.

Semantics the routes rely on:
- events come out in order, and an error the turn raised comes out after every event
  before it (``take`` returns the buffered events first, ``finish`` raises afterwards);
- ``wait`` returns when something is buffered, the turn has ended, the harness hung up
  (``watch``), or the ping interval passed, whichever comes first;
- ``cancel`` cancels the turn where it waits (the pipeline aborts the backend and records
  the turn, exactly as cancelling its ``anext`` did) and closes the generator;
- it reads at most ``MAX_AHEAD`` events ahead of ``take``: a harness that stops reading
  holds the turn there (the pull per event held it at one), so the buffer stays bounded and
  the backend's stream is slowed by TCP rather than drained into memory.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

from proxy.canonical import OutputEvent

Events = AsyncGenerator[OutputEvent, None]
# Events read ahead of the stream at most: a harness that stops reading stops the turn's
# reading of the backend within this many events (a token each, mostly).
MAX_AHEAD = 256


class EventPump:
    """The events of one turn, read ahead by a single task."""

    def __init__(self, events: Events, ahead: int = MAX_AHEAD) -> None:
        self._events = events
        self._ahead = ahead
        self._buffer: list[OutputEvent] = []
        self._waiter: asyncio.Future[None] | None = None
        self._room: asyncio.Future[None] | None = None
        self._gone: asyncio.Future[None] | None = None
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._pump(), name="turn-events")

    async def _pump(self) -> None:
        try:
            async for event in self._events:
                self._buffer.append(event)
                if self._waiter is not None:
                    self._wake()
                if len(self._buffer) >= self._ahead:
                    # The harness reads slower than the model writes: stop reading the
                    # backend until it catches up (TCP then slows the backend), as a pull
                    # per event did, instead of holding the rest of the answer here.
                    self._room = self._loop.create_future()
                    try:
                        await self._room
                    finally:
                        self._room = None
        finally:
            self._wake()

    def _wake(self, *_: Any) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def watch(self, gone: asyncio.Future[None]) -> None:
        """Wake ``wait`` as soon as ``gone`` is done (the harness hung up)."""
        self._gone = gone
        gone.add_done_callback(self._wake)

    @property
    def ready(self) -> bool:
        """Something to do without waiting: buffered events, or the turn's end."""
        return bool(self._buffer) or self._task.done()

    @property
    def ended(self) -> bool:
        """The turn has ended and every event it produced has been taken."""
        return self._task.done() and not self._buffer

    async def wait(self, at_most_s: float) -> None:
        """Until ``ready``, the harness hangs up, or ``at_most_s`` seconds pass."""
        if self.ready or (self._gone is not None and self._gone.done()):
            return
        waiter = self._waiter = self._loop.create_future()
        timer = self._loop.call_later(at_most_s, self._wake)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    def take(self) -> list[OutputEvent]:
        """Every buffered event, oldest first, and an empty buffer."""
        events, self._buffer = self._buffer, []
        room = self._room
        if room is not None and not room.done():
            room.set_result(None)
        return events

    def finish(self) -> None:
        """After ``ended``: raise what ended the turn, if it raised."""
        self._task.result()

    async def cancel(self) -> None:
        """Stop the turn if it is still running, then close its generator."""
        if not self._task.done():
            # Cancelling the pipeline mid-step aborts the backend and records the turn.
            self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await self._events.aclose()
