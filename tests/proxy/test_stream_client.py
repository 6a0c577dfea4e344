"""The hot path's HTTP/1.1 client (``proxy.stream_client``) against raw loopback servers
that answer exactly as scripted: chunked and sized bodies, keep-alive reuse and its
limits, a connection lost mid-answer, back-pressure on a reader that stops reading, and
the errors a caller tells apart (nothing sent, or broken after sending)."""

from __future__ import annotations

import asyncio
import shutil
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Literal

import pytest

from kernel.errors import BackendUnavailable
from proxy.stream_client import BUFFER_LIMIT, ConnectFailed, StreamBroken, StreamClient

Answer = Callable[[bytes, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[bool]]
HEADERS = {"Content-Type": "application/json", "X-SMG-Routing-Key": "s"}


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


CHUNKED = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


def new_client(
    keepalive_s: float = 4.0, tls: ssl.SSLContext | None = None, settle_s: float = 1.0
) -> StreamClient:
    return StreamClient(connect_timeout_s=5.0, keepalive_s=keepalive_s, settle_s=settle_s, tls=tls)


class Server:
    """Loopback server: every request on every connection is answered by ``answer``
    (given the request's head and body); it returns whether the connection stays open."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.connections = 0
        self.requests: list[bytes] = []
        self.url = ""

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                body = await reader.readexactly(length)
                self.requests.append(head + body)
                if not await self.answer(head, reader, writer):
                    return
        finally:
            writer.close()


@asynccontextmanager
async def serving(answer: Answer) -> AsyncIterator[Server]:
    server = Server(answer)
    listener = await asyncio.start_server(server.serve, "127.0.0.1", 0)
    server.url = f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}"
    try:
        yield server
    finally:
        listener.close()


async def streamed(
    _head: bytes, _reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> bool:
    writer.write(CHUNKED + chunk(b"data: one\n\n"))
    await writer.drain()
    await asyncio.sleep(0.01)
    writer.write(chunk(b"data: two\n\n") + b"0\r\n\r\n")
    await writer.drain()
    return True


async def read_all(client: StreamClient, url: str) -> tuple[int, bytes]:
    response = await client.post(f"{url}/generate", b'{"x": 1}', HEADERS)
    parts = []
    while data := await response.readany():
        parts.append(data)
    status = response.status
    response.release()
    return status, b"".join(parts)


async def test_a_chunked_stream_is_read_as_it_comes_and_its_connection_reused() -> None:
    async with serving(streamed) as server:
        client = new_client()
        for _ in range(5):
            assert await read_all(client, server.url) == (200, b"data: one\n\ndata: two\n\n")
        await client.close()
    assert server.connections == 1
    assert client.opened == 1
    request = server.requests[0]
    assert request.startswith(b"POST /generate HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"\r\nContent-Length: 8\r\n" in request
    assert b"\r\nX-SMG-Routing-Key: s\r\n" in request
    assert request.endswith(b'\r\n\r\n{"x": 1}')


async def test_a_sized_error_answer_is_read_whole() -> None:
    async def refuse(_head: bytes, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        body = b'{"error": {"message": "too long", "code": 400}}'
        writer.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()
        return True

    async with serving(refuse) as server:
        client = new_client()
        response = await client.post(f"{server.url}/generate", b"{}", HEADERS)
        assert response.status == 400
        assert await response.read() == b'{"error": {"message": "too long", "code": 400}}'
        await client.close()


async def test_an_answer_without_length_ends_with_its_connection_which_is_not_reused() -> None:
    async def until_close(
        _head: bytes, _r: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nall of it")
        await writer.drain()
        return False  # closes: the end of the body

    async with serving(until_close) as server:
        client = new_client()
        assert await read_all(client, server.url) == (200, b"all of it")
        assert await read_all(client, server.url) == (200, b"all of it")
        await client.close()
    assert server.connections == 2


async def test_a_connection_lost_mid_answer_breaks_the_stream_after_what_came() -> None:
    async def dies(_head: bytes, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(CHUNKED + chunk(b"data: one\n\n"))
        await writer.drain()
        await asyncio.sleep(0.02)
        return False

    async with serving(dies) as server:
        client = new_client()
        response = await client.post(f"{server.url}/generate", b"{}", HEADERS)
        assert await response.readany() == b"data: one\n\n"
        with pytest.raises(StreamBroken, match="closed mid-answer"):
            await response.readany()
        response.release()  # not read to its end: closed, never pooled
        assert response.closed
        await client.close()


async def test_a_connection_closed_before_its_headers_is_a_broken_stream() -> None:
    async def hangs_up(_head: bytes, _r: asyncio.StreamReader, _w: asyncio.StreamWriter) -> bool:
        return False

    async with serving(hangs_up) as server:
        client = new_client()
        with pytest.raises(StreamBroken):
            await client.post(f"{server.url}/generate", b"{}", HEADERS)
        await client.close()


async def test_a_refused_connect_says_nothing_was_sent() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, never listening: refused
        client = new_client()
        with pytest.raises(ConnectFailed, match="cannot connect"):
            await client.post(f"http://127.0.0.1:{port}/generate", b"{}", HEADERS)
        await client.close()


async def test_a_connection_idle_past_the_keepalive_is_not_reused() -> None:
    async with serving(streamed) as server:
        client = new_client(keepalive_s=0.05)
        await read_all(client, server.url)
        await read_all(client, server.url)  # at once: reused
        assert server.connections == 1
        await asyncio.sleep(0.1)
        await read_all(client, server.url)  # idled too long: a new one
        await client.close()
    assert server.connections == 2


async def test_a_pooled_connection_the_server_closed_leaves_the_pool() -> None:
    async def once(head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        await streamed(head, reader, writer)
        return False  # a keep-alive answer, then the server closes while it idles

    async with serving(once) as server:
        client = new_client()
        await read_all(client, server.url)
        await asyncio.sleep(0.05)  # the close reaches the client
        async with asyncio.timeout(5.0):
            assert await read_all(client, server.url) == (200, b"data: one\n\ndata: two\n\n")
        await client.close()
    assert server.connections == 2


async def test_a_reader_that_stops_reading_pauses_the_socket() -> None:
    block = b"x" * 65536
    sent = asyncio.Event()

    async def flood(_head: bytes, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(CHUNKED)
        try:
            async with asyncio.timeout(1.0):
                for _ in range(1000):  # 64 MiB, far past any socket buffer
                    writer.write(chunk(block))
                    await writer.drain()
        except TimeoutError:
            sent.set()  # the writer blocked: the client stopped reading
            return False
        return True

    async with serving(flood) as server:
        client = new_client()
        response = await client.post(f"{server.url}/generate", b"{}", HEADERS)
        await asyncio.wait_for(sent.wait(), 5.0)
        held = response.read_nowait()
        assert BUFFER_LIMIT < len(held) < BUFFER_LIMIT + 4 * len(block) + 65536
        assert await response.readany()  # reading again resumes the socket
        response.close()
        await client.close()


class Tailed:
    """Answers whose tail (the last chunk and the chunked body's end) waits for ``gate``,
    as SGLang's ``data: [DONE]`` comes in a write after its finish chunk; only the first
    answer is held so. ``hold="eof"`` holds the tail until the client closes the
    connection, and counts those closes; ``"close"`` closes the connection at the gate
    instead of sending the tail."""

    def __init__(self, *, hold: Literal["gate", "eof", "close"] = "gate") -> None:
        self.gate = asyncio.Event()
        self.hold = hold
        self.answered = 0
        self.closed_by_client = 0

    async def __call__(
        self, _head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        self.answered += 1
        writer.write(CHUNKED + chunk(b"data: finish\n\n"))
        await writer.drain()
        if self.answered == 1:
            if self.hold == "eof":
                assert await reader.read() == b""
                self.closed_by_client += 1
                return False
            await self.gate.wait()
            if self.hold == "close":
                return False
        writer.write(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await writer.drain()
        return True


async def finish_and_release(client: StreamClient, url: str) -> None:
    """Reads an answer's first chunk, as the backend reads SGLang's finish chunk, and
    releases the connection with the answer's tail still to come."""
    response = await client.post(f"{url}/generate", b"{}", HEADERS)
    assert await response.readany() == b"data: finish\n\n"
    assert not response.complete
    response.release()


WHOLE = (200, b"data: finish\n\ndata: [DONE]\n\n")  # a Tailed answer, read to its end


@asynccontextmanager
async def a_post_waiting(
    tailed: Tailed, settle_s: float = 1.0
) -> AsyncIterator[tuple[Server, StreamClient, asyncio.Task[tuple[int, bytes]]]]:
    """A connection released with its answer's tail held back, and a post started after
    it, which waits for that connection."""
    async with serving(tailed) as server:
        client = new_client(settle_s=settle_s)
        await finish_and_release(client, server.url)  # returns with the tail held back
        waiting = asyncio.create_task(read_all(client, server.url))
        await asyncio.sleep(0.01)
        try:
            yield server, client, waiting
        finally:
            await client.close()


async def test_a_connection_released_before_its_answer_ends_is_reused_once_it_ends() -> None:
    tailed = Tailed()
    async with a_post_waiting(tailed) as (server, client, waiting):
        await asyncio.sleep(0.05)
        assert not waiting.done()  # waits for the settling connection, opens none
        assert server.connections == 1
        tailed.gate.set()
        async with asyncio.timeout(5.0):  # the tail dropped, the next answer whole
            assert await waiting == WHOLE
    assert server.connections == 1
    assert client.opened == 1


async def test_posts_beyond_the_settling_connections_connect_at_once() -> None:
    tailed = Tailed()
    async with a_post_waiting(tailed) as (server, client, first):
        async with asyncio.timeout(5.0):  # the one settling connection is first's to wait for
            assert await read_all(client, server.url) == WHOLE
        assert not first.done()
        tailed.gate.set()
        async with asyncio.timeout(5.0):
            assert await first == WHOLE
    assert server.connections == 2


async def test_a_settling_connection_whose_answer_never_ends_is_closed() -> None:
    tailed = Tailed(hold="eof")
    async with serving(tailed) as server:
        client = new_client(settle_s=0.2)
        await finish_and_release(client, server.url)
        async with asyncio.timeout(5.0):  # waits out settle_s, then connects
            assert await read_all(client, server.url) == WHOLE
        await asyncio.sleep(0.05)
        assert tailed.closed_by_client == 1  # the first connection was let go, not leaked
        await client.close()
    assert server.connections == 2


async def test_a_post_waiting_for_a_settling_connection_that_breaks_connects_at_once() -> None:
    tailed = Tailed(hold="close")
    async with a_post_waiting(tailed, settle_s=3600.0) as (server, _, waiting):
        tailed.gate.set()  # the server closes the first connection mid-answer
        async with asyncio.timeout(5.0):
            assert await waiting == WHOLE
    assert server.connections == 2


async def test_a_post_cancelled_while_waiting_leaves_the_connection_to_the_next() -> None:
    tailed = Tailed()
    async with a_post_waiting(tailed) as (server, client, waiting):
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        tailed.gate.set()
        await asyncio.sleep(0.05)  # the tail comes: the connection goes idle
        async with asyncio.timeout(5.0):
            assert await read_all(client, server.url) == WHOLE
    assert server.connections == 1


async def test_closing_the_client_fails_a_post_waiting_for_a_settling_connection() -> None:
    tailed = Tailed()
    async with a_post_waiting(tailed) as (_, client, waiting):
        await client.close()
        with pytest.raises(BackendUnavailable, match="closed"):
            async with asyncio.timeout(5.0):
                await waiting
        tailed.gate.set()


async def test_a_paused_connection_released_drops_the_rest_of_its_answer_and_is_reused() -> None:
    block = b"x" * 65536
    answered = 0

    async def big(_head: bytes, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        nonlocal answered
        answered += 1
        writer.write(CHUNKED)
        for _ in range(64 if answered == 1 else 1):  # 4 MiB first, past the buffer limit
            writer.write(chunk(block))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    async with serving(big) as server:
        client = new_client()
        response = await client.post(f"{server.url}/generate", b"{}", HEADERS)
        assert await response.readany()
        await asyncio.sleep(0.05)  # the client's buffer fills; it stops reading
        response.release()  # reading resumes; what is left is dropped
        async with asyncio.timeout(5.0):
            assert await read_all(client, server.url) == (200, block)
        await client.close()
    assert server.connections == 1


async def test_close_fails_a_read_waiting_on_the_connection() -> None:
    release = asyncio.Event()

    async def silent(_head: bytes, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(CHUNKED)
        await writer.drain()
        await release.wait()
        return False

    async with serving(silent) as server:
        client = new_client()
        response = await client.post(f"{server.url}/generate", b"{}", HEADERS)
        reading = asyncio.create_task(response.readany())
        await asyncio.sleep(0.01)
        response.close()
        with pytest.raises(StreamBroken, match="closed by the proxy"):
            await reading
        release.set()
        await client.close()


async def test_a_header_with_a_line_break_is_refused_before_anything_is_sent() -> None:
    async with serving(streamed) as server:
        client = new_client()
        with pytest.raises(ValueError, match="line break"):
            await client.post(
                f"{server.url}/generate", b"{}", {"X-SMG-Routing-Key": "s\r\nX-Evil: 1"}
            )
        await client.close()
    assert server.requests == []


async def test_a_closed_client_refuses_new_calls() -> None:
    client = new_client()
    await client.close()
    with pytest.raises(BackendUnavailable, match="closed"):
        await client.post("http://127.0.0.1:9/generate", b"{}", HEADERS)


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("needs the openssl command to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subject = ["-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"]
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            *subject,
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


async def test_an_https_worker_is_verified_and_streamed_from(
    certificate: tuple[Path, Path],
) -> None:
    cert, key = certificate
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.load_cert_chain(cert, key)
    server = Server(streamed)
    listener = await asyncio.start_server(server.serve, "127.0.0.1", 0, ssl=served)
    url = f"https://127.0.0.1:{listener.sockets[0].getsockname()[1]}"
    try:
        trusting = new_client(tls=ssl.create_default_context(cafile=str(cert)))
        assert await read_all(trusting, url) == (200, b"data: one\n\ndata: two\n\n")
        await trusting.close()
        stranger = new_client()  # the system's CAs: the self-signed worker is refused
        with pytest.raises(ConnectFailed, match="CERTIFICATE_VERIFY_FAILED"):
            await stranger.post(f"{url}/generate", b"{}", HEADERS)
        await stranger.close()
    finally:
        listener.close()
