"""A backend generation that goes silent fails the turn after ``read_timeout_s`` of silence
(``LEGO_BACKEND_TIMEOUT_S``), whether it never starts its response or stops mid-stream; a
slow stream that keeps sending is never cut, however long it takes. Against raw loopback
servers that answer exactly as scripted."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import httpx
import orjson
import pytest

from kernel.errors import BackendError, BackendUnavailable
from proxy.backend import GenerateCall, GenerationEnd, SGLangBackend

LIMIT_S = 0.3
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def sse_chunk(ids: list[int], finish: dict[str, object] | None) -> bytes:
    body = orjson.dumps(
        {
            "output_ids": ids,
            "meta_info": {
                "id": "r",
                "finish_reason": finish,
                "prompt_tokens": 3,
                "completion_tokens": len(ids),
                "weight_version": "default",
                "output_token_logprobs": [[-0.5, i, None] for i in ids],
            },
        }
    )
    data = b"data: " + body + b"\n\n"
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


DONE = b"data: [DONE]\n\n"
END = f"{len(DONE):x}\r\n".encode() + DONE + b"\r\n0\r\n\r\n"


@asynccontextmanager
async def scripted(script: Script) -> AsyncIterator[str]:
    """A server on loopback that reads a request's head and body, then runs ``script``."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
        await reader.readexactly(length)
        try:
            await script(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    host, port = server.sockets[0].getsockname()[:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        server.close()


async def generate(url: str) -> GenerationEnd:
    call = GenerateCall(input_ids=(1, 2, 3), sampling_params={}, rid="r", routing_key="k")
    async with (
        httpx.AsyncClient() as client,
        SGLangBackend(client, url, None, read_timeout_s=LIMIT_S) as backend,
    ):
        async for item in backend.generate(call):
            if isinstance(item, GenerationEnd):
                return item
    raise AssertionError("no end")


@pytest.mark.parametrize(
    ("sent", "error", "says"),
    [
        (HEAD + sse_chunk([7], None), BackendError, "sent nothing for 0.3 s"),
        (b"", BackendUnavailable, "did not start its answer within 0.3 s"),
        (
            b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 100\r\n\r\n{",
            BackendError,
            "sent nothing for 0.3 s",
        ),
    ],
    ids=["stops-mid-answer", "never-starts", "error-body-never-ends"],
)
async def test_a_backend_gone_silent_fails_the_call_after_the_limit(
    sent: bytes, error: type[BackendError], says: str
) -> None:
    async def goes_silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(sent)
        await writer.drain()
        await reader.read()  # until the proxy hangs up

    async with scripted(goes_silent) as url:
        began = time.monotonic()
        with pytest.raises(error) as caught:
            await generate(url)
    assert time.monotonic() - began < 5
    assert says in caught.value.message
    assert caught.value.retryable


async def test_a_slow_stream_that_keeps_sending_is_not_cut() -> None:
    """Eight chunks 0.15 s apart: over 1 s in all, three times the limit, never silent
    for it."""

    async def slow(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(HEAD)
        for n in range(1, 8):
            writer.write(sse_chunk(list(range(n)), None))
            await writer.drain()
            await asyncio.sleep(0.15)
        writer.write(sse_chunk(list(range(8)), {"type": "length", "length": 8}) + END)
        await writer.drain()

    async with scripted(slow) as url:
        began = time.monotonic()
        end = await generate(url)
    assert end.finish.type == "length"
    assert time.monotonic() - began > 3 * LIMIT_S
