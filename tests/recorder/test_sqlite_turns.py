"""recorder.sqlite_turns: a turn's status read and write on ``sqlite3`` directly, on
threads of their own, with the engine's pragmas and the store's error mapping
(issue 21)."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from kernel.errors import Conflict, RecorderError
from recorder import rows
from recorder.migrate import upgrade_database
from recorder.per_turn import OverSqlAlchemy
from recorder.postgres_turns import PostgresTurns
from recorder.records import SessionInfo
from recorder.sqlite_turns import SqliteTurns
from recorder.store import Store
from tests.recorder.builders import make_turn
from tests.recorder.test_postgres_turns import assert_stored_the_same_by_both_paths
from tests.recorder.test_store import new_session


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite+aiosqlite:///{tmp_path / 'lego.sqlite3'}"


async def test_each_database_gets_its_per_turn_path(tmp_path: Path, database_url: str) -> None:
    expected = {
        sqlite_url(tmp_path): SqliteTurns,
        # A second connection to an in-memory database would see another, empty one.
        "sqlite+aiosqlite:///:memory:": OverSqlAlchemy,
    }
    if database_url.startswith("postgresql"):
        expected = {database_url: PostgresTurns}
    for url, kind in expected.items():
        store = await Store.open(url)
        try:
            assert type(store._per_turn) is kind
        finally:
            await store.close()


async def test_rows_are_stored_the_same_whichever_path_wrote_them(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    await upgrade_database(url)
    store = await Store.open(url)
    try:
        await assert_stored_the_same_by_both_paths(store, sqlite_dialect=True)
    finally:
        await store.close()


async def test_a_status_read_does_not_wait_behind_a_blocked_write(tmp_path: Path) -> None:
    """A batch's write waiting on SQLite's file lock (another process writing) must not
    hold up the next turn's admission: reads have a thread and a connection of their own."""
    url = sqlite_url(tmp_path)
    await upgrade_database(url)
    store = await Store.open(url)
    try:
        session = await new_session(store)
        locker = sqlite3.connect(tmp_path / "lego.sqlite3", isolation_level=None)
        locker.execute("BEGIN IMMEDIATE")  # holds the write lock
        try:
            write = asyncio.create_task(
                store.write_rows([rows.encode_turn(make_turn(session.id, 0))])
            )
            await asyncio.sleep(0.3)
            assert not write.done()  # waiting on the lock (busy timeout)
            started = time.monotonic()
            assert await asyncio.wait_for(store.finished_termination(session.id), 5) is None
            assert time.monotonic() - started < 2.0  # not behind the write
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        assert await asyncio.wait_for(write, 15) == set()
        assert [t.seq for t in await store.list_turns(session.id)] == [0]
    finally:
        await store.close()


async def test_failures_are_the_stores_errors_and_a_batch_is_all_or_nothing(
    tmp_path: Path,
) -> None:
    url = sqlite_url(tmp_path)
    await upgrade_database(url)
    store = await Store.open(url)
    try:
        session = await new_session(store)
        await store.write_rows([rows.encode_turn(make_turn(session.id, 0))])
        # A turn of no session after a good one: the foreign key refuses it (sqlite3's
        # IntegrityError), and the good one goes with it.
        batch = [make_turn(session.id, 1), make_turn("no-such-session", 0)]
        with pytest.raises(Conflict, match="cannot write 2 turns"):
            await store.write_rows([rows.encode_turn(turn) for turn in batch])
        # Nothing of the refused transaction stays: the next write goes through.
        await store.write_rows([rows.encode_turn(make_turn(session.id, 2))])
        assert [t.seq for t in await store.list_turns(session.id)] == [0, 2]
    finally:
        await store.close()
    with pytest.raises(RecorderError, match="closed"):
        await store.finished_termination(session.id)
    with pytest.raises(RecorderError, match="closed"):
        await store.write_rows([rows.encode_turn(make_turn(session.id, 3))])


