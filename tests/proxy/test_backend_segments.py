"""SGLangBackend reads the chunks that arrive together as one delta (a loaded proxy reads
less often than a decoding engine sends), and from a worker that streams cumulative chunks
parses only the last of them; no token is lost or reordered either way, and what came
before a failure is still yielded. A scripted SGLang front on loopback sends each answer
in one segment."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import orjson
import pytest

from kernel.errors import BackendError
from proxy.backend import GenerateCall, GenerationEnd, SGLangBackend
from proxy.backend_wire import GenerationDelta

IDS = [11, 12, 13, 14]
LOGPROBS = [-0.5, -0.25, -0.125, -1.0]


def chunk(upto: int, *, cumulative: bool) -> bytes:
    """The ``data:`` line of the chunk that carries token ``upto`` (1-based)."""
    start = 0 if cumulative else upto - 1
    body = {
        "output_ids": IDS[start:upto],
        "meta_info": {
            "output_token_logprobs": [[LOGPROBS[i], IDS[i], None] for i in range(start, upto)],
            "completion_tokens": upto,
            "prompt_tokens": 3,
            "finish_reason": {"type": "length", "length": upto} if upto == len(IDS) else None,
        },
    }
    return b"data: " + orjson.dumps(body) + b"\n\n"


DONE = b"data: [DONE]\n\n"


@asynccontextmanager
async def scripted(answer: bytes, server_info: dict[str, object] | None) -> AsyncIterator[str]:
    """An SGLang front that answers every ``/generate`` with ``answer`` in one write and
    ``/server_info`` with ``server_info`` (404 when None)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                lines = head.split(b"\r\n")
                length = next(
                    (
                        int(x.split(b":")[1])
                        for x in lines
                        if x.lower().startswith(b"content-length")
                    ),
                    0,
                )
                await reader.readexactly(length)
                if lines[0].startswith(b"POST /generate"):
                    body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(answer), answer)
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                        b"transfer-encoding: chunked\r\n\r\n" + body
                    )
                elif lines[0].startswith(b"GET /server_info") and server_info is not None:
                    info = orjson.dumps(server_info)
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                        b"content-length: %d\r\n\r\n%s" % (len(info), info)
                    )
                else:
                    writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


def info(*, incremental: bool) -> dict[str, object]:
    return {
        "context_length": 4096,
        "max_req_input_len": 4090,
        "enable_return_routed_experts": False,
        "enable_deterministic_inference": True,
        "incremental_streaming_output": incremental,
    }


async def generate(
    answer: bytes,
    server_info: dict[str, object] | None,
    items: list[GenerationDelta | GenerationEnd] | None = None,
) -> list[GenerationDelta | GenerationEnd]:
    """What ``generate`` yields for ``answer``, collected in ``items`` (so a caller sees
    them even when it raises)."""
    collected: list[GenerationDelta | GenerationEnd] = [] if items is None else items
    async with (
        scripted(answer, server_info) as url,
        httpx.AsyncClient() as client,
        SGLangBackend(client, [url], None) as backend,
    ):
        await backend.connect()
        call = GenerateCall(
            input_ids=(1, 2, 3), sampling_params={"max_new_tokens": 4}, rid="r", routing_key="s"
        )
        async for item in backend.generate(call):
            collected.append(item)
    return collected


def deltas(items: list[GenerationDelta | GenerationEnd]) -> list[GenerationDelta]:
    return [item for item in items if isinstance(item, GenerationDelta)]


@pytest.mark.parametrize(
    ("cumulative", "server_info"),
    [(True, info(incremental=False)), (False, info(incremental=True)), (True, None)],
    ids=["cumulative", "incremental", "unknown-mode"],
)
async def test_chunks_that_came_together_are_one_delta(
    cumulative: bool, server_info: dict[str, object] | None
) -> None:
    answer = b"".join(chunk(n, cumulative=cumulative) for n in range(1, 5)) + DONE
    items = await generate(answer, server_info)
    assert deltas(items) == [GenerationDelta(tuple(IDS), tuple(LOGPROBS))]
    assert isinstance(items[-1], GenerationEnd)
    assert items[-1].finish.type == "length"


async def test_of_cumulative_chunks_only_the_last_is_parsed() -> None:
    """The chunks before it hold nothing it does not: even an unreadable one costs nothing."""
    answer = chunk(1, cumulative=True) + b"data: {not json\n\n" + chunk(4, cumulative=True)
    items = await generate(answer + DONE, info(incremental=False))
    assert deltas(items) == [GenerationDelta(tuple(IDS), tuple(LOGPROBS))]


async def test_deltas_from_a_worker_that_says_cumulative_are_refused_not_lost() -> None:
    answer = chunk(3, cumulative=False) + chunk(4, cumulative=False) + DONE
    with pytest.raises(BackendError, match="tokens were skipped") as refused:
        await generate(answer, info(incremental=False))
    assert not refused.value.retryable


async def test_what_came_before_an_error_is_still_yielded() -> None:
    error = b'data: {"error": {"message": "boom", "code": 500}}\n\n'
    answer = chunk(1, cumulative=True) + chunk(2, cumulative=True) + error + DONE
    items: list[GenerationDelta | GenerationEnd] = []
    with pytest.raises(BackendError, match="boom"):
        await generate(answer, info(incremental=False), items)
    assert deltas(items) == [GenerationDelta(tuple(IDS[:2]), tuple(LOGPROBS[:2]))]
