"""The off-hot-path turn write queue: the pipeline submits, a background task persists.

Contract:
- ``submit(turn)`` never blocks and never raises: it appends to an in-memory queue.
- One background task (``start()``) writes the queue in FIFO batches of up to
  ``max_batch`` turns, waiting up to ``flush_interval_s`` to fill a batch.
- ``await flush()`` returns once every turn submitted before the call is settled (written,
  or dropped as unstorable), starting the task if needed; ``await close()`` flushes and
  stops the task. Both wait as
  long as the database is down; bound them with ``asyncio.timeout`` where that matters.
- A batch that fails with ``RecorderError`` (database down, slow, locked) stays at the head
  of the queue and is retried with capped exponential backoff; retrying is safe because
  ``Store.write_turns`` is idempotent by turn id. A turn the database can never accept
  (``Conflict``, ``InvalidRequest``) is isolated by writing the batch one turn at a time,
  logged and dropped, so one bad record cannot wedge the queue.

Back-pressure: none yet. While the database is down the queue grows without bound in
memory, with a warning each time it passes another multiple of ``warn_pending``; a memory
bound with spooling to disk (so turns survive a process restart) is a later issue.

Counters (plain attributes; the app exports them to Prometheus): ``submitted``,
``written``, ``dropped``, ``batches``, ``failures`` (failed write attempts).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Sequence

from proxy.errors import Conflict, InvalidRequest, RecorderError
from recorder.records import TurnRecord
from recorder.store import Store

log = logging.getLogger(__name__)


class TurnWriter:
    def __init__(
        self,
        store: Store,
        *,
        max_batch: int = 256,
        flush_interval_s: float = 0.05,
        retry_initial_s: float = 0.1,
        retry_max_s: float = 5.0,
        warn_pending: int = 10_000,
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        self._store = store
        self._max_batch = max_batch
        self._flush_interval_s = flush_interval_s
        self._retry_initial_s = retry_initial_s
        self._retry_max_s = retry_max_s
        self._warn_pending = warn_pending
        self._queue: deque[TurnRecord] = deque()
        self._wake = asyncio.Event()
        self._progress = asyncio.Condition()
        self._done = 0  # turns taken off the queue (written or dropped), in FIFO order
        self._flush_target = 0
        self._task: asyncio.Task[None] | None = None
        self.submitted = 0
        self.written = 0
        self.dropped = 0
        self.batches = 0
        self.failures = 0

    @property
    def pending(self) -> int:
        """Turns submitted but not yet settled, the batch being written included."""
        return len(self._queue)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="lego-turn-writer"
            )

    def submit(self, turn: TurnRecord) -> None:
        self._queue.append(turn)
        self.submitted += 1
        if self._warn_pending and len(self._queue) % self._warn_pending == 0:
            log.warning("turn writer: %d turns waiting for the database", len(self._queue))
        if len(self._queue) == 1 or len(self._queue) >= self._max_batch:
            self._wake.set()

    async def flush(self) -> None:
        self.start()
        target = self.submitted
        self._flush_target = max(self._flush_target, target)
        self._wake.set()
        async with self._progress:
            await self._progress.wait_for(lambda: self._done >= target)

    async def close(self) -> None:
        await self.flush()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                if len(self._queue) < self._max_batch and self._done >= self._flush_target:
                    # Give concurrent turns a moment to join this batch, unless someone is
                    # waiting in flush().
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self._flush_interval_s):
                            await self._wake.wait()
                    self._wake.clear()
                batch = [self._queue[i] for i in range(min(self._max_batch, len(self._queue)))]
                await self._write_until_settled(batch)
                for _ in batch:
                    self._queue.popleft()
                self._done += len(batch)
                async with self._progress:
                    self._progress.notify_all()

    async def _write_until_settled(self, batch: Sequence[TurnRecord]) -> None:
        settled: set[str] = set()  # ids written or dropped, so a retry never counts twice
        delay = self._retry_initial_s
        while True:
            try:
                await self._write(batch, settled)
            except RecorderError as exc:
                self.failures += 1
                log.warning(
                    "turn writer: writing %d turns failed (%s); retrying in %.2fs, %d pending",
                    len(batch),
                    exc.message,
                    delay,
                    len(self._queue),
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._retry_max_s)
            except Exception:
                # Not a database error, so a bug; keep the turns (nothing lost) and retry
                # slowly rather than letting the task die and every flush() hang.
                self.failures += 1
                log.exception("turn writer: unexpected error writing %d turns", len(batch))
                await asyncio.sleep(self._retry_max_s)
            else:
                self.batches += 1
                return

    async def _write(self, batch: Sequence[TurnRecord], settled: set[str]) -> None:
        todo = [turn for turn in batch if turn.id not in settled]
        if not todo:
            return
        try:
            await self._store.write_turns(todo)
        except (Conflict, InvalidRequest) as exc:
            if len(todo) > 1:
                for turn in todo:
                    await self._write([turn], settled)
                return
            # Deliberately swallowed: this record can never be stored; counted in dropped.
            self.dropped += 1
            settled.add(todo[0].id)
            log.error("turn writer: dropping turn %s: %s", todo[0].id, exc.message)
            return
        self.written += len({turn.id for turn in todo})
        settled.update(turn.id for turn in todo)
