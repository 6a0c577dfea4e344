"""TurnWriter: batching, flush/close, poison turns, retries across real database outages."""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from kernel.errors import RecorderError
from recorder.database import create_engine
from recorder.journal import Journal
from recorder.migrate import upgrade_database
from recorder.records import SessionInfo, SessionSpec
from recorder.rows import StoredTurn
from recorder.scratch_postgres import PostgresServer
from recorder.spool import Spool
from recorder.store import Store
from recorder.writer import Durability, TurnWriter
from tests.recorder.builders import make_turn


async def new_session(store: Store) -> SessionInfo:
    run = await store.create_run(f"run-{uuid.uuid4().hex[:8]}")
    spec = SessionSpec(run_id=run.id, task_id="t", group_id="g", sample_index=0, harness="h")
    return await store.create_session(spec)


async def eventually(condition: Callable[[], bool]) -> None:
    """Poll a writer counter (it offers no event to wait on) for up to 10 s."""
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached within 10 s")


async def rename_table(url: str, old: str, new: str) -> None:
    engine = create_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.exec_driver_sql(f"ALTER TABLE {old} RENAME TO {new}")
    finally:
        await engine.dispose()


async def test_flush_writes_everything_in_batches(store: Store) -> None:
    session = await new_session(store)
    writer = TurnWriter(store, max_batch=3, flush_interval_s=30.0)
    submitted = [make_turn(session.id, seq) for seq in range(7)]
    for turn in submitted:
        writer.submit(turn)
    assert writer.pending == 7

    writer.start()
    # A flush must not wait out the batching interval.
    await asyncio.wait_for(writer.flush(), timeout=10)

    assert (writer.pending, writer.written, writer.batches) == (0, 7, 3)
    assert [t.id for t in await store.list_turns(session.id)] == [t.id for t in submitted]
    await writer.close()


async def test_turns_arriving_within_the_interval_share_a_batch(store: Store) -> None:
    session = await new_session(store)
    writer = TurnWriter(store, max_batch=100, flush_interval_s=0.3)
    writer.start()

    writer.submit(make_turn(session.id, 0))
    await asyncio.sleep(0.05)
    writer.submit(make_turn(session.id, 1))
    writer.submit(make_turn(session.id, 2))
    await eventually(lambda: writer.written == 3)

    assert writer.batches == 1
    await writer.close()


async def test_close_flushes_and_stops(store: Store) -> None:
    session = await new_session(store)
    writer = TurnWriter(store)
    for seq in range(5):
        writer.submit(make_turn(session.id, seq))

    await writer.close()  # never started: close still persists what was submitted

    assert writer.pending == 0
    assert len(await store.list_turns(session.id)) == 5
    await writer.close()  # a second close is harmless


async def test_unstorable_turn_is_dropped_and_the_rest_written(store: Store) -> None:
    session = await new_session(store)
    original = make_turn(session.id, 0)
    await store.write_turns([original])
    writer = TurnWriter(store)
    writer.submit(make_turn(session.id, 1))
    writer.submit(make_turn(session.id, 3, prompt=(2**31,)))  # a token id past int32
    writer.submit(make_turn(session.id, 2))

    await asyncio.wait_for(writer.close(), timeout=10)

    assert (writer.written, writer.dropped) == (2, 1)
    got = await store.list_turns(session.id)
    assert [t.seq for t in got] == [0, 1, 2]
    assert got[0].id == original.id


class SeenRows:
    """Spies on where encoded rows go: the journal, the database, the spool."""

    def __init__(self) -> None:
        self.journaled: list[StoredTurn] = []
        self.written: list[StoredTurn] = []
        self.spooled: list[StoredTurn] = []

    def journal(self, directory: Path) -> Journal:
        seen = self

        class SpyJournal(Journal):
            async def append(self, row: StoredTurn) -> bool:
                seen.journaled.append(row)
                return await super().append(row)

        return SpyJournal(Spool.open(directory))

    async def store(self, url: str) -> Store:
        seen = self

        class SpyStore(Store):
            async def write_rows(self, stored: Sequence[StoredTurn]) -> set[str]:
                seen.written.extend(stored)
                return await super().write_rows(stored)

        return await SpyStore.open(url)

    def spool(self, directory: Path) -> Spool:
        seen = self

        class SpySpool(Spool):
            def append(self, rows: Sequence[StoredTurn]) -> None:
                seen.spooled.extend(rows)
                super().append(rows)

        return SpySpool.open(directory)


