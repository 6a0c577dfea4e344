"""Journal: completed turns are on disk before the harness has them, and cleaned up after."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from recorder.journal import Journal
from recorder.migrate import upgrade_database
from recorder.rows import StoredTurn, encode_turn
from recorder.spool import Spool
from recorder.store import Store
from recorder.writer import Durability, TurnWriter
from tests.recorder.builders import make_turn, rich_turn
from tests.recorder.test_store import new_session


def rows(n: int) -> list[StoredTurn]:
    return [encode_turn(rich_turn("s", seq, None)) for seq in range(n)]


async def test_concurrent_appends_share_fsyncs_and_are_readable_after_a_crash(
    tmp_path: Path,
) -> None:
    journal = Journal(Spool.open(tmp_path / "j" / "p1"))
    written = rows(20)
    await asyncio.gather(*(journal.append(row) for row in written))
    assert journal.appended == 20
    # Every append was waiting when the first flush began: one write + fsync for all.
    assert journal.flushes == 1
    for row in rows(3):
        await journal.append(row)  # one at a time: nothing to share
    assert journal.flushes == 4
    # The process dies here: nothing released, the directory's lock goes with it.
    journal._spool.close()
    (orphan,) = Spool.orphans(tmp_path / "j", tmp_path / "j" / "other")
    found = [t.id for segment in orphan.closed_segments() for t in orphan.read(segment)]
    assert set(row.id for row in written) <= set(found)
    orphan.close()


async def test_released_segments_are_deleted_and_unreleased_ones_kept(tmp_path: Path) -> None:
    journal = Journal(Spool.open(tmp_path / "j" / "p1"), rotate_records=4)
    written = rows(10)
    for row in written:
        await journal.append(row)
    await journal.release(row.id for row in written[:8])  # rotates the first full segment
    assert journal.unreleased == 2
    await journal.release([written[8].id])
    await journal.close()  # one turn was never settled: its segment stays for the next start
    (orphan,) = Spool.orphans(tmp_path / "j", tmp_path / "j" / "other")
    left = [t.id for segment in orphan.closed_segments() for t in orphan.read(segment)]
    assert written[9].id in left
    assert not {row.id for row in written[:4]} & set(left)
    orphan.close()


async def test_a_clean_writer_shutdown_leaves_no_journal(tmp_path: Path, store: Store) -> None:
    session = await new_session(store)
    journal = Journal(Spool.open(tmp_path / "j" / "p1"))
    writer = TurnWriter(store, spool=Spool.open(tmp_path / "spool" / "p1"), journal=journal)
    writer.start()
    turns = [make_turn(session.id, seq) for seq in range(5)]
    for turn in turns:
        await writer.submit_durable(turn)
    await writer.close()
    assert [t.id for t in await store.list_turns(session.id)] == [t.id for t in turns]
    assert not (tmp_path / "j" / "p1").exists()


async def test_a_turn_released_while_its_append_is_in_flight_is_not_kept(tmp_path: Path) -> None:
    """The writer journals a turn only once the database is slow to take it, so the batch
    can settle (and release it) before the journal's write lands: the journal must not
    then hold it forever."""
    journal = Journal(Spool.open(tmp_path / "j" / "p1"))
    (row,) = rows(1)
    append = asyncio.create_task(journal.append(row))
    await asyncio.sleep(0)  # the append is queued or being written, not landed
    await journal.release([row.id])
    assert await append
    assert journal.unreleased == 0
    await journal.close()
    assert not (tmp_path / "j" / "p1").exists()  # nothing left to replay


async def test_a_turn_the_database_takes_in_time_is_not_journaled(
    tmp_path: Path, store: Store
) -> None:
    session = await new_session(store)
    journal = Journal(Spool.open(tmp_path / "j" / "p1"))
    writer = TurnWriter(store, journal=journal, journal_after_s=5.0)
    try:
        for seq in range(3):
            assert await writer.submit_durable(make_turn(session.id, seq)) is Durability.RECORDED
        assert journal.flushes == 0  # no fsync of the proxy's own: the database has them
    finally:
        await writer.close()
    assert [t.seq for t in await store.list_turns(session.id)] == [0, 1, 2]


async def test_a_turn_the_database_is_slow_to_take_is_journaled(tmp_path: Path) -> None:
    database = tmp_path / "lego.sqlite3"
    url = f"sqlite+aiosqlite:///{database}"
    await upgrade_database(url)
    store = await Store.open(url)
    journal = Journal(Spool.open(tmp_path / "j" / "p1"))
    writer = TurnWriter(store, journal=journal, journal_after_s=0.4, durable_wait_s=0.5)
    try:
        session = await new_session(store)
        locker = sqlite3.connect(database, isolation_level=None)
        locker.execute("BEGIN EXCLUSIVE")  # the batch waits on SQLite's lock
        try:
            turn = make_turn(session.id, 0)
            loop = asyncio.get_running_loop()
            began = loop.time()
            assert await writer.submit_durable(turn) is Durability.ON_DISK
            # The grace is part of the durable wait, not added to it (0.9 s if it were).
            assert loop.time() - began < 0.8
            assert journal.appended == 1
            assert journal.unreleased == 1  # on disk until the database has it
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        await asyncio.wait_for(writer.flush(), timeout=15)
        assert [t.id for t in await store.list_turns(session.id)] == [turn.id]
        assert journal.unreleased == 0
    finally:
        await writer.close()
        await store.close()
