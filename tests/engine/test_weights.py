"""Weight-version spans and the model-update lock (engine.weights), without a server."""

from __future__ import annotations

import asyncio

from engine.weights import ModelUpdateLock, weight_version_spans


def test_spans_of_a_request_that_saw_no_change() -> None:
    assert weight_version_spans((), "v1", 5) == [{"version": "v1", "start": 0, "end": 5}]
    assert weight_version_spans((), "v1", 0) == [{"version": "v1", "start": 0, "end": 0}]


def test_spans_across_two_changes() -> None:
    spans = weight_version_spans((("v1", 3), ("v2", 7)), "v3", 10)
    assert spans == [
        {"version": "v1", "start": 0, "end": 3},
        {"version": "v2", "start": 3, "end": 7},
        {"version": "v3", "start": 7, "end": 10},
    ]


def test_a_version_that_sampled_nothing_has_no_span() -> None:
    # Two changes at the same position, then back to the first version.
    spans = weight_version_spans((("v1", 3), ("v2", 3), ("v3", 6)), "v3", 8)
    assert spans == [
        {"version": "v1", "start": 0, "end": 3},
        {"version": "v3", "start": 3, "end": 8},
    ]


async def test_the_writer_waits_for_readers_and_blocks_new_ones() -> None:
    lock = ModelUpdateLock()
    order: list[str] = []
    reading = asyncio.Event()
    release = asyncio.Event()

    async def reader(name: str, hold: asyncio.Event | None) -> None:
        async with lock.reading():
            order.append(f"{name} in")
            reading.set()
            if hold is not None:
                await hold.wait()
        order.append(f"{name} out")

    async def writer() -> None:
        async with lock.writing():
            order.append("write")

    first = asyncio.create_task(reader("r1", release))
    await reading.wait()
    update = asyncio.create_task(writer())
    await asyncio.sleep(0.01)
    late = asyncio.create_task(reader("r2", None))
    await asyncio.sleep(0.01)
    assert order == ["r1 in"]  # the update waits for r1; r2 waits behind the update
    release.set()
    await asyncio.gather(first, update, late)
    assert order == ["r1 in", "r1 out", "write", "r2 in", "r2 out"]
