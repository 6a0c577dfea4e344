"""A streamed turn's events are read ahead by one task (``proxy.routes.event_pump``): in
order, errors after the events before them, a cancel that reaches the pipeline, a wait that
the harness's hang-up or the ping interval ends; and, through a real proxy in front of a
paced engine, no task per token."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from starlette.types import ASGIApp, Receive, Scope, Send

from engine.loopback import running_engine
from kernel.errors import BackendError
from proxy.canonical import OutputEvent, TextDelta
from proxy.routes.event_pump import EventPump
from proxy.routes.inference import EventStream
from tests.engine.helpers import engine_config
from tests.proxy.conftest import running_proxy

REPLY_TOKENS = 48


async def bursts(
    sizes: list[int], log: list[str], fail: BaseException | None = None
) -> AsyncGenerator[OutputEvent, None]:
    """Bursts of events, each after a suspension, as the pipeline yields a backend read's."""
    try:
        for burst, size in enumerate(sizes):
            await asyncio.sleep(0)
            for i in range(size):
                yield TextDelta(f"{burst}.{i}")
        if fail is not None:
            raise fail
    except asyncio.CancelledError:
        log.append("cancelled")
        raise
    finally:
        log.append("closed")


async def stalls(gate: asyncio.Event, log: list[str]) -> AsyncGenerator[OutputEvent, None]:
    """One event, then a model that never answers; notes where it was cancelled."""
    yield TextDelta("first")
    try:
        await gate.wait()
    except asyncio.CancelledError:
        log.append("cancelled")
        raise
    yield TextDelta("never")


async def drain(pump: EventPump) -> list[str]:
    texts: list[str] = []
    while not pump.ended:
        await pump.wait(5.0)
        texts.extend(e.text for e in pump.take() if isinstance(e, TextDelta))
    return texts


async def test_events_come_in_order_and_wake_the_reader_once_per_burst() -> None:
    log: list[str] = []
    pump = EventPump(bursts([3, 1, 4], log))
    woken = 0
    texts: list[str] = []
    while not pump.ended:
        await pump.wait(5.0)
        woken += 1
        taken = pump.take()
        assert taken or pump.ended
        texts.extend(e.text for e in taken if isinstance(e, TextDelta))
    pump.finish()
    assert texts == ["0.0", "0.1", "0.2", "1.0", "2.0", "2.1", "2.2", "2.3"]
    assert woken <= 4  # three bursts and the end, never once per event
    await pump.cancel()
    assert log == ["closed"]


async def test_an_error_comes_after_every_event_before_it() -> None:
    log: list[str] = []
    pump = EventPump(bursts([2, 2], log, BackendError("the backend went away")))
    assert await drain(pump) == ["0.0", "0.1", "1.0", "1.1"]
    with pytest.raises(BackendError, match="went away"):
        pump.finish()
    await pump.cancel()


async def test_cancel_reaches_the_turn_where_it_waits_and_closes_it() -> None:
    log: list[str] = []
    gate = asyncio.Event()

    pump = EventPump(stalls(gate, log))
    await pump.wait(5.0)
    assert [e.text for e in pump.take() if isinstance(e, TextDelta)] == ["first"]
    await pump.cancel()
    assert log == ["cancelled"]  # where the turn waited, as a hang-up cancels it
    assert pump.ended


async def test_a_reader_that_stops_taking_stops_the_turn_within_the_bound() -> None:
    """A harness that stops reading holds the turn's reading of the backend: the pump
    buffers at most ``ahead`` events, then resumes when they are taken."""
    produced = 0
    log: list[str] = []

    async def fast() -> AsyncGenerator[OutputEvent, None]:
        nonlocal produced
        try:
            for i in range(1000):
                if i % 10 == 0:
                    await asyncio.sleep(0)  # a backend read now and then
                produced += 1
                yield TextDelta(str(i))
        finally:
            log.append("closed")

    pump = EventPump(fast(), ahead=32)
    for _ in range(200):
        await asyncio.sleep(0)
    assert produced == 32
    assert len(pump.take()) == 32
    for _ in range(200):
        await asyncio.sleep(0)
    assert produced == 64
    await pump.cancel()  # held at the bound: the turn is closed where it yielded
    assert log == ["closed"]
    assert produced == 64


