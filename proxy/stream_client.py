"""HTTP/1.1 client for the hot path's one call: ``POST /generate`` and its streamed answer.

Owns: a keep-alive pool of TCP (or TLS) connections per worker for the life of the app;
writing a POST, head and body, in one write; reading the answer as it arrives (status and
headers first, then the body's bytes, chunked or sized) through httptools' parser (llhttp,
the one uvicorn serves with), with reading paused while more than ``BUFFER_LIMIT`` bytes
wait unread, so a harness that stops reading cannot make the proxy buffer a whole answer.

Why not aiohttp, which served this call before: at one turn in flight its request building
(header multidicts, payload registry, cookie filtering, the stream reader) cost 0.16-0.22 ms
of CPU per streamed generation, this client 0.06 ms (``docs/performance.md``). The rare calls
(``/health``, ``/server_info``, ``/abort_request``) stay on the caller's httpx client.

Contract:
- ``StreamClient.post`` returns the connection carrying the answer once its status line and
  headers arrived. It raises ``ConnectFailed`` when no connection could be opened (refused,
  unresolvable, or not within ``connect_timeout_s``): nothing was sent, so another worker
  may take the call; ``StreamBroken`` when the connection failed after the request was
  written. Cancelled while waiting, it closes the connection (the server sees the request's
  client go away).
- ``BackendConnection.readany`` returns the body bytes that arrived since the last read,
  waiting for some; ``b""`` once the body has ended. It raises ``StreamBroken`` when the
  connection ends, or is closed by ``close``, before the body does; bytes that came first
  are returned first.
- ``release`` puts a connection whose answer was read to its end (and that the server keeps
  alive) back in the pool. One released while the end of its answer is still on its way
  (the caller has what it needs: SGLang's finish chunk comes before ``data: [DONE]`` and the
  chunked body's end, in writes of their own) is *settling*: the rest of its answer is
  dropped as it arrives, and it goes back to the pool when the answer ends. The caller never
  waits for that tail. A ``post`` that finds no idle connection waits for a settling one
  rather than opening another, so sequential calls keep one connection however late the
  tail comes; it waits at most until that connection's ``settle_s`` has run out. A
  connection whose answer has not ended by then is closed by the next post that looks for
  one (as an idle connection past ``keepalive_s`` is), or by ``close``; it is never waited
  for again. Anything else released (an answer whose end comes only with its connection,
  a failed one) is closed. ``close`` always closes. Both may be called more than once.
- A connection idle in the pool for ``keepalive_s`` is never reused (close it before the
  server's own keep-alive timeout can close it under a new request); one the server closed
  leaves the pool at once. ``StreamClient.close`` closes every connection, in use or not.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import httptools

from kernel.errors import BackendError, BackendUnavailable

BUFFER_LIMIT = 1 << 18  # unread body bytes past which the socket is not read
ERROR_BODY_LIMIT = 1 << 20  # of a non-200 answer, what ``read`` keeps (the message is first)


class ConnectFailed(BackendUnavailable):
    """No connection to the worker could be opened: nothing of the request was sent."""


class StreamBroken(BackendError):
    """The connection failed (or was closed) after the request was written."""


@dataclass(frozen=True, slots=True)
class _Origin:
    """Where a URL's requests go, and the request line and ``Host`` header they carry."""

    key: str  # scheme://host:port: the pool a connection belongs to
    host: str
    port: int
    tls: bool
    head: bytes  # "POST <path> HTTP/1.1\r\nHost: ...\r\n"

    @classmethod
    def of(cls, url: str) -> _Origin:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        path = parts.path or "/"
        if parts.query:
            path += f"?{parts.query}"
        host = parts.netloc.rpartition("@")[2]  # never the URL's credentials
        return cls(
            key=f"{parts.scheme}://{parts.hostname}:{port}",
            host=parts.hostname,
            port=port,
            tls=tls,
            head=f"POST {path} HTTP/1.1\r\nHost: {host}\r\n".encode("ascii"),
        )