async def test_every_connection_to_a_sqlite_file_syncs_every_commit(tmp_path: Path) -> None:
    """The writer skips the journal for a turn the database took, which is only as safe
    as the database's commit: synchronous=FULL (2), in WAL mode, on the engine's
    connections and on the per-turn threads' own."""
    url = sqlite_url(tmp_path)
    await upgrade_database(url)
    store = await Store.open(url)
    try:
        async with store.engine.connect() as conn:
            engine_pragmas = (await conn.exec_driver_sql("PRAGMA synchronous")).scalar_one()
        per_turn = store._per_turn
        assert isinstance(per_turn, SqliteTurns)
        threads = [per_turn._reader, per_turn._writer]
        found = [
            await thread.call(
                lambda conn: (
                    conn.execute("PRAGMA synchronous").fetchone()[0],
                    conn.execute("PRAGMA journal_mode").fetchone()[0],
                    conn.execute("PRAGMA foreign_keys").fetchone()[0],
                ),
                "pragma",
            )
            for thread in threads
        ]
        assert engine_pragmas == 2
        assert found == [(2, "wal", 1), (2, "wal", 1)]
    finally:
        await store.close()


@asynccontextmanager
async def read_once(tmp_path: Path) -> AsyncIterator[tuple[Store, SessionInfo, SqliteTurns]]:
    """A store on a SQLite file, a session in it, and one status read done (which opens
    the loop's connection); the store is closed when the block ends."""
    url = sqlite_url(tmp_path)
    await upgrade_database(url)
    store = await Store.open(url)
    try:
        session = await new_session(store)
        assert await store.finished_termination(session.id) is None
        per_turn = store._per_turn
        assert isinstance(per_turn, SqliteTurns)
        yield store, session, per_turn
    finally:
        await store.close()


@asynccontextmanager
async def both_threads_held(per_turn: SqliteTurns) -> AsyncIterator[None]:
    """The reader and the writer thread busy (each running a call that waits) until the
    block ends."""
    release = asyncio.Event()
    loop = asyncio.get_running_loop()

    def hold(_: sqlite3.Connection) -> None:
        asyncio.run_coroutine_threadsafe(release.wait(), loop).result(timeout=30)

    held = [
        asyncio.create_task(thread.call(hold, "hold"))
        for thread in (per_turn._reader, per_turn._writer)
    ]
    await asyncio.sleep(0.1)
    try:
        yield
    finally:
        release.set()
        await asyncio.gather(*held)


async def test_a_status_read_runs_on_the_loop_and_waits_on_no_thread(tmp_path: Path) -> None:
    """After the first, a status read needs neither per-turn thread: it answers while both
    are busy (a handoff costs more CPU than the read), and sees a finish at once."""
    async with read_once(tmp_path) as (store, session, per_turn), both_threads_held(per_turn):
        assert await asyncio.wait_for(store.finished_termination(session.id), 2) is None
        await store.finish_session(session.id, "completed", 1.0, None)
        assert await asyncio.wait_for(store.finished_termination(session.id), 2) == ("completed")


class BusyOnce:
    """A connection SQLite answers "busy" once (a WAL being recovered by another
    connection), then itself."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.busy = 1

    def execute(self, sql: str, parameters: tuple[object, ...] = ()) -> sqlite3.Cursor:
        if self.busy:
            self.busy -= 1
            error = sqlite3.OperationalError("database is locked")
            error.sqlite_errorcode = 261  # SQLITE_BUSY_RECOVERY
            raise error
        return self.conn.execute(sql, parameters)

    def close(self) -> None:
        self.conn.close()


async def test_a_busy_status_read_is_answered_on_the_reader_thread(tmp_path: Path) -> None:
    """The loop's connection waits for no lock: a read SQLite answers "busy" goes to the
    reader thread, whose connection waits for it; any other failure is the store's error."""
    async with read_once(tmp_path) as (store, session, per_turn):
        inline = per_turn._inline
        assert inline is not None
        busy = BusyOnce(inline.conn)
        inline.conn = busy  # type: ignore[assignment]
        assert await store.finished_termination(session.id) is None
        assert busy.busy == 0  # it was asked, and the answer came from the reader
        assert await store.finished_termination(session.id) is None  # inline again
        inline.conn = busy.conn
        busy.conn.close()  # a connection that fails otherwise: the store's error
        with pytest.raises(RecorderError, match="read a session's status"):
            await per_turn.status(session.id, "read a session's status")


async def test_a_status_read_from_another_thread_goes_to_the_reader(tmp_path: Path) -> None:
    """The loop's connection serves the thread that first read; another thread's event
    loop (a caller in a worker thread) is answered on the reader thread."""
    async with read_once(tmp_path) as (_, session, per_turn):
        answer = await asyncio.to_thread(
            asyncio.run, per_turn.status(session.id, "read a session's status")
        )
        assert answer == ("active", None)