async def test_a_wait_ends_at_its_limit_or_when_the_harness_hangs_up() -> None:
    gate = asyncio.Event()

    async def silent() -> AsyncGenerator[OutputEvent, None]:
        await gate.wait()
        yield TextDelta("late")

    pump = EventPump(silent())
    loop = asyncio.get_running_loop()
    began = loop.time()
    await pump.wait(0.05)
    assert 0.04 <= loop.time() - began < 2
    assert not pump.ready
    gone = loop.create_future()
    pump.watch(gone)
    loop.call_later(0.05, gone.set_result, None)
    began = loop.time()
    await pump.wait(30.0)
    assert loop.time() - began < 2
    assert not pump.ready
    await pump.wait(30.0)  # already gone: returns at once
    await pump.cancel()


async def test_a_stream_whose_start_fails_to_send_still_ends_its_turn() -> None:
    log: list[str] = []
    gate = asyncio.Event()

    async def frames(gone: asyncio.Future[None]) -> AsyncGenerator[bytes, None]:
        yield b"never sent"

    async def receive() -> dict[str, Any]:
        await gate.wait()
        return {"type": "http.disconnect"}

    async def send(message: Any) -> None:
        raise OSError("the connection is gone")

    pump = EventPump(stalls(gate, log))
    await pump.wait(5.0)
    stream = EventStream(frames, pump.cancel)
    with pytest.raises(OSError, match="gone"):
        await stream({"type": "http"}, receive, send)
    assert log == ["cancelled"]  # the pipeline saw the cancellation, as on a hang-up


class CountTasks:
    """An ASGI layer (``around`` an app) that counts every task created on its loop."""

    def __init__(self) -> None:
        self.app: ASGIApp | None = None
        self.created = 0
        self._installed = False

    def around(self, app: ASGIApp) -> ASGIApp:
        self.app = app
        return self

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self._installed:
            self._installed = True
            loop = asyncio.get_running_loop()
            previous = loop.get_task_factory()

            def factory(
                loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any
            ) -> asyncio.Future[Any]:
                self.created += 1
                if previous is not None:
                    return previous(loop, coro, **kwargs)
                return asyncio.Task(coro, loop=loop, **kwargs)

            loop.set_task_factory(factory)
        assert self.app is not None
        await self.app(scope, receive, send)


@pytest.fixture(scope="module")
def paced_engine(tiny_model_dir: Path) -> Iterator[str]:
    paced = engine_config(
        tiny_model_dir,
        zero_compute=True,
        zero_compute_reply_tokens=REPLY_TOKENS,
        zero_compute_token_s=0.002,
    )
    with running_engine(paced) as url:
        yield url


def test_a_streamed_turn_makes_no_task_per_token(
    paced_engine: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    app = CountTasks()
    with running_proxy(paced_engine, tiny_model_dir, tmp_path, None, wrap=app.around) as proxy:
        session = proxy.new_session()
        client = openai.OpenAI(base_url=session["openai_base_url"], api_key="k", max_retries=0)

        def turn(max_tokens: int) -> tuple[int, int, int]:
            """(tasks created, content chunks the harness got, completion tokens)."""
            before = app.created
            stream = client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=max_tokens,
                stream=True,
                stream_options={"include_usage": True},
            )
            chunks = [c for c in stream]
            usage = chunks[-1].usage
            assert usage is not None
            content = [c for c in chunks if c.choices and c.choices[0].delta.content]
            return app.created - before, len(content), usage.completion_tokens

        short = [turn(4) for _ in range(3)]
        long = [turn(REPLY_TOKENS) for _ in range(3)]
    assert {s[2] for s in short} == {4}
    assert {s[2] for s in long} == {REPLY_TOKENS}
    # The long turns really streamed in many bursts (2 ms a token), not in one.
    assert max(s[1] for s in long) >= 8
    # A task per event made the long turn cost ~40 tasks more than the short one.
    assert min(s[0] for s in long) - min(s[0] for s in short) <= 3, (short, long)
