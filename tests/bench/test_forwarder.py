"""bench.forwarder, the transport's floor in ``bench.peers``: a chat turn through it is one
streamed ``/generate`` call to the engine, read to its end, on one pooled connection; the
durable one commits each turn to its SQLite file before answering it."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from bench.forwarder import DurableLog, Forwarder, Message, Receive, Scope, Send
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


async def test_a_durable_forwarder_commits_each_turn_before_answering_it(
    ready: Stack, tmp_path: Path
) -> None:
    log = DurableLog(tmp_path / "log")
    forwarder = Forwarder(ready.engine_url, generate_body(ready.model), log)
    committed_at_body: list[int] = []

    def rows() -> list[tuple[bytes, bytes]]:
        # Another connection: what is committed, not what the log's own transaction holds.
        with sqlite3.connect(log.path) as reader:
            return reader.execute("SELECT request, answer FROM turns ORDER BY id").fetchall()

    async def watched(scope: Scope, receive: Receive, send: Send) -> None:
        async def send_body(message: Message) -> None:
            if message["type"] == "http.response.body":
                committed_at_body.append(len(rows()))
            await send(message)

        await forwarder(scope, receive, send_body)

    transport = httpx.ASGITransport(app=watched)
    async with httpx.AsyncClient(transport=transport, base_url="http://forwarder") as client:
        for turn in range(2):
            answer = await client.post("/v1/chat/completions", json={"turn": turn})
            assert answer.status_code == 200
    log.close()
    assert committed_at_body == [1, 2]  # each turn committed before its answer's body went
    written = rows()
    assert [orjson.loads(request) for request, _ in written] == [{"turn": 0}, {"turn": 1}]
    for _, sse in written:  # the engine's whole answer, as it streamed it
        assert b'"finish_reason"' in sse
        assert sse.rstrip().endswith(b"data: [DONE]")
    with sqlite3.connect(log.path) as reader:
        assert reader.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_a_durable_log_syncs_every_commit(tmp_path: Path) -> None:
    """Every commit synced (lego-proxy's setting), not SQLite's WAL-mode shortcut of syncing
    only at checkpoints."""
    log = DurableLog(tmp_path)
    try:
        assert log.synchronous() == 2  # FULL
    finally:
        log.close()


async def test_an_engine_failure_is_not_logged(ready: Stack, tmp_path: Path) -> None:
    log = DurableLog(tmp_path)
    forwarder = Forwarder(ready.engine_url, {"input_ids": "not ids"}, log)
    transport = httpx.ASGITransport(app=forwarder)
    async with httpx.AsyncClient(transport=transport, base_url="http://forwarder") as client:
        answer = await client.post("/v1/chat/completions", json={"messages": []})
    log.close()
    assert answer.status_code == 502
    with sqlite3.connect(log.path) as reader:
        assert reader.execute("SELECT count(*) FROM turns").fetchone() == (0,)