class BackendConnection(asyncio.Protocol):
    """One connection to a worker, and the answer it is reading (one at a time)."""

    def __init__(self, client: StreamClient, origin: _Origin) -> None:
        self._client = client
        self.origin = origin
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._body: list[bytes] = []
        self._buffered = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._failure: StreamBroken | None = None
        self._sized = False  # the answer says where its body ends (length or chunks)
        self._closed = False
        self._keep_alive = False
        self._settling = False  # released before its answer ended: pooled when it does
        self.status = 0
        self.headers_done = False
        self.complete = False  # the answer's body has ended
        self.idle_since = 0.0
        self.settle_by = 0.0  # of a settling connection: when its answer must have ended

    # -- asyncio's side ---------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(f"the answer from {self.origin.key} is not valid HTTP/1.1: {exc}")
            self.close()
            return
        if self._buffered > BUFFER_LIMIT and not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._client.forget(self)
        if self.headers_done and not self._sized and not self.complete:
            self.complete = True  # an answer without length or chunks ends with its connection
        elif not self.complete:
            reason = f": {exc!r}" if exc is not None else ""
            self._fail(f"the connection to {self.origin.key} closed mid-answer{reason}")
        self._wake()

    # -- httptools' callbacks -----------------------------------------------------
    def on_header(self, name: bytes, _value: bytes) -> None:
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self._sized = True

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self.headers_done = True
        if self.status in (204, 304) or 100 <= self.status < 200:
            self._sized = True  # no body follows

    def on_body(self, body: bytes) -> None:
        if self._settling:
            return  # the tail of an answer its caller is done with
        self._body.append(body)
        self._buffered += len(body)

    def on_message_complete(self) -> None:
        self.complete = True
        # Asked now: llhttp forgets the answer's flags once the next message starts.
        self._keep_alive = self._parser.should_keep_alive()
        if self._settling:
            self._settling = False
            self.release()  # pooled (to a post waiting for it, if any), or closed

    # -- the caller's side --------------------------------------------------------
    def send(self, head: bytes, body: bytes) -> None:
        """Start an exchange on this (fresh or pooled) connection."""
        assert self._transport is not None
        if self._closed:  # the pool keeps no closed connection: never wait on one
            raise StreamBroken(f"the connection to {self.origin.key} is closed")
        self.status = 0
        self.headers_done = self.complete = self._sized = self._keep_alive = False
        self._transport.write(head + body)

    async def wait_headers(self) -> None:
        while not self.headers_done:
            if self._failure is not None:
                raise self._failure
            await self._wait()

    async def readany(self) -> bytes:
        while not self._body:
            if self.complete:
                return b""
            if self._failure is not None:
                raise self._failure
            await self._wait()
        return self.read_nowait()

    def read_nowait(self) -> bytes:
        """The body bytes already here (maybe none)."""
        body = self._body
        data = body[0] if len(body) == 1 else b"".join(body)
        body.clear()
        self._buffered = 0
        if self._paused and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()
        return data

    async def read(self) -> bytes:
        """The whole body (of an error answer: its first ``ERROR_BODY_LIMIT`` bytes)."""
        parts: list[bytes] = []
        kept = 0
        while kept < ERROR_BODY_LIMIT:
            data = await self.readany()
            if not data:
                break
            parts.append(data)
            kept += len(data)
        return b"".join(parts)[:ERROR_BODY_LIMIT]

    def release(self) -> None:
        """Back to the pool when its answer was read to the end and the server keeps it
        alive; settling when the answer's end is still to come (module docstring); closed
        otherwise."""
        if self._closed or self._settling:
            return
        if self._failure is not None or not (self.complete or self._sized):
            self.close()  # failed, or an answer that ends only with its connection
            return
        self._body.clear()
        self._buffered = 0
        if not self.complete:
            self._settling = True
            self._client.settling(self)
            if self._paused and self._transport is not None:
                self._paused = False  # what is left is dropped as it comes, never buffered
                self._transport.resume_reading()
        elif self._keep_alive:
            self._client.put_back(self)
        else:
            self.close()

    def close(self) -> None:
        """Drop the connection; a read waiting on it fails at once."""
        if not self.complete:
            self._fail(f"the connection to {self.origin.key} was closed by the proxy")
        self._settling = False
        if not self._closed:
            self._closed = True
            self._client.forget(self)
            if self._transport is not None:
                self._transport.close()
        self._wake()

    @property
    def closed(self) -> bool:
        return self._closed

    # -- internals ----------------------------------------------------------------
    def _fail(self, message: str) -> None:
        if self._failure is None:
            self._failure = StreamBroken(message)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None