async def test_a_durable_turn_is_encoded_once_for_the_journal_and_the_database(
    database_url: str, tmp_path: Path
) -> None:
    seen = SeenRows()
    store = await seen.store(database_url)
    # journal_after_s=0: every turn is journaled, as one the database is slow to take is.
    writer = TurnWriter(store, journal=seen.journal(tmp_path / "journal" / "p"), journal_after_s=0)
    try:
        session = await new_session(store)
        turns = [make_turn(session.id, seq) for seq in range(3)]
        for turn in turns:
            await writer.submit_durable(turn)
        await asyncio.wait_for(writer.flush(), timeout=10)
    finally:
        await writer.close()
        await store.close()
    assert [row.id for row in seen.journaled] == [turn.id for turn in turns]
    # The very rows the journal took reached the database: nothing encoded them again.
    assert [id(row) for row in seen.written] == [id(row) for row in seen.journaled]


async def test_a_spilled_durable_turn_is_the_row_the_journal_took(
    database_url: str, tmp_path: Path
) -> None:
    seen = SeenRows()
    store = await seen.store(database_url)
    writer = TurnWriter(
        store,
        journal=seen.journal(tmp_path / "journal" / "p"),
        journal_after_s=0,
        spool=seen.spool(tmp_path / "spool" / "p"),
        max_pending=0,  # every batch bypasses the database
    )
    writer.start()
    try:
        session = await new_session(store)
        turns = [make_turn(session.id, seq) for seq in range(3)]
        for turn in turns:
            await writer.submit_durable(turn)
        await eventually(lambda: writer.spooled == 3)
    finally:
        await writer.close()
        await store.close()
    assert [id(row) for row in seen.spooled] == [id(row) for row in seen.journaled]


async def test_retries_while_the_table_is_unavailable(store: Store, database_url: str) -> None:
    session = await new_session(store)
    writer = TurnWriter(store, flush_interval_s=0.01, retry_initial_s=0.02, retry_max_s=0.1)
    writer.start()
    await rename_table(database_url, "turns", "turns_away")
    try:
        for seq in range(3):
            writer.submit(make_turn(session.id, seq))
        await eventually(lambda: writer.failures >= 2)
        assert (writer.pending, writer.written) == (3, 0)
    finally:
        await rename_table(database_url, "turns_away", "turns")

    await asyncio.wait_for(writer.close(), timeout=10)

    assert (writer.written, writer.dropped, writer.pending) == (3, 0, 0)
    assert [t.seq for t in await store.list_turns(session.id)] == [0, 1, 2]


@pytest.mark.postgres
async def test_survives_a_postgres_restart(stoppable_postgres: PostgresServer) -> None:
    url = await stoppable_postgres.create_database()
    await upgrade_database(url)
    store = await Store.open(url)
    writer = TurnWriter(store, flush_interval_s=0.01, retry_initial_s=0.05, retry_max_s=0.2)
    try:
        session = await new_session(store)
        writer.submit(make_turn(session.id, 0))
        await writer.flush()  # the pool now holds a connection the restart will break

        await asyncio.to_thread(stoppable_postgres.stop)
        try:
            for seq in range(1, 4):
                writer.submit(make_turn(session.id, seq))
            await eventually(lambda: writer.failures >= 2)
            assert writer.pending == 3
        finally:
            await asyncio.to_thread(stoppable_postgres.start)

        await asyncio.wait_for(writer.flush(), timeout=30)

        assert writer.written == 4
        assert [t.seq for t in await store.list_turns(session.id)] == [0, 1, 2, 3]
    finally:
        await writer.close()
        await store.close()
        await stoppable_postgres.drop_database(url)


# -- with a spool: nothing waits on the database, nothing is lost ----------------------


