"""Spool: durable framing, torn tails, exclusive ownership, orphan adoption."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel.errors import RecorderError
from recorder.rows import StoredTurn, decode_stored, encode_turn
from recorder.spool import Spool
from tests.recorder.builders import experts, rich_turn


def rows(n: int) -> list[StoredTurn]:
    routed = experts(3, [[[1, 300], [2, 7]]])
    return [encode_turn(rich_turn("s", seq, routed if seq % 2 else None)) for seq in range(n)]


def test_rows_round_trip_bit_exact_across_reopen(tmp_path: Path) -> None:
    written = rows(5)
    spool = Spool.open(tmp_path / "p1")
    spool.append(written[:2])
    spool.append(written[2:])
    assert (spool.records, spool.size_bytes > 0) == (5, True)
    spool.close()

    reopened = Spool.open(tmp_path / "p1")
    assert reopened.records == 5
    got = [turn for seg in reopened.closed_segments() for turn in reopened.read(seg)]
    assert [dict(t.row) for t in got] == [dict(t.row) for t in written]
    assert [decode_stored(t).logprobs for t in got] == [decode_stored(t).logprobs for t in written]
    for segment in reopened.closed_segments():
        reopened.remove(segment)
    assert (reopened.records, list((tmp_path / "p1").glob("*.spool"))) == (0, [])
    reopened.close()


def test_a_torn_tail_keeps_every_intact_record(tmp_path: Path) -> None:
    spool = Spool.open(tmp_path / "p")
    spool.append(rows(3))
    spool.close()
    (segment,) = (tmp_path / "p").glob("*.spool")
    data = segment.read_bytes()
    segment.write_bytes(data[:-7])  # a crash in the middle of the last append

    spool = Spool.open(tmp_path / "p")
    assert len(spool.read(segment)) == 2
    assert spool.corrupt_frames >= 1
    spool.remove(segment)
    assert segment.with_suffix(".corrupt").exists()  # kept for inspection
    spool.close()


def test_a_flipped_bit_is_caught_by_the_checksum(tmp_path: Path) -> None:
    spool = Spool.open(tmp_path / "p")
    spool.append(rows(2))
    spool.close()
    (segment,) = (tmp_path / "p").glob("*.spool")
    data = bytearray(segment.read_bytes())
    data[-3] ^= 0x01
    segment.write_bytes(bytes(data))
    spool = Spool.open(tmp_path / "p")
    assert len(spool.read(segment)) == 1
    spool.close()


def test_a_live_spool_is_exclusive_and_a_dead_one_is_adopted(tmp_path: Path) -> None:
    live = Spool.open(tmp_path / "root" / "live")
    with pytest.raises(RecorderError):
        Spool.open(tmp_path / "root" / "live")
    dead = Spool.open(tmp_path / "root" / "dead")
    dead.append(rows(1))
    dead.close()  # its proxy is gone: the lock is released

    mine = Spool.open(tmp_path / "root" / "mine")
    adopted = list(Spool.orphans(tmp_path / "root", mine.directory))
    assert [s.directory.name for s in adopted] == ["dead"]
    assert adopted[0].records == 1
    for spool in (*adopted, mine, live):
        spool.close()