class StreamClient:
    """Pooled keep-alive connections to the backend's workers (see the module docstring)."""

    def __init__(
        self,
        *,
        connect_timeout_s: float,
        keepalive_s: float,
        settle_s: float,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        """The timeouts are the caller's policy (``proxy.backend.stream_client``)."""
        self._connect_timeout_s = connect_timeout_s
        self._keepalive_s = keepalive_s
        self._origins: dict[str, _Origin] = {}
        self._idle: dict[str, list[BackendConnection]] = {}  # origin key -> newest last
        self._open: set[BackendConnection] = set()
        self._tls = tls  # what an https worker is verified with; None: the system's CAs
        self._settle_s = settle_s
        self._settling: dict[str, list[BackendConnection]] = {}  # origin key -> oldest first
        # Posts waiting for a settling connection of an origin, first come first served.
        self._waiting: dict[str, deque[asyncio.Future[BackendConnection | None]]] = {}
        self._closed = False
        self.opened = 0  # connections ever opened: what a pooled client keeps low

    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> BackendConnection:
        if self._closed:
            raise BackendUnavailable("the backend's stream client is closed")
        origin = self._origins.get(url)
        if origin is None:
            origin = self._origins[url] = _Origin.of(url)
        head = origin.head + _header_lines(headers, len(body))
        connection = self._pooled(origin.key)
        if connection is None and self._settling.get(origin.key):
            connection = await self._settled(origin.key)
            if self._closed:
                if connection is not None:
                    connection.close()
                raise BackendUnavailable("the backend's stream client is closed")
            if connection is not None and connection.closed:
                connection = None  # the server closed it before this post resumed
        if connection is None:
            connection = await self._connect(origin)
        try:
            connection.send(head, body)
            await connection.wait_headers()
        except BaseException:
            connection.close()
            raise
        return connection

    async def close(self) -> None:
        self._closed = True
        for connection in list(self._open):
            connection.close()
        self._idle.clear()

    def _pooled(self, key: str) -> BackendConnection | None:
        idle = self._idle.get(key)
        if not idle:
            return None
        connection = idle.pop()
        if asyncio.get_running_loop().time() - connection.idle_since < self._keepalive_s:
            return connection
        # The newest has idled too long, so have the older ones: the server may close them.
        for stale in (*idle, connection):
            stale.close()
        idle.clear()
        return None

    async def _settled(self, key: str) -> BackendConnection | None:
        """A settling connection of ``key`` once its answer has ended (or any connection
        put back first); None when every settling one is already awaited by an earlier
        post, or none ended in time: the caller opens a connection of its own."""
        settling = self._settling[key]
        loop = asyncio.get_running_loop()
        _close_late(settling, loop.time())
        waiting = self._waiting.setdefault(key, deque())
        if len(settling) <= len(waiting):
            return None
        until = max(c.settle_by for c in settling)
        turn: asyncio.Future[BackendConnection | None] = loop.create_future()
        waiting.append(turn)
        try:
            async with asyncio.timeout_at(until):
                return await turn
        except TimeoutError:
            handed = _handed(turn)
            if handed is None:
                _close_late(settling, loop.time())
            return handed
        except BaseException:
            # Cancelled in the instant a connection was handed over: it stays pooled.
            if (handed := _handed(turn)) is not None:
                self.put_back(handed)
            raise
        finally:
            if turn in waiting:
                waiting.remove(turn)

    async def _connect(self, origin: _Origin) -> BackendConnection:
        loop = asyncio.get_running_loop()
        tls: ssl.SSLContext | None = None
        if origin.tls:
            if self._tls is None:
                self._tls = ssl.create_default_context()
            tls = self._tls
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _, connection = await loop.create_connection(
                    lambda: BackendConnection(self, origin), origin.host, origin.port, ssl=tls
                )
        except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError
            raise ConnectFailed(f"cannot connect to {origin.key}: {exc!r}") from exc
        self.opened += 1
        self._open.add(connection)
        return connection

    def settling(self, connection: BackendConnection) -> None:
        """A connection released before its answer ended (``BackendConnection.release``)."""
        connection.settle_by = asyncio.get_running_loop().time() + self._settle_s
        self._settling.setdefault(connection.origin.key, []).append(connection)

    def put_back(self, connection: BackendConnection) -> None:
        """A connection whose answer was read to its end: to the first post waiting for one,
        else idle, ready for the next."""
        if self._closed:
            connection.close()
            return
        key = connection.origin.key
        self._unsettle(connection)
        if self._hand(key, connection):
            return
        connection.idle_since = asyncio.get_running_loop().time()
        self._idle.setdefault(key, []).append(connection)

    def forget(self, connection: BackendConnection) -> None:
        """A connection that closed: out of the pool. One that was settling was awaited:
        its first waiter opens a connection of its own instead."""
        self._open.discard(connection)
        idle = self._idle.get(connection.origin.key)
        if idle and connection in idle:
            idle.remove(connection)
        if self._unsettle(connection):
            self._hand(connection.origin.key, None)

    def _hand(self, key: str, connection: BackendConnection | None) -> bool:
        """``connection`` (None: connect yourself) to the first post still waiting on
        ``key``; False when none is."""
        waiting = self._waiting.get(key)
        while waiting:
            turn = waiting.popleft()
            if not turn.done():
                turn.set_result(connection)
                return True
        return False

    def _unsettle(self, connection: BackendConnection) -> bool:
        settling = self._settling.get(connection.origin.key)
        if settling and connection in settling:
            settling.remove(connection)
            return True
        return False


def _close_late(settling: list[BackendConnection], now: float) -> None:
    """Settling connections whose answer has not ended by their ``settle_by``: each costs a
    connection, never another wait."""
    for late in [c for c in settling if c.settle_by <= now]:
        late.close()  # leaves ``settling`` (``StreamClient.forget``)


def _handed(turn: asyncio.Future[BackendConnection | None]) -> BackendConnection | None:
    return turn.result() if turn.done() and not turn.cancelled() else None


def _header_lines(headers: Mapping[str, str], length: int) -> bytes:
    lines = [f"Content-Length: {length}\r\n"]
    for name, value in headers.items():
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name or ":" in name:
            raise ValueError(f"header {name!r} cannot be sent: it holds a line break")
        lines.append(f"{name}: {value}\r\n")
    lines.append("\r\n")
    return "".join(lines).encode("latin-1")
