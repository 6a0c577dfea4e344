"""How a turn watches its connection (``proxy.routes.inference``). An unstreamed turn
watches it only once it has run ``WATCH_AFTER_S``: a short turn never reads the
connection; a hang-up during a longer one abandons the turn (it ends with what it sampled),
or cancels it where it waits when it cannot be abandoned, and the route's own task is left
as it was (no cancellation leaks to the server). A stream waiting on the model ends as soon
as its harness hangs up."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest
from starlette.types import Message

from kernel.errors import BackendError
from proxy.canonical import FinishReason, OutputEvent, TextDelta, TurnFinished, Usage
from proxy.routes import inference
from proxy.routes.inference import EventStream, collect_unless_disconnected

FINISHED = TurnFinished("t", FinishReason.STOP, Usage(3, 1))


async def turn(delay_s: float, log: list[str]) -> AsyncGenerator[OutputEvent, None]:
    try:
        await asyncio.sleep(delay_s)
        yield TextDelta("hi")
        yield FINISHED
        log.append("ended")
    except asyncio.CancelledError:
        log.append("cancelled")
        raise


async def no_receive() -> Message:
    raise AssertionError("a short turn must not read its connection")


async def hang_up_after(delay_s: float) -> Message:
    await asyncio.sleep(delay_s)
    return {"type": "http.disconnect"}


async def test_a_short_turn_never_reads_its_connection() -> None:
    log: list[str] = []
    answer = await collect_unless_disconnected(no_receive, turn(0.0, log), lambda: True)
    assert answer is not None
    assert answer.message.content == "hi"
    await asyncio.sleep(inference.WATCH_AFTER_S * 2)  # no watcher starts afterwards either
    assert log == ["ended"]


async def test_a_long_turn_still_answers_when_its_harness_stays() -> None:
    async def stays() -> Message:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    log: list[str] = []
    answer = await collect_unless_disconnected(stays, turn(0.2, log), lambda: True)
    assert answer is not None
    assert answer.finish_reason is FinishReason.STOP


async def test_a_hang_up_abandons_a_generating_turn_which_ends_by_itself() -> None:
    log: list[str] = []
    abandoned: list[bool] = []

    def abandon() -> bool:
        abandoned.append(True)
        return True  # the backend ends the aborted generation (here: its 0.2 s sleep)

    answer = await collect_unless_disconnected(lambda: hang_up_after(0.0), turn(0.2, log), abandon)
    assert answer is None
    assert abandoned == [True]
    assert log == ["ended"]  # not cancelled: the turn ended with everything it sampled


async def test_a_turn_that_cannot_be_abandoned_is_cancelled_and_the_task_is_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(inference, "ABANDONED_TURN_WAIT_S", 0.05)
    log: list[str] = []
    task = asyncio.current_task()
    assert task is not None
    answer = await collect_unless_disconnected(
        lambda: hang_up_after(0.0), turn(10.0, log), lambda: False
    )
    assert answer is None
    assert log == ["cancelled"]
    assert task.cancelling() == 0  # the watcher's cancel was taken back
    await asyncio.sleep(0)  # and the task goes on


async def test_a_cancel_from_outside_is_not_swallowed() -> None:
    log: list[str] = []
    collecting = asyncio.ensure_future(
        collect_unless_disconnected(no_receive, turn(10.0, log), lambda: True)
    )
    await asyncio.sleep(0.01)
    collecting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await collecting
    assert log == ["cancelled"]


async def test_a_stream_waiting_on_the_model_ends_when_its_harness_hangs_up() -> None:
    async def receive() -> Message:
        return {"type": "http.disconnect"}

    async def send(_message: Message) -> None:
        pass

    async def frames(gone: asyncio.Future[None]) -> AsyncGenerator[bytes, None]:
        yield b": waiting\n\n"
        await gone  # the model is slow; the hang-up ends the wait
        yield b"data: never sent to anyone\n\n"

    async def abandon() -> None:
        pass

    async with asyncio.timeout(1.0):
        await EventStream(frames, abandon)({"type": "http"}, receive, send)


async def test_an_error_after_a_hang_up_is_not_raised_to_nobody() -> None:
    async def fails_once_aborted() -> AsyncGenerator[OutputEvent, None]:
        await asyncio.sleep(0.2)
        yield TextDelta("hi")
        raise BackendError("the backend broke while the aborted turn ended")

    answer = await collect_unless_disconnected(
        lambda: hang_up_after(0.0), fails_once_aborted(), lambda: True
    )
    assert answer is None
