"""bench.forwarder, the transport's floor in ``bench.peers``: a chat turn through it is one
streamed ``/generate`` call to the engine, read to its end, on one pooled connection."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from bench.forwarder import Forwarder
from bench.overhead import Stack, generate_body, stack


@pytest.fixture(scope="module")
def ready() -> Iterator[Stack]:
    """The zero-compute engine on the tiny model, in its own process."""
    with stack("lego-forwarder-test-") as started:
        yield started


async def test_each_turn_is_one_generation_read_whole_on_a_kept_connection(ready: Stack) -> None:
    forwarder = Forwarder(ready.engine_url, generate_body(ready.model))
    transport = httpx.ASGITransport(app=forwarder)
    async with httpx.AsyncClient(transport=transport, base_url="http://forwarder") as client:
        for _ in range(3):
            answer = await client.post("/v1/chat/completions", json={"messages": []})
            assert answer.status_code == 200
            assert answer.json()["choices"][0]["message"]["content"] == "OK."
        missing = await client.post("/v1/completions", json={})
        assert missing.status_code == 404
    assert forwarder.connections_opened == 1


async def test_an_engine_that_refuses_the_call_is_a_502(ready: Stack) -> None:
    forwarder = Forwarder(ready.engine_url, {"input_ids": "not ids"})
    transport = httpx.ASGITransport(app=forwarder)
    async with httpx.AsyncClient(transport=transport, base_url="http://forwarder") as client:
        answer = await client.post("/v1/chat/completions", json={"messages": []})
    assert answer.status_code == 502