async def test_writes_run_on_the_loop_until_a_commit_is_slow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fast commit needs no thread; a commit slower than INLINE_WRITE_S sends the next
    writes to the writer thread (the loop must not wait on a slow disk), and
    FAST_WRITES_TO_RETURN fast ones in a row there bring them back."""
    url = sqlite_url(tmp_path)
    await upgrade_database(url)
    store = await Store.open(url)
    try:
        session = await new_session(store)
        per_turn = store._per_turn
        assert isinstance(per_turn, SqliteTurns)

        async def write_while_the_threads_are_held(seq: int) -> bool:
            """Whether the write was done before the per-turn threads were let go."""
            async with both_threads_held(per_turn):
                write = asyncio.create_task(
                    store.write_rows([rows.encode_turn(make_turn(session.id, seq))])
                )
                await asyncio.sleep(0.3)
                done_before = write.done()
            assert await asyncio.wait_for(write, 15) == set()
            return done_before

        assert await store.finished_termination(session.id) is None  # opens the connection
        # No commit counts as slow until the test says so: this disk's commits now and then
        # take over the default 2 ms, which would move the writes before the test does.
        monkeypatch.setattr("recorder.sqlite_turns.INLINE_WRITE_S", 60.0)
        assert await write_while_the_threads_are_held(0)  # on the loop
        monkeypatch.setattr("recorder.sqlite_turns.INLINE_WRITE_S", 0.0)
        assert await write_while_the_threads_are_held(1)  # on the loop, found slow
        assert not await write_while_the_threads_are_held(2)  # so on the thread
        monkeypatch.setattr("recorder.sqlite_turns.INLINE_WRITE_S", 60.0)
        monkeypatch.setattr("recorder.sqlite_turns.FAST_WRITES_TO_RETURN", 2)
        assert not await write_while_the_threads_are_held(3)  # on the thread, fast once
        assert not await write_while_the_threads_are_held(4)  # fast twice in a row
        assert await write_while_the_threads_are_held(5)  # so on the loop again
        assert [t.seq for t in await store.list_turns(session.id)] == [0, 1, 2, 3, 4, 5]
    finally:
        await store.close()


def wal_frames(tmp_path: Path) -> int:
    """The frames in the WAL now (a PASSIVE checkpoint reports them, and copies them)."""
    conn = sqlite3.connect(tmp_path / "lego.sqlite3")
    try:
        _, frames, _ = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        return int(frames)
    finally:
        conn.close()


async def test_the_wal_is_checkpointed_on_the_writer_thread_not_in_a_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite's automatic checkpoint (at 1,000 WAL pages) would run inside the commit on
    the loop that crosses them, and its copies and fsync would send the next writes to the
    thread: the per-turn connections leave the WAL to a checkpoint the writer thread runs
    once enough is written, which keeps the WAL short."""
    async with read_once(tmp_path) as (store, session, _):
        monkeypatch.setattr("recorder.sqlite_turns.CHECKPOINT_AFTER_BYTES", 1 << 40)
        for seq in range(500):  # 3-5 pages each: past SQLite's 1,000
            await store.write_rows([rows.encode_turn(make_turn(session.id, seq))])
        assert wal_frames(tmp_path) > 1000  # no commit checkpointed them
        monkeypatch.setattr("recorder.sqlite_turns.CHECKPOINT_AFTER_BYTES", 64 * 1024)
        for seq in range(500, 800):
            await store.write_rows([rows.encode_turn(make_turn(session.id, seq))])
        await asyncio.sleep(0.2)  # the last checkpoint done
        assert wal_frames(tmp_path) < 200  # checkpointed, and restarted from its start
        assert len(await store.list_turns(session.id)) == 800


async def test_a_write_waits_behind_a_running_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that comes while the checkpoint runs queues behind it on the writer thread
    rather than commit on the loop: so the checkpoint copies the whole WAL, and the next
    write restarts it."""
    monkeypatch.setattr("recorder.sqlite_turns.CHECKPOINT_AFTER_BYTES", 1)
    async with read_once(tmp_path) as (store, session, per_turn):
        async with both_threads_held(per_turn):
            # On the loop; it queues a checkpoint behind the held writer thread.
            await asyncio.wait_for(
                store.write_rows([rows.encode_turn(make_turn(session.id, 0))]), 2
            )
            second = asyncio.create_task(
                store.write_rows([rows.encode_turn(make_turn(session.id, 1))])
            )
            await asyncio.sleep(0.3)
            assert not second.done()  # behind the checkpoint
        assert await asyncio.wait_for(second, 15) == set()
        assert [t.seq for t in await store.list_turns(session.id)] == [0, 1]
