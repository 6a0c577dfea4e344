"""One bad turn never blocks the others (issue 16, items 1, 4 and 6), on both databases.

A row the database refuses for good is quarantined and replaced by one it takes; a spool
holding such a row replays; a full spool disk drains to the database; a turn that reaches
the database after its session's finish is stored failed; a journal of another database
is never replayed into this one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
from collections.abc import Sequence
from pathlib import Path

import pytest

from kernel.errors import RecorderUnavailable
from recorder.disks import RecorderDisks
from recorder.journal import Journal
from recorder.per_turn import LATE_ERROR
from recorder.records import TurnStatus
from recorder.rows import STORABLE_NOTE, StoredTurn, encode_turn
from recorder.spool import Spool
from recorder.store import Store
from recorder.writer import Durability, TurnWriter
from tests.recorder.builders import make_turn
from tests.recorder.test_writer import eventually, new_session, rename_table


def poisoned(session_id: str, seq: int) -> StoredTurn:
    """A turn with NUL in its text and JSON columns (Postgres refuses U+0000 in both)."""
    turn = dataclasses.replace(
        make_turn(session_id, seq, prompt=(1, 2, 3), output=(9, 8)),
        requested_model="m\x00",
        ignored_fields=("x\x00y",),
        sampling_params={"stop": ["\x00"]},
    )
    return encode_turn(turn)


class FullDisk(Spool):
    """A spool whose disk is full while ``full`` is set (the external edge, faked)."""

    full = False

    def append(self, rows: Sequence[StoredTurn]) -> None:
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        super().append(rows)


async def test_a_refused_row_is_quarantined_and_the_rest_written(
    store: Store, tmp_path: Path
) -> None:
    session = await new_session(store)
    quarantine = Spool.open(tmp_path / "quarantine")
    writer = TurnWriter(store, spool=Spool.open(tmp_path / "spool"), quarantine=quarantine)
    writer.start()
    bad = poisoned(session.id, 1)
    writer.submit(make_turn(session.id, 0))
    writer._enqueue(bad)
    writer.submit(make_turn(session.id, 2))
    await asyncio.wait_for(writer.flush(), timeout=10)
    turns = await store.list_turns(session.id)
    assert [t.seq for t in turns] == [0, 1, 2]  # the good turns are not held back
    stored = turns[1]
    assert stored.output_ids == (9, 8)  # the token arrays are exact
    if writer.quarantined:  # Postgres refused it; SQLite holds NUL as it is
        assert stored.requested_model == "m\ufffd"
        assert stored.error == STORABLE_NOTE
        assert quarantine.records == 1  # the original row, kept for inspection
    else:
        assert stored.requested_model == "m\x00"
    assert writer.dropped == 0
    await writer.close()


async def test_a_spool_holding_a_refused_row_replays_the_others(
    store: Store, tmp_path: Path
) -> None:
    session = await new_session(store)
    spool = Spool.open(tmp_path / "spool")
    rows = [encode_turn(make_turn(session.id, 0)), poisoned(session.id, 1)]
    rows.append(encode_turn(make_turn(session.id, 2)))
    spool.append(rows)
    spool.close()
    writer = TurnWriter(store, spool=Spool.open(tmp_path / "spool"))
    writer.start()
    await asyncio.wait_for(writer.flush(), timeout=10)  # before the fix: never returned
    assert [t.seq for t in await store.list_turns(session.id)] == [0, 1, 2]
    assert writer.spooled_pending == 0
    await writer.close()


async def test_a_full_spool_disk_drains_to_the_database(
    store: Store, database_url: str, tmp_path: Path
) -> None:
    session = await new_session(store)
    spool = FullDisk.open(tmp_path / "spool")
    assert isinstance(spool, FullDisk)
    writer = TurnWriter(
        store, spool=spool, flush_interval_s=0.01, retry_initial_s=0.05, retry_max_s=0.1
    )
    writer.start()
    await rename_table(database_url, "turns", "turns_away")
    try:
        writer.submit(make_turn(session.id, 0))
        await eventually(lambda: writer.spooled == 1)  # the database is away: spooled
        spool.full = True
        writer.submit(make_turn(session.id, 1))
        await eventually(lambda: not writer.disk_ok)
        assert writer.pending == 1  # neither took it: kept in memory, not lost
    finally:
        await rename_table(database_url, "turns_away", "turns")
    # The database is back while the disk is still full: the queue drains into it.
    await eventually(lambda: writer.pending == 0)
    spool.full = False
    await asyncio.wait_for(writer.flush(), timeout=10)
    assert [t.seq for t in await store.list_turns(session.id)] == [0, 1]
    await writer.close()


async def test_a_turn_nothing_can_make_durable_fails_loudly(
    store: Store, database_url: str, tmp_path: Path
) -> None:
    session = await new_session(store)
    journal_spool = FullDisk.open(tmp_path / "journal")
    spool = FullDisk.open(tmp_path / "spool")
    assert isinstance(journal_spool, FullDisk)
    assert isinstance(spool, FullDisk)
    journal_spool.full = spool.full = True
    writer = TurnWriter(
        store,
        spool=spool,
        journal=Journal(journal_spool),
        durable_wait_s=0.5,
        write_timeout_s=0.2,
        retry_initial_s=0.05,
        retry_max_s=0.1,
    )
    await rename_table(database_url, "turns", "turns_away")
    try:
        with pytest.raises(RecorderUnavailable):
            await writer.submit_durable(make_turn(session.id, 0))
        assert (writer.undurable, writer.disk_ok) == (1, False)
    finally:
        await rename_table(database_url, "turns_away", "turns")
    await asyncio.wait_for(writer.flush(), timeout=10)  # kept, and written once it can be
    assert len(await store.list_turns(session.id)) == 1
    journal_spool.full = spool.full = False
    await writer.close()


async def test_a_durable_turn_is_in_the_database_before_it_returns(
    store: Store, tmp_path: Path
) -> None:
    session = await new_session(store)
    writer = TurnWriter(store, journal=Journal(Spool.open(tmp_path / "journal")))
    turn = make_turn(session.id, 0)
    assert await writer.submit_durable(turn) is Durability.RECORDED
    assert [t.id for t in await store.list_turns(session.id)] == [turn.id]  # no flush
    await writer.close()


async def test_a_turn_written_after_its_session_finished_is_stored_failed(
    store: Store,
) -> None:
    session = await new_session(store)
    early = make_turn(session.id, 0)
    await store.write_turns([early])
    await store.finish_session(session.id, "completed", 1.0, None)
    writer = TurnWriter(store)
    late = make_turn(session.id, 1)
    assert await writer.submit_durable(late) is Durability.LATE
    await store.write_turns([early])  # a replayed duplicate of an earlier turn is no late one
    turns = {t.id: t for t in await store.list_turns(session.id)}
    assert turns[early.id].status is TurnStatus.COMPLETED
    assert (turns[late.id].status, turns[late.id].error) == (TurnStatus.FAILED, LATE_ERROR)
    assert writer.late == 1
    await writer.close()


async def test_a_journal_of_another_database_is_never_replayed(
    store: Store, tmp_path: Path
) -> None:
    session = await new_session(store)
    identity = await store.identity()
    # A killed proxy of another database left a journal in the same data directory.
    other = RecorderDisks(tmp_path, "another-database").journal(9)
    other.append([encode_turn(make_turn(session.id, 7))])
    other.close()
    # ...and one of this database, which must be replayed and then removed.
    mine = RecorderDisks(tmp_path, identity).journal(9)
    mine_dir = mine.directory
    mine.append([encode_turn(make_turn(session.id, 1))])
    mine.close()
    disks = RecorderDisks(tmp_path, identity)
    writer = TurnWriter(
        store, spool=disks.spool(8), journal=Journal(disks.journal(8)), orphans=disks.orphans()
    )
    writer.start()
    await asyncio.wait_for(writer.flush(), timeout=10)
    assert [t.seq for t in await store.list_turns(session.id)] == [1]
    assert not mine_dir.exists()  # a dead proxy's replayed journal leaves nothing behind
    assert other.directory.exists()
    await writer.close()
