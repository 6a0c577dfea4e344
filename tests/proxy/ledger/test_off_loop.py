"""``plan_off_loop`` (issue 16, item 3): a huge request neither stalls the event loop nor
costs time in its size: over-budget text is refused before any render starts, and a large
render runs in a worker thread while the loop keeps serving."""

from __future__ import annotations

import asyncio

import pytest

from kernel.errors import ContextLengthExceeded
from proxy.canonical import Message
from proxy.ledger import LedgerBook
from proxy.ledger.book import INLINE_RENDER_CHARS
from tests.proxy.ledger.conftest import request


async def test_the_same_plan_as_on_the_loop(book: LedgerBook) -> None:
    asked = request(Message("user", "hello " * 10_000))
    assert len("hello " * 10_000) > INLINE_RENDER_CHARS  # rendered in a worker thread
    off = await book.plan_off_loop("s", asked, max_prompt_tokens=100_000)
    assert off.prompt_ids == book.plan("s", asked).prompt_ids


async def test_text_no_budget_holds_is_refused_before_rendering(book: LedgerBook) -> None:
    rendered: list[int] = []
    original = book._renderer.render

    def spy(*args: object, **kwargs: object) -> list[int]:
        rendered.append(1)
        return original(*args, **kwargs)  # type: ignore[arg-type]

    book._renderer.render = spy  # type: ignore[method-assign]
    huge = request(Message("user", "x" * 10_000_000))  # the 10 MB message
    with pytest.raises(ContextLengthExceeded):
        await book.plan_off_loop("s", huge, max_prompt_tokens=32_768)
    assert rendered == []


async def test_a_large_render_leaves_the_loop_free(book: LedgerBook) -> None:
    # Distinct words, so tokenizing takes a while; a budget it fits in.
    text = " ".join(f"word{n}" for n in range(60_000))
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0)
            ticks += 1

    running = asyncio.create_task(ticker())
    try:
        asked = request(Message("user", text))
        plan = await book.plan_off_loop("s", asked, max_prompt_tokens=10**6)
    finally:
        running.cancel()
    assert len(plan.prompt_ids) > 60_000
    # The loop ran other work while the render was on its thread (inline, it could not).
    assert ticks > 10
