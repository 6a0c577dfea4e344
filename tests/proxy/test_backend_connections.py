"""The proxy keeps its backend connections alive: turns reuse one pooled TCP connection
instead of paying a connect (and a close) each. A counting relay sits between the proxy
(or the bare backend client) and one real zero-compute engine."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import openai
import pytest
from orjson import dumps

from engine.config import EngineConfig
from engine.loopback import running_engine
from proxy.backend import SETTLE_TIMEOUT_S, GenerateCall, GenerationEnd, SGLangBackend
from tests.proxy.conftest import running_proxy
from tests.support.tcp_relay import TcpRelay

TURNS = 12


def call(rid: str) -> GenerateCall:
    return GenerateCall(
        input_ids=(1, 2, 3), sampling_params={"max_new_tokens": 4}, rid=rid, routing_key="s"
    )


@pytest.fixture(scope="module")
def engine_port(tiny_model_dir: Path) -> Iterator[int]:
    with running_engine(EngineConfig(model_path=tiny_model_dir, zero_compute=True)) as url:
        port = urlsplit(url).port
        assert port is not None
        yield port


async def test_sequential_generates_share_one_connection(engine_port: int) -> None:
    with TcpRelay(engine_port) as relay:
        async with (
            httpx.AsyncClient() as client,
            SGLangBackend(client, [relay.url], None) as backend,
        ):
            for turn in range(TURNS):
                items = [item async for item in backend.generate(call(f"r{turn}"))]
                assert isinstance(items[-1], GenerationEnd)
        assert relay.accepted == 1


async def test_a_consumer_that_stops_at_the_end_still_returns_the_connection(
    engine_port: int,
) -> None:
    """The pipeline stops reading once it has the ``GenerationEnd``: the stream's tail
    ([DONE], the chunked body's end) must already be read by then."""
    with TcpRelay(engine_port) as relay:
        async with (
            httpx.AsyncClient() as client,
            SGLangBackend(client, [relay.url], None) as backend,
        ):
            for turn in range(TURNS):
                stream = backend.generate(call(f"stop{turn}"))
                async for item in stream:
                    if isinstance(item, GenerationEnd):
                        break
                await stream.aclose()  # type: ignore[attr-defined]
        assert relay.accepted == 1


def test_turns_through_the_proxy_open_no_connection_each(
    engine_port: int, tiny_model_dir: Path, tmp_path: Path
) -> None:
    with TcpRelay(engine_port) as relay:
        settings: dict[str, Any] = {
            "return_routed_experts": False,
            "backend_health_interval_s": 3600.0,
        }
        with running_proxy(relay.url, tiny_model_dir, tmp_path, None, **settings) as proxy:
            before = relay.accepted  # start-up: server_info and the first probe
            session = proxy.new_session()
            client = openai.OpenAI(base_url=session["openai_base_url"], api_key="k", max_retries=0)
            for _ in range(TURNS):
                client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2
                )
            streamed = client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=2,
                stream=True,
            )
            assert [chunk for chunk in streamed]
            opened = relay.accepted - before
        assert opened <= 1, f"{opened} backend connections for {TURNS + 1} turns"


class _TailedBackend:
    """A ``/generate`` stream whose tail (``data: [DONE]`` and the chunked body's end)
    comes in the finish chunk's segment (0), ``tail_after_s`` later, or never (None): what
    a slow or misbehaving SGLang front sends; with ``gated``, once the test sets ``gate``
    (each answer's tail takes one ``set``). Counts the connections it accepts."""

    def __init__(self, tail_after_s: float | None, *, gated: bool = False) -> None:
        self.tail_after_s = tail_after_s
        self.gate: asyncio.Event | None = asyncio.Event() if gated else None
        self.accepted = 0
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        # Closing the server leaves its connection handlers running (one may be holding
        # a tail back for an hour): end them, so no task outlives the test.
        for handler in self._handlers:
            handler.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                await reader.readexactly(length)
                finish = {
                    "output_ids": [7, 8],
                    "meta_info": {
                        "output_token_logprobs": [[-0.5, 7, None], [-0.25, 8, None]],
                        "completion_tokens": 2,
                        "prompt_tokens": 3,
                        "finish_reason": {"type": "length", "length": 2},
                    },
                }
                head = (
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"transfer-encoding: chunked\r\n\r\n" + _chunk(b"data: %s\n\n" % dumps(finish))
                )
                tail = _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
                if self.tail_after_s == 0:
                    writer.write(head + tail)  # one segment, as SGLang's last write is
                    continue
                writer.write(head)
                await writer.drain()
                if self.gate is not None:
                    await self.gate.wait()
                    self.gate.clear()
                else:  # None: never, held open until the client gives up
                    await asyncio.sleep(3600 if self.tail_after_s is None else self.tail_after_s)
                writer.write(tail)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


@pytest.mark.parametrize("tail_after_s", [0.0, 0.2])
async def test_a_stream_whose_tail_comes_now_or_later_keeps_its_connection(
    tail_after_s: float,
) -> None:
    """The tail taken as it came (no timer armed) or waited for (within SETTLE_TIMEOUT_S):
    either way the connection goes back to the pool."""
    backend_server = _TailedBackend(tail_after_s)
    async with (
        backend_server as url,
        httpx.AsyncClient() as client,
        SGLangBackend(client, [url], None) as backend,
    ):
        for turn in range(3):
            items = [item async for item in backend.generate(call(f"t{turn}"))]
            assert isinstance(items[-1], GenerationEnd)
            assert items[-1].finish.type == "length"
    assert backend_server.accepted == 1


async def test_a_turn_ends_before_its_streams_tail_comes_and_keeps_its_connection() -> None:
    """The finish chunk ends the turn: the tail, held back until the turn has its end,
    comes later, and the next turn still reuses the connection."""
    backend_server = _TailedBackend(None, gated=True)
    async with (
        backend_server as url,
        httpx.AsyncClient() as client,
        SGLangBackend(client, [url], None) as backend,
    ):
        assert backend_server.gate is not None
        for turn in range(3):
            items = [item async for item in backend.generate(call(f"g{turn}"))]
            assert isinstance(items[-1], GenerationEnd)
            assert items[-1].finish.type == "length"
            backend_server.gate.set()  # only now: the turn never waited for its tail
    assert backend_server.accepted == 1


async def test_a_stream_whose_tail_never_comes_costs_a_connection() -> None:
    """The next turn waits at most SETTLE_TIMEOUT_S for the connection, then opens one."""
    backend_server = _TailedBackend(None)
    async with (
        backend_server as url,
        httpx.AsyncClient() as client,
        SGLangBackend(client, [url], None) as backend,
    ):
        for turn in range(2):
            began = time.monotonic()
            items = [item async for item in backend.generate(call(f"n{turn}"))]
            assert isinstance(items[-1], GenerationEnd)
            assert time.monotonic() - began < SETTLE_TIMEOUT_S + 2
    assert backend_server.accepted == 2  # the held one was dropped, not reused
