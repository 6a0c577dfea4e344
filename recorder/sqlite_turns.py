"""The per-turn operations on a SQLite file (``recorder.per_turn.PerTurn``), on Python's
``sqlite3`` directly.

Through SQLAlchemy (even with each transaction run whole on a thread) a turn's status read
and one-row write cost 1.1 ms of CPU on the development machine; the same statements on
``sqlite3`` cost 0.6 ms. The replica's pause-state poll is a read like the status read.
Every other statement of the recorder stays on SQLAlchemy.

- Two threads, each with its own connection to the file, opened on first use with the
  engine's pragmas (``recorder.database.sqlite_pragmas``: WAL, every commit synced, a busy
  timeout, foreign keys): the reader's status reads never wait behind a write that waits
  on the file lock (another process writing), since WAL readers take no lock.
- The operations run on the calling thread (the event loop) first, on a third connection
  that the reader thread opens and that never waits for a lock (``busy_timeout`` 0): a
  handoff to a thread and back costs 0.23 ms of CPU on the development machine (two
  context switches), the indexed status read itself 6 us. What SQLite answers "busy" (a
  write lock held by another connection or process, a WAL being recovered) goes to the
  operation's thread, which waits for the lock; so does a call from any other thread than
  the one the first call came from (a ``sqlite3`` connection serves one thread). A write
  whose commit (its fsync) took longer than ``INLINE_WRITE_S`` moves the next ones to the
  writer thread, so a slow disk does not stall the loop; ``FAST_WRITES_TO_RETURN`` in a
  row there that took no longer move them back.
- The WAL is checkpointed on the writer thread, never inside a commit on the loop: the
  per-turn connections turn SQLite's automatic checkpoint off (at 1,000 WAL pages it runs
  inside whichever commit crosses them, and its own page copies and fsync took that
  commit past ``INLINE_WRITE_S``, which sent the next ``FAST_WRITES_TO_RETURN`` writes to
  the thread: 39% of the turns at c=1 paid a thread handoff). Once the turns written
  since the last checkpoint add up to ``CHECKPOINT_AFTER_BYTES`` (their variable-size
  values and ``ROW_PAGE_BYTES`` each for the pages every row touches), a PASSIVE
  checkpoint is queued on the writer thread, and the writes that come while it runs
  queue there behind it: none is written meanwhile, so the checkpoint copies the whole
  WAL and the next write starts it again from its beginning (a WAL written to while it
  is checkpointed may never be wholly copied, and never restart).
- ``write_now`` is ``write`` when it would run on the loop, done without awaiting (None
  where ``write`` would go to the writer thread): the turn writer's lone turns.
- ``write``: one transaction (``BEGIN IMMEDIATE``: the write lock first). Each row
  is inserted ``ON CONFLICT (id) DO NOTHING``, idempotent by id; then, with the lock
  held, the finished sessions are read, so a finish committed before is seen and one not
  yet committed waits for this transaction: its completed turns of finished sessions are
  updated to ``failed`` with ``LATE_ERROR``, then the named side requests re-labelled.
- Values are bound as SQLAlchemy binds them (``recorder.per_turn.TurnColumns``).
- Failures become the project's errors (``recorder.database.translated_sqlite``).
  Cancelling the await does not stop a statement already running on its thread: it
  commits or fails there (both operations are idempotent or read-only). ``close()`` waits
  for running statements, then closes the connections; a closed store refuses more with
  ``RecorderError``.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from kernel.errors import LegoError, RecorderError
from recorder import rows
from recorder.database import sqlite_pragmas, translated_sqlite
from recorder.per_turn import (
    LATE_ERROR,
    PAUSE_STATE_SQL,
    Relabels,
    TurnColumns,
    Values,
    late_turns,
    pause_state_of,
)
from recorder.records import PauseState, SessionStatus, TurnStatus

T = TypeVar("T")


class _Thread:
    """One thread and the connection only it uses."""

    def __init__(self, path: str, name: str) -> None:
        self._path = path
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=name)
        self._conn: sqlite3.Connection | None = None

    async def call(self, work: Callable[[sqlite3.Connection], T], action: str) -> T:
        return await self.submit(work, action)

    def submit(self, work: Callable[[sqlite3.Connection], T], action: str) -> asyncio.Future[T]:
        """``work`` queued on the thread, behind what is queued there already."""
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(self._pool, self._run, work, action)

    def _run(self, work: Callable[[sqlite3.Connection], T], action: str) -> T:
        try:
            if self._conn is None:
                self._conn = self._connect()
            return work(self._conn)
        except LegoError:
            raise
        except (sqlite3.Error, OverflowError, OSError) as exc:
            raise translated_sqlite(exc, action) from exc

    def _connect(self) -> sqlite3.Connection:
        return self.connect(self._path)

    @staticmethod
    def connect(path: str, *, check_same_thread: bool = True) -> sqlite3.Connection:
        # isolation_level None: no implicit transactions, the write says BEGIN itself.
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=check_same_thread)
        try:
            sqlite_pragmas(conn.cursor())
            # Checkpoints run on the writer thread, never inside a commit (module docstring).
            conn.execute("PRAGMA wal_autocheckpoint=0")
        except BaseException:
            conn.close()
            raise
        return conn

    async def close(self) -> None:
        await asyncio.to_thread(self._shut_down)

    def _shut_down(self) -> None:
        self._pool.submit(self._close_connection).result()
        self._pool.shutdown(wait=True)

    def _close_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


_BUSY = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)  # primary codes, of extended ones
# A write (its commit's fsync included) that took longer moves the next ones to the writer
# thread, and FAST_WRITES_TO_RETURN in a row there that took no longer move them back: a
# slow disk must not stall the event loop (a disk slow now and then stalls it at most once
# in that many writes), a fast one is not worth a thread handoff.
INLINE_WRITE_S = 0.002
FAST_WRITES_TO_RETURN = 8
# What the turns written since the last checkpoint may add to the WAL before the writer
# thread checkpoints it: about SQLite's own 1,000 pages of 4 KiB. A row counts its
# variable-size values (TurnColumns.size: token arrays, messages, JSON) and ROW_PAGE_BYTES
# for the table's and the indexes' pages it touches (5 WAL frames for a one-turn commit on
# the development machine, strace).
CHECKPOINT_AFTER_BYTES = 4 * 1024 * 1024
ROW_PAGE_BYTES = 16 * 1024
_log = logging.getLogger(__name__)


class _Elsewhere(enum.Enum):
    ELSEWHERE = "elsewhere"


_ELSEWHERE = _Elsewhere.ELSEWHERE


class _Inline:
    """The connection the operations use on the event loop's own thread."""

    def __init__(self, conn: sqlite3.Connection, thread: int) -> None:
        self.conn = conn
        self.thread = thread


