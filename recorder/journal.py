"""Write-ahead journal: a completed turn is on disk before the harness sees its last byte.

Owns the durability of completed turns between "the response is complete" and "the row is
in the database (or the spool)". The write queue batches database writes every few tens of
milliseconds; a proxy killed inside that window (SIGKILL, power loss, OOM) would lose
turns whose responses the harness already has. The journal closes that window.

Contract:
- ``await append(row)`` returns True once ``row`` is fsync'd in this proxy's journal
  directory. Concurrent appends share one write + fsync (group commit) in a worker thread,
  so the cost per turn is a fraction of an fsync under load; ``flushes`` counts those
  writes. It never raises: when the disk refuses (full, read-only) or the row cannot be
  framed, it returns False, logged and counted (``failures``); the writer then makes the
  turn durable in the database or fails it (``recorder.writer``).
- ``await release(ids)`` is called once those turns are settled (in the database, in the
  spool, or dropped as unstorable); segments whose every turn is released are deleted.
  Ids it never took cost nothing (the writer journals only a turn the database is slow
  to take, and releases every batch), and a turn released while its append is still in
  flight (its batch settled meanwhile) is released when the append lands.
  Segments rotate after ``rotate_records`` turns or ``rotate_age_s`` seconds.
- Each proxy process journals into a directory of its own (a ``Spool``, locked while the
  process lives). What a dead process left behind is an orphan spool like any other: the
  writer replays it into the database at start-up, idempotently by turn id.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Iterable
from pathlib import Path

from recorder.rows import StoredTurn
from recorder.spool import Spool

log = logging.getLogger(__name__)


class Journal:
    def __init__(
        self, spool: Spool, *, rotate_records: int = 256, rotate_age_s: float = 5.0
    ) -> None:
        self._spool = spool
        self._rotate_records = rotate_records
        self._rotate_age_s = rotate_age_s
        self._lock = asyncio.Lock()  # one thread at a time touches the spool's files
        self._waiting: list[tuple[StoredTurn, asyncio.Future[bool]]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._open: set[str] = set()  # ids in the segment being appended to, not released
        self._appending: set[str] = set()  # ids waiting for their write + fsync
        self._released_early: set[str] = set()  # of those, the ones settled meanwhile
        self._open_records = 0
        self._open_since = 0.0
        self._closed: list[tuple[Path, set[str]]] = []  # rotated segments, ids not released
        self.appended = 0
        self.flushes = 0  # write + fsync rounds, each covering every append waiting then
        self.failures = 0

    @property
    def directory(self) -> Path:
        return self._spool.directory

    @property
    def unreleased(self) -> int:
        return len(self._open) + sum(len(ids) for _, ids in self._closed)

    async def append(self, row: StoredTurn) -> bool:
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiting.append((row, done))
        self._appending.add(row.id)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush())
        return await done

    async def _flush(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting, []
            rows = [row for row, _ in batch]
            ids = {row.id for row in rows}
            ok = False
            async with self._lock:
                try:
                    self.flushes += 1
                    await asyncio.to_thread(self._spool.append, rows)
                except (OSError, TypeError, ValueError) as exc:
                    # Deliberately swallowed: append's answer tells the writer, which makes
                    # the turns durable in the database or fails them. Counted and logged.
                    self.failures += 1
                    log.error("journal: cannot append %d turns: %s", len(rows), exc)
                else:
                    ok = True
                    if not self._open_records:
                        self._open_since = time.monotonic()
                    self._open.update(ids - self._released_early)
                    self._open_records += len(rows)
                    self.appended += len(rows)
                    if self._open_records >= self._rotate_records:
                        await self._rotate()
                finally:
                    self._appending -= ids
                    self._released_early -= ids
            for _, done in batch:
                if not done.done():
                    done.set_result(ok)

    async def release(self, ids: Iterable[str]) -> None:
        released = set(ids)
        self._released_early |= released & self._appending
        if not (self._open_records or self._closed):
            return  # nothing on disk (the usual case: the database took its turns in time)
        self._open -= released
        for _, pending in self._closed:
            pending -= released
        async with self._lock:
            if self._open_records and time.monotonic() - self._open_since >= self._rotate_age_s:
                await self._rotate()
            for entry in [entry for entry in self._closed if not entry[1]]:
                await asyncio.to_thread(self._spool.remove, entry[0])
                self._closed.remove(entry)

    async def _rotate(self) -> None:
        """Close the segment being appended to (the caller holds the lock)."""
        await asyncio.to_thread(self._spool.rotate)
        segments = self._spool.closed_segments()
        if segments:
            self._closed.append((segments[-1], self._open))
        self._open, self._open_records = set(), 0

    async def close(self) -> None:
        """After the writer settled everything: drop what is released, keep the rest."""
        if self._flusher is not None:
            await self._flusher
        async with self._lock:
            if self._open_records:
                await self._rotate()
            for path, pending in self._closed:
                if not pending:
                    await asyncio.to_thread(self._spool.remove, path)
            self._closed = [(path, pending) for path, pending in self._closed if pending]
        self._spool.close()
        if not self._closed:
            # Everything is settled elsewhere: this process's journal directory is done.
            shutil.rmtree(self._spool.directory, ignore_errors=True)
