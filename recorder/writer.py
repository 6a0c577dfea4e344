"""The off-hot-path turn write queue: the pipeline submits, a background task persists.

Contract:
- ``submit(turn)`` never blocks and never raises: it appends to an in-memory queue.
- One background task (``start()``) writes the queue in FIFO batches of up to
  ``max_batch`` turns (waiting up to ``flush_interval_s`` to fill one), each batch with one
  multi-row insert (``Store.write_rows``; asyncpg runs it as a prepared ``executemany``).
- Each turn is encoded (``recorder.rows.encode_turn``) once: a journaled turn when it is
  journaled, any other when its batch is taken. The queue keeps the encoded row, and the
  same row goes to the journal, the database and the spool.
- A turn the database refuses for good (``Conflict``, ``InvalidRequest``: a value no column
  holds) is isolated by writing the batch one turn at a time, so one bad record never
  wedges the queue or the spool's replay. It is **quarantined**: the original row is kept
  in the ``quarantine`` spool (when given) for inspection, counted in ``quarantined`` and
  logged, and the row ``recorder.rows.storable`` makes of it (token arrays and request
  bytes exact, refused text values replaced, ``error`` saying so) is written instead, so
  the session's later turns, which build on it, still export. Only a turn whose fallback
  is refused too is counted in ``dropped``.
- ``record_now(turn)``: a turn written at once by the caller, awaiting nothing, when the
  queue is empty, nothing is spooled, and the store can write so now (a SQLite file's
  connection on the event loop: ``Store.write_rows_now``); else None, and the caller
  submits it. A lone turn (c=1) then pays no hand-off to the writer's task and back (0.1
  ms of its path inside the proxy; a closed-loop client at c=1 sees the CPU saved, 0.04-
  0.06 ms: ``docs/performance.md``). Its outcome is
  ``submit_durable``'s: the commit is synced; a failure of any kind leaves the turn to
  the queue, which retries, spools or quarantines it as it would any other.
- ``submit_durable(turn, alone=True)``: the caller says no other turn is in flight. When
  the queue is idle as well (nothing queued, being written, spooled, or written alone
  already), the turn is written by the caller's own task, awaiting the database (a
  Postgres round trip, or SQLite's writer thread): no wake-up of the writer's task, no
  batch, no future to settle (``docs/performance.md``). Within the journal's grace; a
  database that has not taken it by then, refused it or failed leaves it to the queue's
  path with the rest of the grace, as above. ``flush`` counts a turn being written so.
- ``await flush()`` returns once every turn submitted before the call is in the database
  or dropped (spooled turns included: it triggers a replay at once). It waits as long as
  the database is down; bound it with ``asyncio.timeout`` where that matters.
- ``await close()`` flushes for up to ``close_timeout_s``; with a spool, whatever is still
  in memory then goes to the spool, so a graceful shutdown loses nothing either way.

With a ``Spool`` (the production set-up), nothing waits on the database:
- A batch whose write fails with ``RecorderError`` or takes longer than
  ``write_timeout_s`` is appended to the spool (fsync'd), and the writer switches to
  spooling: later batches go straight to the spool until a replay succeeds.
- Replay runs with capped exponential backoff while the spool is non-empty, on start-up
  (the spool left by a previous run of this proxy, and any orphaned spool of a dead proxy
  under the same root) and on ``flush()``. It is idempotent by turn id, so a write that
  timed out but committed, or a crash in the middle of a replay, duplicates nothing.

Back-pressure (documented choice): memory holds at most ``max_pending`` turns. When the
queue is longer (the database keeps up but slower than turns arrive), batches bypass the
database and go to the spool, which absorbs bursts at disk speed and is replayed later.
Inference never slows down because of the recorder; only disk space is consumed.
Without a spool (tests, tools) failed batches stay at the head of the queue and are retried
with backoff, and the queue is unbounded.

Crash window: a turn is durable once it is in the database, the spool or the journal.
``await submit_durable(turn)`` is what a completed turn's pipeline awaits before the
harness receives the end of its response. It queues the turn at once (no batching delay)
and waits for its batch to settle; only a turn the database has not taken within
``journal_after_s`` is fsync'd into the ``Journal`` (when there is one); the whole wait,
the fsync aside, is at most ``durable_wait_s``. A database that took the turn made it as
durable as the journal would (Postgres and SQLite both sync a commit), so in the common
case no fsync of the proxy's own is paid, and the journal carries exactly the turns of a
slow or absent database. It returns the ``Durability`` reached: ``RECORDED`` (in the
database: every replica sees it, so a finish posted after the harness ended finds it),
``LATE`` (the database took it after its session was finished, so it is stored
``failed``: a finished session takes no more turns, and an exported group never changes),
or ``ON_DISK`` (journal or spool only: the database is away; the turn is replayed when it
is back). When neither the journal nor the spool nor the database has the turn in time (a
full disk during an outage) it raises ``RecorderUnavailable``: the harness's turn fails
loudly rather than being silently undurable; the turn stays queued and is written when
the database returns. A dead proxy's journal is replayed at the next start, so even
SIGKILL loses no turn the harness has.

A full or read-only spool disk never stops the writer: a batch the spool refuses is
offered to the database, and while neither takes it the batch stays at the head of the
queue (retried with backoff, the database first). ``disk_ok`` is false while the last
journal or spool write failed; readiness reports it.

Counters (plain attributes, mirrored to ``RecorderMetrics`` when given): ``submitted``,
``written``, ``dropped``, ``quarantined``, ``late``, ``batches``, ``failures`` (failed
write attempts), ``disk_failures`` (journal or spool writes the disk refused),
``undurable`` (durable submits that reached no durable place in time), ``spooled``,
``replayed``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Sequence
from enum import StrEnum

from kernel.errors import Conflict, InvalidRequest, LegoError, RecorderError, RecorderUnavailable
from recorder.journal import Journal
from recorder.metrics import RecorderMetrics
from recorder.records import TurnRecord
from recorder.rows import StoredTurn, encode_turn, storable
from recorder.spool import Spool
from recorder.store import Store

log = logging.getLogger(__name__)

REPLAY_TIMEOUT_S = 30.0  # one replayed batch; replays are off the hot path


class Durability(StrEnum):
    """Where ``submit_durable`` left a turn (see the module docstring)."""

    RECORDED = "recorded"
    LATE = "late"
    ON_DISK = "on_disk"


class TurnWriter:
    def __init__(
        self,
        store: Store,
        *,
        spool: Spool | None = None,
        orphans: Sequence[Spool] = (),
        journal: Journal | None = None,
        quarantine: Spool | None = None,
        metrics: RecorderMetrics | None = None,
        max_batch: int = 256,
        flush_interval_s: float = 0.05,
        retry_initial_s: float = 0.1,
        retry_max_s: float = 5.0,
        write_timeout_s: float = 1.0,
        journal_after_s: float = 0.25,
        durable_wait_s: float = 1.0,
        max_pending: int = 2_000,
        close_timeout_s: float = 5.0,
        warn_pending: int = 10_000,
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        self._store = store
        self._spool = spool
        self._orphans = list(orphans)
        self._journal = journal
        self._quarantine = quarantine
        self._metrics = metrics
        self._max_batch = max_batch
        self._flush_interval_s = flush_interval_s
        self._retry_initial_s = retry_initial_s
        self._retry_max_s = retry_max_s
        self._write_timeout_s = write_timeout_s
        self._journal_after_s = journal_after_s
        self._durable_wait_s = durable_wait_s
        self._max_pending = max_pending
        self._close_timeout_s = close_timeout_s
        self._warn_pending = warn_pending
        # A turn stays a record until it is encoded, and is never encoded again after.
        self._queue: deque[TurnRecord | StoredTurn] = deque()
        self._wake = asyncio.Event()
        self._progress = asyncio.Condition()
        self._done = 0  # turns taken off the queue (written, spooled or dropped), FIFO
        self._flush_target = 0
        self._task: asyncio.Task[None] | None = None
        self._spooling = False  # the database failed: batches go to the spool
        self._replay_delay = retry_initial_s
        self._next_replay = 0.0  # monotonic; replay the spool once past it
        # Durable submits waiting for their batch, and what each settled turn reached.
        self._waiting: dict[str, asyncio.Future[Durability]] = {}
        self._outcomes: dict[str, Durability] = {}  # of the batch being persisted
        self._alone = 0  # turns being written by their own task (_write_alone)
        self.disk_ok = True
        self.submitted = 0
        self.written = 0
        self.dropped = 0
        self.quarantined = 0
        self.late = 0
        self.batches = 0
        self.failures = 0
        self.disk_failures = 0
        self.undurable = 0
        self.spooled = 0
        self.replayed = 0
        if metrics is not None:
            metrics.pending.set_function(lambda: len(self._queue))
            metrics.disk_failures.set_function(lambda: self.disk_failures)
            metrics.disk_ok.set_function(lambda: float(self.disk_ok))
        if metrics is not None and spool is not None:
            metrics.spool_age.set_function(spool.oldest_age_s)
            metrics.spool_bytes.set_function(lambda: spool.size_bytes)
            metrics.spool_turns.set_function(lambda: spool.records)

    @property
    def pending(self) -> int:
        """Turns submitted but not yet settled, the batch being written included."""
        return len(self._queue)

    @property
    def spooled_pending(self) -> int:
        """Turns in the spool, waiting for a replay (this proxy's and adopted ones)."""
        spools = [self._spool, *self._orphans] if self._spool else self._orphans
        return sum(spool.records for spool in spools)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="lego-turn-writer"
            )

    async def submit_durable(self, turn: TurnRecord, *, alone: bool = False) -> Durability:
        """``submit``, then wait until the turn is durable (see the module docstring).
        ``alone``: no other turn is in flight, so this one may be written by the caller's
        own task (``_write_alone``) when the queue is idle."""
        try:
            stored = encode_turn(turn)
        except InvalidRequest:
            self.submit(turn)  # unstorable: the batch that takes it drops and counts it
            return Durability.ON_DISK
        loop = asyncio.get_running_loop()
        began = loop.time()
        # The whole wait, the journal's grace included, stays within durable_wait_s
        # (no request waits on the database for longer).
        deadline = began + self._durable_wait_s
        grace = min(self._journal_after_s, self._durable_wait_s)
        if alone and self._writes_alone():
            outcome = await self._write_alone(stored, grace)
            if outcome is not None:
                return outcome
            grace = max(0.0, grace - (loop.time() - began))  # the queue's path takes it
        self.start()
        settled: asyncio.Future[Durability] = asyncio.get_running_loop().create_future()
        self._waiting[stored.id] = settled
        self._enqueue(stored)
        self._flush_target = max(self._flush_target, self.submitted)  # no batching delay
        self._wake.set()
        journaled = False
        try:
            if self._journal is not None:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(grace):
                        return await asyncio.shield(settled)
                # The database is slow or away: the turn goes to disk before its answer ends.
                journaled = await self._journal.append(stored)
                self._disk(journaled)
            async with asyncio.timeout_at(deadline):
                return await asyncio.shield(settled)
        except TimeoutError:
            if journaled:
                return Durability.ON_DISK
            self.undurable += 1
            if self._metrics is not None:
                self._metrics.undurable.inc()
            raise RecorderUnavailable(
                "the turn could not be made durable: the database did not take it within "
                f"{self._durable_wait_s:g} s and the disk refused it; it is kept in memory "
                "and written when the database is back"
            ) from None
        finally:
            self._waiting.pop(stored.id, None)

    def _writes_alone(self) -> bool:
        """Nothing is queued, being written, spooled or written alone already: a turn
        written now overtakes none, and concurrent turns still share the queue's batches."""
        return not (self._queue or self._spooling or self._alone or self.spooled_pending)

    async def _write_alone(self, stored: StoredTurn, limit_s: float) -> Durability | None:
        """The turn written by the caller's task, awaiting the database directly: no
        hand-off to the writer's task and back (a wake-up, a batch, a future settled).
        None when the database did not take it within ``limit_s`` (the journal's grace),
        refused it or failed: then the queue's path retries, spools, journals or
        quarantines it as any other turn. ``flush`` waits for it meanwhile."""
        self._alone += 1
        began = time.perf_counter()
        try:
            async with asyncio.timeout(limit_s):
                late = await self._store.write_rows([stored])
        except (LegoError, TimeoutError):
            return None  # a write cut short may still commit: the queue's is idempotent
        except Exception:
            # Not a database error, so a bug: the queue's path keeps the turn, as it would.
            log.exception("turn writer: unexpected error writing turn %s alone", stored.id)
            return None
        finally:
            self._alone -= 1
        if self._metrics is not None:
            self._metrics.write_latency.observe(time.perf_counter() - began)
            self._metrics.written_at_once.inc()
        self.submitted += 1
        self._done += 1
        self.batches += 1
        self.written += 1
        self._count_late(late)
        async with self._progress:
            self._progress.notify_all()  # a flush may be waiting for this turn
        return Durability.LATE if stored.id in late else Durability.RECORDED

    def record_now(self, turn: TurnRecord) -> Durability | None:
        """The turn written at once, or None: then ``submit_durable`` it (module docstring).
        Nothing is queued or being written when it writes, so the queue's order holds."""
        if self._queue or self._spooling or self.spooled_pending or not self._store.writes_now:
            return None
        try:
            stored = encode_turn(turn)
            began = time.perf_counter()
            late = self._store.write_rows_now([stored])
        except LegoError:
            return None  # unstorable, refused or failed: the queue's path decides
        except Exception:
            # Not a database error, so a bug: the queue's path keeps the turn, as it would.
            log.exception("turn writer: unexpected error writing turn %s at once", turn.id)
            return None
        if late is None:
            return None
        if self._metrics is not None:
            self._metrics.write_latency.observe(time.perf_counter() - began)
            self._metrics.written_at_once.inc()
        self.submitted += 1
        self._done += 1
        self.batches += 1
        self.written += 1
        self._count_late(late)
        return Durability.LATE if stored.id in late else Durability.RECORDED

    def submit(self, turn: TurnRecord) -> None:
        self._enqueue(turn)

    def _enqueue(self, turn: TurnRecord | StoredTurn) -> None:
        self._queue.append(turn)
        self.submitted += 1
        if self._warn_pending and len(self._queue) % self._warn_pending == 0:
            log.warning("turn writer: %d turns waiting in memory", len(self._queue))
        if len(self._queue) == 1 or len(self._queue) >= self._max_batch:
            self._wake.set()

    async def flush(self) -> None:
        self.start()
        # A turn being written alone is counted when it is (or when the queue takes it).
        target = self.submitted + self._alone
        self._flush_target = max(self._flush_target, target)
        self._next_replay = 0.0
        self._wake.set()
        async with self._progress:
            await self._progress.wait_for(
                lambda: self._done >= target and self.spooled_pending == 0
            )

    async def close(self) -> None:
        if self._spool is None:
            await self.flush()
        else:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._close_timeout_s):
                    await self.flush()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._spool is not None:
            # The database did not take everything in time: the spool keeps the rest for
            # the next start (a batch cut off mid-write may land twice; replay dedupes).
            rest = self._encode(list(self._queue))
            if await self._spill(rest) and self._journal is not None:
                await self._journal.release(turn.id for turn in self._queue)
            self._queue.clear()
            self._spool.close()
        if self._journal is not None:
            await self._journal.close()
        for orphan in self._orphans:
            orphan.close()
        if self._quarantine is not None:
            self._quarantine.close()

    # -- the background task ----------------------------------------------------
    async def _run(self) -> None:
        delay = self._retry_initial_s
        while True:
            timeout = None
            if self.spooled_pending:
                timeout = max(0.0, self._next_replay - time.monotonic())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
            self._wake.clear()
            if self.spooled_pending and time.monotonic() >= self._next_replay:
                await self._replay()
                async with self._progress:
                    self._progress.notify_all()
            while self._queue:
                if len(self._queue) < self._max_batch and self._done >= self._flush_target:
                    # Give concurrent turns a moment to join this batch, unless someone is
                    # waiting in flush().
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self._flush_interval_s):
                            await self._wake.wait()
                    self._wake.clear()
                batch = [self._queue[i] for i in range(min(self._max_batch, len(self._queue)))]
                if not await self._persist(batch):
                    # Neither the database nor the disk took it: it stays at the head of
                    # the queue, and the next attempt tries the database first.
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, self._retry_max_s)
                    continue
                delay = self._retry_initial_s
                if self._journal is not None:
                    await self._journal.release(turn.id for turn in batch)
                for _ in batch:
                    self._queue.popleft()
                self._done += len(batch)
                self._settle_waiters()
                async with self._progress:
                    self._progress.notify_all()

    def _settle_waiters(self) -> None:
        for turn_id, outcome in self._outcomes.items():
            waiter = self._waiting.get(turn_id)
            if waiter is not None and not waiter.done():
                waiter.set_result(outcome)
        self._outcomes.clear()

    async def _persist(self, batch: Sequence[TurnRecord | StoredTurn]) -> bool:
        """Settle the batch (database, spool, or quarantine); False if nothing took it."""
        stored = self._encode(batch)
        if self._spool is None:
            await self._write_until_settled(stored)
            return True
        settled = set(self._outcomes)  # a batch tried again: the turns it settled already
        bypass = self._spooling or len(self._queue) > self._max_pending
        if bypass and await self._spill([turn for turn in stored if turn.id not in settled]):
            return True
        # Here the database is up as far as we know, or the spool's disk refused the batch
        # and the database is the only way left for it.
        try:
            async with asyncio.timeout(self._write_timeout_s):
                await self._write(stored, settled)
        except (RecorderError, TimeoutError) as exc:
            self._note_failure(exc, len(stored))
            return await self._spill([turn for turn in stored if turn.id not in settled])
        except Exception:
            # Not a database error, so a bug; keep the turns (nothing lost) in the spool.
            self.failures += 1
            log.exception("turn writer: unexpected error writing %d turns", len(stored))
            self._spooling = True
            return await self._spill([turn for turn in stored if turn.id not in settled])
        self.batches += 1
        if self._spooling and self.spooled_pending == 0:
            self._spooling = False  # the database took a batch and nothing waits on disk
        return True

    def _encode(self, batch: Sequence[TurnRecord | StoredTurn]) -> list[StoredTurn]:
        stored = []
        for turn in batch:
            if isinstance(turn, StoredTurn):
                stored.append(turn)
                continue
            try:
                stored.append(encode_turn(turn))
            except InvalidRequest as exc:
                # Deliberately swallowed: this record can never be stored; counted.
                self._drop(turn.id, exc.message)
        return stored

    def _note_failure(self, exc: BaseException, size: int) -> None:
        self.failures += 1
        if self._metrics is not None:
            self._metrics.write_failures.set(self.failures)
        reason = exc.message if isinstance(exc, RecorderError) else "timed out"
        if not self._spooling:
            log.warning("turn writer: writing %d turns failed (%s); spooling", size, reason)
        self._spooling = True
        self._next_replay = time.monotonic() + self._replay_delay

    def _disk(self, ok: bool) -> None:
        if not ok:
            self.disk_failures += 1
        self.disk_ok = ok

    async def _spill(self, rows: Sequence[StoredTurn]) -> bool:
        """Append to the spool; False (logged, counted) when its disk refuses."""
        assert self._spool is not None
        if not rows:
            return True
        try:
            await asyncio.to_thread(self._spool.append, rows)
        except OSError as exc:
            self._disk(False)
            log.error("turn writer: cannot spool %d turns: %s", len(rows), exc)
            return False
        self._disk(True)
        self.spooled += len(rows)
        for turn in rows:
            self._outcomes.setdefault(turn.id, Durability.ON_DISK)
        if self._metrics is not None:
            self._metrics.spooled.inc(len(rows))
        return True

    async def _replay(self) -> None:
        spools = [self._spool, *self._orphans] if self._spool else list(self._orphans)
        for spool in spools:
            await asyncio.to_thread(spool.rotate)
            for segment in spool.closed_segments():
                rows = await asyncio.to_thread(spool.read, segment)
                settled: set[str] = set()
                for at in range(0, len(rows), self._max_batch):
                    chunk = rows[at : at + self._max_batch]
                    try:
                        async with asyncio.timeout(REPLAY_TIMEOUT_S):
                            await self._write(chunk, settled)
                    except (RecorderError, TimeoutError) as exc:
                        self.failures += 1
                        log.info("turn writer: replay failed (%s); will retry", exc)
                        self._next_replay = time.monotonic() + self._replay_delay
                        self._replay_delay = min(self._replay_delay * 2, self._retry_max_s)
                        self._outcomes.clear()  # replayed turns have no waiters
                        return
                self.replayed += len(rows)
                if self._metrics is not None:
                    self._metrics.replayed.inc(len(rows))
                await asyncio.to_thread(spool.remove, segment)
        self._outcomes.clear()
        for orphan in [o for o in self._orphans if o.records == 0]:
            orphan.close()
            orphan.discard()  # a dead proxy's directory, replayed: nothing is left in it
            self._orphans.remove(orphan)
        if self._spooling:
            log.warning("turn writer: the database is back; the spool is replayed")
        self._spooling = False
        self._replay_delay = self._retry_initial_s

    async def _write_until_settled(self, batch: Sequence[StoredTurn]) -> None:
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

    async def _write(self, batch: Sequence[StoredTurn], settled: set[str]) -> None:
        todo = [turn for turn in batch if turn.id not in settled]
        if not todo:
            return
        try:
            began = time.perf_counter()
            late = await self._store.write_rows(todo)
            if self._metrics is not None:
                self._metrics.write_latency.observe(time.perf_counter() - began)
        except (Conflict, InvalidRequest) as exc:
            if len(todo) > 1:
                for turn in todo:
                    await self._write([turn], settled)
                return
            await self._quarantine_turn(todo[0], exc)
            settled.add(todo[0].id)
            return
        self.written += len({turn.id for turn in todo})
        self._count_late(late)
        for turn in todo:
            settled.add(turn.id)
            self._outcomes[turn.id] = Durability.LATE if turn.id in late else Durability.RECORDED

    def _count_late(self, late: set[str]) -> None:
        if late:
            self.late += len(late)
            if self._metrics is not None:
                self._metrics.late.inc(len(late))
            log.warning(
                "turn writer: %d turns reached the database after their session finished; "
                "stored as failed",
                len(late),
            )

    async def _quarantine_turn(self, turn: StoredTurn, exc: LegoError) -> None:
        """A turn the database refused for good: kept aside, reported, and replaced by the
        row it can take, so the turns after it still build on it. A database outage while
        writing that row raises, and the turn is retried like any other."""
        self.quarantined += 1
        if self._metrics is not None:
            self._metrics.quarantined.inc()
        log.error("turn writer: the database refused turn %s: %s; quarantined", turn.id, exc)
        if self._quarantine is not None:
            try:
                await asyncio.to_thread(self._quarantine.append, [turn])
            except OSError as error:
                log.error("turn writer: cannot quarantine turn %s: %s", turn.id, error)
        fallback = storable(turn) if isinstance(exc, InvalidRequest) else None
        if fallback is None:
            self._drop(turn.id, exc.message)
            return
        try:
            late = await self._store.write_rows([fallback])
        except (Conflict, InvalidRequest) as error:
            self._drop(turn.id, error.message)
            return
        self.written += 1
        self._count_late(late)
        self._outcomes[turn.id] = Durability.LATE if turn.id in late else Durability.RECORDED

    def _drop(self, turn_id: str, reason: str) -> None:
        self.dropped += 1
        if self._metrics is not None:
            self._metrics.dropped.inc()
        log.error("turn writer: dropping turn %s: %s", turn_id, reason)
        waiter = self._waiting.get(turn_id)
        if waiter is not None and not waiter.done():
            # Its caller learns now, and why: it is in no durable place and never will be.
            waiter.set_exception(
                RecorderError(f"the database refused the turn, which is dropped: {reason}")
            )