def _open_inline(path: str) -> sqlite3.Connection:
    conn = _Thread.connect(path, check_same_thread=False)
    conn.execute("PRAGMA busy_timeout=0")  # a lock is waited for on the threads only
    return conn


class SqliteTurns:
    def __init__(self, path: str) -> None:
        self._path = path
        self._inline: _Inline | None = None
        self._write_on_loop = True
        self._fast_writes = 0  # in a row on the writer thread
        self._unchecked_bytes = 0  # written since the last checkpoint (estimated)
        self._checkpoint: asyncio.Future[tuple[int, int, int]] | None = None  # running
        self._reader = _Thread(path, "lego-sqlite-read")
        self._writer = _Thread(path, "lego-sqlite-write")
        self._columns = TurnColumns.of_table()
        names = self._columns.names
        self._insert = (
            f"INSERT INTO turns ({', '.join(names)}) VALUES ({', '.join('?' for _ in names)}) "
            "ON CONFLICT (id) DO NOTHING RETURNING id"
        )
        self._closed = False

    async def status(self, session_id: str, action: str) -> tuple[str, str | None] | None:
        def read(conn: sqlite3.Connection) -> tuple[str, str | None] | None:
            found = conn.execute(
                "SELECT status, termination FROM sessions WHERE id = ?", (session_id,)
            ).fetchone()
            return None if found is None else (str(found[0]), found[1])

        return await self._read(read, action)

    async def pause_state(self, action: str) -> PauseState:
        def read(conn: sqlite3.Connection) -> PauseState:
            return pause_state_of(conn.execute(PAUSE_STATE_SQL).fetchall())

        return await self._read(read, action)

    async def _read(self, read: Callable[[sqlite3.Connection], T], action: str) -> T:
        """``read`` on the loop's connection, or on the reader thread when SQLite answers
        busy there (or the caller is another thread)."""
        self._check_open(action)
        done = await self._on_loop(read, action)
        if done is not _ELSEWHERE:
            return done
        return await self._reader.call(read, action)

    async def write(self, values: Values, relabels: Relabels, action: str) -> set[str]:
        bound, session_ids = self._bind(values)

        def write(conn: sqlite3.Connection) -> set[str]:
            return self._transaction(conn, values, bound, session_ids, relabels)

        def timed(conn: sqlite3.Connection) -> tuple[set[str], float]:
            began = time.perf_counter()
            return write(conn), time.perf_counter() - began

        self._check_open(action)
        if self._write_on_loop and self._checkpoint is None:
            began = time.perf_counter()
            done = await self._on_loop(write, action)
            if done is not _ELSEWHERE:
                self._note_write(time.perf_counter() - began)
                self._note_written(bound)
                return done
        late, took = await self._writer.call(timed, action)
        self._note_write(took)
        self._note_written(bound)
        return late

    def write_now(self, values: Values, relabels: Relabels, action: str) -> set[str] | None:
        """``write`` on the loop's connection, at once; None (nothing written) where
        ``write`` would hand it to the writer thread: writes moved there by a slow commit, a
        checkpoint running, the connection not opened yet, another thread calling, or
        SQLite answering busy."""
        inline = self._inline
        if inline is None or not self.can_write_now():
            return None
        bound, session_ids = self._bind(values)

        def write(conn: sqlite3.Connection) -> set[str]:
            return self._transaction(conn, values, bound, session_ids, relabels)

        began = time.perf_counter()
        done = self._inline_call(inline, write, action)
        if done is _ELSEWHERE:
            return None
        self._note_write(time.perf_counter() - began)
        self._note_written(bound)
        return done

    def can_write_now(self) -> bool:
        inline = self._inline
        return (
            not self._closed
            and self._write_on_loop
            and self._checkpoint is None
            and inline is not None
            and inline.thread == threading.get_ident()
        )

    def _bind(self, values: Values) -> tuple[list[list[object]], list[str]]:
        bound = [self._columns.values(row) for row in values]
        return bound, sorted({str(row["session_id"]) for row in values})

    def _transaction(
        self,
        conn: sqlite3.Connection,
        values: Values,
        bound: list[list[object]],
        session_ids: list[str],
        relabels: Relabels,
    ) -> set[str]:
        # IMMEDIATE: the write lock first, so a connection that waits for no lock learns
        # it is held before it has done anything.
        conn.execute("BEGIN IMMEDIATE")
        try:
            late = self._write(conn, values, bound, session_ids, relabels)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:  # SQLite may have rolled it back itself (disk full)
                conn.execute("ROLLBACK")
            raise
        return late

    def _note_written(self, bound: list[list[object]]) -> None:
        """Count what the write added to the WAL; queue a checkpoint when it is due."""
        size = self._columns.size
        self._unchecked_bytes += sum(ROW_PAGE_BYTES + size(row) for row in bound)
        if (
            self._unchecked_bytes < CHECKPOINT_AFTER_BYTES
            or self._checkpoint is not None
            or self._closed
        ):
            return
        self._unchecked_bytes = 0
        self._checkpoint = self._writer.submit(_checkpoint, "checkpoint the WAL")
        self._checkpoint.add_done_callback(self._checkpointed)

    def _checkpointed(self, done: asyncio.Future[tuple[int, int, int]]) -> None:
        self._checkpoint = None
        if done.cancelled():
            return
        failure = done.exception()
        if failure is not None:
            # The next checkpoint (or another connection's automatic one) copies these.
            _log.warning("SQLite WAL checkpoint failed: %s", failure)

    def _note_write(self, took: float) -> None:
        fast = took <= INLINE_WRITE_S
        self._fast_writes = self._fast_writes + 1 if fast and not self._write_on_loop else 0
        on_loop = fast and (self._write_on_loop or self._fast_writes >= FAST_WRITES_TO_RETURN)
        if on_loop != self._write_on_loop:
            _log.info(
                "SQLite writes move %s: the last commit took %.1f ms",
                "onto the event loop" if on_loop else "to their thread",
                took * 1000,
            )
        self._write_on_loop = on_loop

    async def _on_loop(
        self, work: Callable[[sqlite3.Connection], T], action: str
    ) -> T | _Elsewhere:
        """``work`` run here, on the loop's connection; ``_ELSEWHERE`` when SQLite answered
        busy (nothing done) or the caller is not the loop's thread."""
        inline = self._inline
        if inline is None:
            # Opened on the reader thread: opening may wait for a lock (a switch to WAL).
            conn = await self._reader.call(lambda _: _open_inline(self._path), action)
            if self._inline is None and not self._closed:
                self._inline = inline = _Inline(conn, threading.get_ident())
            else:
                conn.close()
        if inline is None or inline.thread != threading.get_ident():
            return _ELSEWHERE
        return self._inline_call(inline, work, action)

    @staticmethod
    def _inline_call(
        inline: _Inline, work: Callable[[sqlite3.Connection], T], action: str
    ) -> T | _Elsewhere:
        """``work`` on the loop's connection; ``_ELSEWHERE`` when SQLite answered busy."""
        try:
            return work(inline.conn)
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode & 0xFF in _BUSY:
                return _ELSEWHERE
            raise translated_sqlite(exc, action) from exc
        except LegoError:
            raise
        except (sqlite3.Error, OverflowError, OSError) as exc:
            raise translated_sqlite(exc, action) from exc

    def _write(
        self,
        conn: sqlite3.Connection,
        values: Values,
        bound: list[list[object]],
        session_ids: list[str],
        relabels: Relabels,
    ) -> set[str]:
        inserted: set[str] = set()
        for row in bound:
            inserted.update(str(found[0]) for found in conn.execute(self._insert, row))
        finished = {
            str(found[0])
            for found in conn.execute(
                f"SELECT id FROM sessions WHERE id IN ({_marks(session_ids)}) AND status = ?",
                [*session_ids, SessionStatus.FINISHED.value],
            )
        }
        late = sorted(late_turns(values, inserted, finished))
        if late:
            conn.execute(
                f"UPDATE turns SET status = ?, error = ? WHERE id IN ({_marks(late)})",
                [TurnStatus.FAILED.value, LATE_ERROR, *late],
            )
        for session_id, named in relabels:
            conn.execute(
                "UPDATE turns SET classification = ?, fork_reason = ? WHERE session_id = ? "
                f"AND id IN ({_marks(named)}) AND classification = 'root'",
                [rows.SIDE_REQUEST_CLASSIFICATION, rows.SIDE_REQUEST_REASON, session_id, *named],
            )
        return set(late)

    def _check_open(self, action: str) -> None:
        if self._closed:
            raise RecorderError(f"cannot {action}: the store is closed")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._checkpoint is not None:
            await asyncio.wait([self._checkpoint])
        if self._inline is not None:
            self._inline.conn.close()
            self._inline = None
        await self._reader.close()
        await self._writer.close()


def _checkpoint(conn: sqlite3.Connection) -> tuple[int, int, int]:
    """A PASSIVE checkpoint (it waits for no reader or writer): (busy, WAL frames, frames
    copied to the database)."""
    busy, frames, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    return int(busy), int(frames), int(copied)


def _marks(items: Sequence[object]) -> str:
    return ", ".join("?" for _ in items)