async def test_an_unavailable_database_spools_and_a_new_writer_replays_it(
    store: Store, database_url: str, tmp_path: Path
) -> None:
    session = await new_session(store)
    spool = Spool.open(tmp_path / "spool" / "p")
    writer = TurnWriter(store, spool=spool, flush_interval_s=0.01, retry_initial_s=0.05)
    writer.start()
    await rename_table(database_url, "turns", "turns_away")
    try:
        submitted = [make_turn(session.id, seq) for seq in range(6)]
        for turn in submitted:
            writer.submit(turn)
        await eventually(lambda: writer.spooled == 6)
        assert writer.pending == 0  # memory is free: the turns are on disk
        await writer.close()  # the database is still away: close returns anyway
    finally:
        await rename_table(database_url, "turns_away", "turns")
    assert await store.list_turns(session.id) == []

    # The next start of this proxy finds the spool and replays it, exactly once.
    again = TurnWriter(store, spool=Spool.open(tmp_path / "spool" / "p"))
    again.start()
    await asyncio.wait_for(again.flush(), timeout=10)
    assert [t.id for t in await store.list_turns(session.id)] == [t.id for t in submitted]
    assert (again.replayed, again.spooled_pending) == (6, 0)
    await again.close()
    assert list((tmp_path / "spool" / "p").glob("*.spool")) == []


