"""Journal: completed turns are on disk before the harness has them, and cleaned up after."""

from __future__ import annotations

import asyncio
from pathlib import Path

from recorder.journal import Journal
from recorder.rows import StoredTurn, encode_turn
from recorder.spool import Spool
from recorder.store import Store
from recorder.writer import TurnWriter
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