@pytest.mark.postgres
async def test_a_slow_database_spools_within_the_write_timeout(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    url = await postgres_server.create_database()
    await upgrade_database(url)
    store = await Store.open(url)
    blocker = create_engine(url)
    writer = TurnWriter(
        store,
        spool=Spool.open(tmp_path / "spool"),
        flush_interval_s=0.01,
        write_timeout_s=0.3,
        retry_initial_s=0.05,
        retry_max_s=0.1,
    )
    writer.start()
    try:
        session = await new_session(store)
        async with blocker.connect() as conn:
            await conn.exec_driver_sql("BEGIN")
            await conn.exec_driver_sql("LOCK TABLE turns IN ACCESS EXCLUSIVE MODE")
            loop = asyncio.get_running_loop()
            began = loop.time()
            for seq in range(3):
                writer.submit(make_turn(session.id, seq))
            await eventually(lambda: writer.spooled == 3)
            assert loop.time() - began < 1.5  # nobody waited on the locked table
            await conn.exec_driver_sql("ROLLBACK")
        await asyncio.wait_for(writer.flush(), timeout=10)
        assert [t.seq for t in await store.list_turns(session.id)] == [0, 1, 2]
    finally:
        await writer.close()
        await blocker.dispose()
        await store.close()
        await postgres_server.drop_database(url)


@pytest.mark.postgres
async def test_postgres_down_turns_spool_and_replay_exactly_once(
    stoppable_postgres: PostgresServer, tmp_path: Path
) -> None:
    url = await stoppable_postgres.create_database()
    await upgrade_database(url)
    store = await Store.open(url)
    writer = TurnWriter(
        store,
        spool=Spool.open(tmp_path / "spool"),
        flush_interval_s=0.01,
        retry_initial_s=0.05,
        retry_max_s=0.2,
    )
    try:
        session = await new_session(store)
        writer.submit(make_turn(session.id, 0))
        await writer.flush()
        await asyncio.to_thread(stoppable_postgres.stop)
        try:
            for seq in range(1, 40):
                writer.submit(make_turn(session.id, seq))
            await eventually(lambda: writer.spooled >= 39)
            assert writer.pending == 0
        finally:
            await asyncio.to_thread(stoppable_postgres.start)
        await asyncio.wait_for(writer.flush(), timeout=30)
        assert [t.seq for t in await store.list_turns(session.id)] == list(range(40))
    finally:
        await writer.close()
        await store.close()
        await stoppable_postgres.drop_database(url)


# -- a lone turn written at once (record_now) -------------------------------------------


async def test_a_lone_turn_is_written_at_once_with_no_task(store: Store, database_url: str) -> None:
    """On a SQLite file a lone turn is committed by the caller itself, before it returns
    and with no writer task; a store whose writes are awaited (Postgres) leaves it to the
    queue. Either way the turn ends durable in the database."""
    session = await new_session(store)
    assert await store.finished_termination(session.id) is None  # opens the loop's connection
    writer = TurnWriter(store)
    turn = make_turn(session.id, 0)
    outcome = writer.record_now(turn)
    if database_url.startswith("sqlite"):
        assert outcome is Durability.RECORDED
        assert writer._task is None  # no task ran
        assert (writer.submitted, writer.written, writer.pending) == (1, 1, 0)
        # Committed before record_now returned: another connection sees it.
        with sqlite3.connect(database_url.removeprefix("sqlite+aiosqlite:///")) as other:
            assert other.execute("SELECT id FROM turns").fetchall() == [(turn.id,)]
    else:
        assert outcome is None
        assert await writer.submit_durable(turn) is Durability.RECORDED
    await asyncio.wait_for(writer.close(), timeout=10)
    assert [t.id for t in await store.list_turns(session.id)] == [turn.id]


async def sqlite_store(tmp_path: Path) -> tuple[Store, SessionInfo]:
    """A store on a SQLite file, a session, and its loop connection open."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'lego.sqlite3'}"
    await upgrade_database(url)
    store = await Store.open(url)
    session = await new_session(store)
    assert await store.finished_termination(session.id) is None
    return store, session


async def test_a_turn_is_not_written_ahead_of_the_queue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Turns already queued are written first: a turn that would overtake them is left to
    the queue (None), and the queue writes all of them in order."""
    # However long the queue's first commit takes on a busy machine, later writes stay on
    # the loop (a commit over INLINE_WRITE_S would move them to the writer thread).
    monkeypatch.setattr("recorder.sqlite_turns.INLINE_WRITE_S", 60.0)
    store, session = await sqlite_store(tmp_path)
    try:
        writer = TurnWriter(store, flush_interval_s=30.0)
        writer.submit(make_turn(session.id, 0))
        assert writer.record_now(make_turn(session.id, 1)) is None
        assert writer.written == 0
        await asyncio.wait_for(writer.flush(), timeout=10)
        assert writer.record_now(make_turn(session.id, 2)) is Durability.RECORDED
        await asyncio.wait_for(writer.close(), timeout=10)
        assert [t.seq for t in await store.list_turns(session.id)] == [0, 2]
    finally:
        await store.close()


async def test_a_locked_database_leaves_the_turn_to_the_queue(tmp_path: Path) -> None:
    """Another process holding SQLite's write lock: nothing is written at once (the loop
    waits for no lock), and the queue writes the turn once the lock is let go."""
    store, session = await sqlite_store(tmp_path)
    try:
        writer = TurnWriter(store)
        locker = sqlite3.connect(tmp_path / "lego.sqlite3", isolation_level=None)
        locker.execute("BEGIN IMMEDIATE")
        turn = make_turn(session.id, 0)
        try:
            assert writer.record_now(turn) is None
            durable = asyncio.create_task(writer.submit_durable(turn))
            await asyncio.sleep(0.1)
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        assert await asyncio.wait_for(durable, 10) is Durability.RECORDED
        await asyncio.wait_for(writer.close(), timeout=10)
        assert [t.id for t in await store.list_turns(session.id)] == [turn.id]
    finally:
        await store.close()


async def test_a_turn_written_at_once_is_late_or_unstorable_as_a_queued_one(
    tmp_path: Path,
) -> None:
    """A completed turn of a session finished meanwhile is stored failed and reported
    LATE; a turn no column can hold is not written at once, and the queue drops it."""
    store, session = await sqlite_store(tmp_path)
    try:
        writer = TurnWriter(store)
        assert writer.record_now(make_turn(session.id, 0, prompt=(2**31,))) is None
        assert writer.written == 0
        await store.finish_session(session.id, "completed", 1.0, None)
        late = make_turn(session.id, 1)
        assert writer.record_now(late) is Durability.LATE
        assert writer.late == 1
        (stored,) = await store.list_turns(session.id)
        assert (stored.id, stored.status.value) == (late.id, "failed")
        await asyncio.wait_for(writer.close(), timeout=10)
    finally:
        await store.close()


# -- a lone turn written by its own task (submit_durable(alone=True)) --------------------


async def test_a_lone_turn_is_written_by_its_own_task(store: Store) -> None:
    """With nothing else in flight the caller's task writes the turn (the writer's task
    never starts), and it is durable in the database when the call returns."""
    session = await new_session(store)
    writer = TurnWriter(store)
    turn = make_turn(session.id, 0)
    assert await writer.submit_durable(turn, alone=True) is Durability.RECORDED
    assert writer._task is None  # no hand-off to the writer's task
    assert (writer.submitted, writer.written, writer.pending) == (1, 1, 0)
    assert [t.id for t in await store.list_turns(session.id)] == [turn.id]  # no flush
    await store.finish_session(session.id, "completed", 1.0, None)
    late = make_turn(session.id, 1)
    assert await writer.submit_durable(late, alone=True) is Durability.LATE
    assert writer.late == 1
    await asyncio.wait_for(writer.close(), timeout=10)


async def test_a_lone_turn_behind_queued_ones_goes_through_the_queue(store: Store) -> None:
    """Turns already queued are written first: the lone turn joins the queue, which
    writes them all (and the writer's task runs)."""
    session = await new_session(store)
    writer = TurnWriter(store, flush_interval_s=0.2)
    writer.submit(make_turn(session.id, 0))
    turn = make_turn(session.id, 1)
    assert await writer.submit_durable(turn, alone=True) is Durability.RECORDED
    assert writer._task is not None
    assert writer.batches == 1  # one batch held both
    assert sorted(t.seq for t in await store.list_turns(session.id)) == [0, 1]
    await asyncio.wait_for(writer.close(), timeout=10)


async def test_a_lone_turn_the_database_refuses_is_handled_by_the_queue(store: Store) -> None:
    """Refused (no such session: a foreign key), the turn is the queue's, which isolates
    and drops it as it would any refused turn; its caller is told at once, and why."""
    writer = TurnWriter(store, durable_wait_s=30.0)
    with pytest.raises(RecorderError, match="refused the turn, which is dropped"):
        await asyncio.wait_for(
            writer.submit_durable(make_turn("no-such-session", 0), alone=True), 10
        )
    assert (writer.submitted, writer.written, writer.dropped) == (1, 0, 1)
    assert writer.undurable == 0  # not "kept in memory": it is gone, and said so
    await asyncio.wait_for(writer.close(), timeout=10)


async def test_a_flush_waits_for_a_lone_turn_being_written(
    postgres_server: PostgresServer,
) -> None:
    """A flush that starts while a lone turn's write waits (here on its session's row,
    which a finish in progress holds) returns only once that turn is in the database."""
    url = await postgres_server.create_database()
    await upgrade_database(url)
    store = await Store.open(url)
    finisher = create_engine(url)
    try:
        session = await new_session(store)
        writer = TurnWriter(store, journal_after_s=5.0, durable_wait_s=10.0)
        turn = make_turn(session.id, 0)
        async with finisher.connect() as conn:
            transaction = await conn.begin()
            await conn.exec_driver_sql(
                f"UPDATE sessions SET task_id = 'held' WHERE id = '{session.id}'"
            )
            durable = asyncio.create_task(writer.submit_durable(turn, alone=True))
            await asyncio.sleep(0.3)
            flushed = asyncio.create_task(writer.flush())
            await asyncio.sleep(0.3)
            assert not durable.done()
            assert not flushed.done()  # the lone turn is not in yet
            await transaction.rollback()
        assert await asyncio.wait_for(durable, 10) is Durability.RECORDED
        await asyncio.wait_for(flushed, 10)
        assert writer._task is not None  # flush started it; it wrote nothing
        assert (writer.batches, writer.written) == (1, 1)
        assert [t.id for t in await store.list_turns(session.id)] == [turn.id]
        await asyncio.wait_for(writer.close(), timeout=10)
    finally:
        await finisher.dispose()
        await store.close()
        await postgres_server.drop_database(url)
