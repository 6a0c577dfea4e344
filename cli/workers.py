"""``lego-proxy serve --workers N``: one port, N proxy processes, each session kept on one.

The parent process holds the listening socket and none of the proxy: it accepts each
connection, peeks (``MSG_PEEK``: nothing is consumed) at the head of its first request,
takes the session key from it as the proxy's routes do (a ``/s/<key>/`` path, then
``Authorization: Bearer``, then ``x-api-key``; with none, the client's address), and hands
the connection's file descriptor to the worker that key hashes to, over a Unix socket
(``SCM_RIGHTS``). From then on the worker serves the connection as if it had accepted it;
its bytes never pass through the parent, so a turn costs no extra hop.

Affinity is per connection, decided by its first request. A harness keeps its connections
to one session, so every turn of a session reaches the worker that holds its ledger. A
client that sends several sessions over one keep-alive connection is still served
correctly, only slower: any worker can serve any turn, rebuilding the ledger from the
database (``proxy.pipeline``), as replicas do (docs/design.md, Scale-out).

Each worker is a replica: its own spool and journal (``recorder.disks``: ``<port>.w<i>``),
the shared database and backend. Every response names its worker in ``x-lego-worker``.
A worker that dies is started again (its journal is replayed by the next start); until it
is back and ready, the connections it would get go to the next live worker. SIGTERM or
SIGINT stops accepting, passes the signal on and waits for each worker's graceful shutdown.

Contract: ``worker_for(key, n)`` is the stable worker index of a session key;
``session_key_of(head)`` the key in a request head (or None); ``run_front(...)`` runs the
parent until it is told to stop; ``run_worker(...)`` runs one worker on its channel.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import uvicorn

from kernel.errors import ConfigurationError
from proxy.routes.inference import key_of

log = logging.getLogger("lego_proxy.workers")

HEAD_LIMIT = 16 * 1024  # bytes of a request head the parent looks at
HEAD_WAIT_S = 10.0  # no complete head by then: routed by what came, else by address
READY = b"R"  # a worker's first message on its channel: it serves from now on
START_TIMEOUT_S = 300.0
WORKER_HEADER = "x-lego-worker"


def worker_for(key: str, workers: int) -> int:
    digest = hashlib.blake2b(key.encode("utf-8", "surrogateescape"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % workers


def session_key_of(head: bytes) -> str | None:
    """The session key a request head names, by the routes' rule (``proxy.routes.inference``)."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    path_key = None
    if len(parts) >= 2 and parts[1].startswith(b"/s/"):
        path_key = parts[1][3:].split(b"/", 1)[0].split(b"?", 1)[0].decode("latin-1")
    headers: dict[bytes, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        # The first of a repeated header, as Starlette's ``headers.get`` reads it.
        headers.setdefault(name.strip().lower(), value.strip().decode("latin-1"))
    return key_of(path_key, headers.get(b"authorization", ""), headers.get(b"x-api-key"))


def _wake(ready: asyncio.Future[None]) -> None:
    if not ready.done():  # a reader callback fires until it is removed
        ready.set_result(None)


async def _readable(loop: asyncio.AbstractEventLoop, conn: socket.socket, deadline: float) -> bool:
    ready: asyncio.Future[None] = loop.create_future()
    loop.add_reader(conn.fileno(), _wake, ready)
    try:
        await asyncio.wait_for(ready, max(0.0, deadline - loop.time()))
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(conn.fileno())
    return True


async def _peek_head(loop: asyncio.AbstractEventLoop, conn: socket.socket) -> bytes | None:
    """The first request's head as far as it has come (left unread for the worker), or
    None when the client closed before sending anything."""
    deadline = loop.time() + HEAD_WAIT_S
    head = b""
    while await _readable(loop, conn, deadline):
        try:
            head = conn.recv(HEAD_LIMIT, socket.MSG_PEEK)
        except BlockingIOError:
            continue
        except OSError:
            return None  # reset by the client
        if not head:
            return None
        if b"\r\n\r\n" in head or len(head) >= HEAD_LIMIT or loop.time() >= deadline:
            return head
        await asyncio.sleep(0.002)  # a head split over packets: the rest is on its way
    return head


@dataclass
class _Worker:
    index: int
    command: list[str]
    process: subprocess.Popen[bytes] | None = None
    channel: socket.socket | None = None
    env: dict[str, str] = field(default_factory=dict)
    ready: bool = False  # it said READY: connections handed to it are served at once

    def start(self) -> None:
        self.ready = False
        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        command = [*self.command, "--worker-channel", f"{child_end.fileno()}:{self.index}"]
        self.process = subprocess.Popen(
            command,
            env=self.env,
            pass_fds=[child_end.fileno()],
            # Its own process group: a terminal's Ctrl-C reaches the parent alone, which
            # passes it on once (a second SIGINT would make uvicorn skip its graceful stop).
            process_group=0,
        )
        child_end.close()
        self.channel = parent_end

    def wait_ready(self, timeout_s: float) -> None:
        if self.channel is None or self.process is None:
            raise ConfigurationError(f"worker {self.index} was never started")
        self.channel.settimeout(timeout_s)
        try:
            message = self.channel.recv(16)
        except TimeoutError:
            message = b""
        if message != READY:
            code = self.process.poll()
            raise ConfigurationError(
                f"worker {self.index} did not start"
                + (f" (it exited {code}; its log is above)" if code is not None else "")
            )
        self.channel.setblocking(False)
        self.ready = True

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def hand(self, conn: socket.socket) -> bool:
        if self.channel is None or not self.ready or not self.alive():
            return False
        try:
            socket.send_fds(self.channel, [b"c"], [conn.fileno()])
        except OSError:
            return False
        return True


class Front:
    """The parent: workers started and kept alive, connections accepted and handed on."""

    def __init__(
        self, listener: socket.socket, command: Sequence[str], workers: int, env: dict[str, str]
    ) -> None:
        self._listener = listener
        self._workers = [_Worker(i, list(command), env=env) for i in range(workers)]
        self._stopping = False
        self._serving: asyncio.Task[None] | None = None
        self._handing: set[asyncio.Task[None]] = set()  # connections being handed on

    def start(self) -> None:
        """Start every worker and wait until each serves; on a failure stop them all."""
        try:
            for worker in self._workers:
                worker.start()
            for worker in self._workers:
                worker.wait_ready(START_TIMEOUT_S)
        except ConfigurationError:
            self._stopping = True
            for worker in self._workers:
                if worker.alive() and worker.process is not None:
                    worker.process.terminate()
            self._wait_workers()
            raise

    def route(self, head: bytes, peer: str) -> int:
        return worker_for(session_key_of(head) or peer, len(self._workers))

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        self._serving = asyncio.current_task()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._stop, signum)
        self._listener.setblocking(False)
        self._listener.listen(2048)
        supervisor = loop.create_task(self._supervise())
        try:
            while not self._stopping:
                try:
                    conn, address = await loop.sock_accept(self._listener)
                except OSError as exc:
                    if self._stopping:
                        break
                    log.warning("accept failed: %s", exc)
                    await asyncio.sleep(0.05)
                    continue
                task = loop.create_task(self._hand_on(loop, conn, str(address[0])))
                self._handing.add(task)
                task.add_done_callback(self._handing.discard)
        except asyncio.CancelledError:
            pass
        finally:
            supervisor.cancel()
            self._listener.close()
            await asyncio.to_thread(self._wait_workers)

    async def _hand_on(
        self, loop: asyncio.AbstractEventLoop, conn: socket.socket, peer: str
    ) -> None:
        conn.setblocking(False)
        try:
            head = await _peek_head(loop, conn)
            if head is None:
                return
            first = self.route(head, peer)
            count = len(self._workers)
            for step in range(count):
                if self._workers[(first + step) % count].hand(conn):
                    return
            log.error("no worker is alive to take a connection")
        finally:
            conn.close()  # the worker holds its own copy of the descriptor

    async def _supervise(self) -> None:
        while not self._stopping:
            await asyncio.sleep(0.5)
            for worker in self._workers:
                if worker.alive() or self._stopping:
                    continue
                code = worker.process.returncode if worker.process else None
                log.error("worker %d exited (%s); starting it again", worker.index, code)
                if worker.channel is not None:
                    worker.channel.close()
                worker.start()
                try:
                    await asyncio.to_thread(worker.wait_ready, START_TIMEOUT_S)
                except ConfigurationError as exc:
                    log.error("%s", exc.message)

    def _stop(self, signum: int) -> None:
        if self._stopping:
            return
        self._stopping = True
        for worker in self._workers:
            if worker.alive() and worker.process is not None:
                worker.process.send_signal(signum)
        if self._serving is not None:
            self._serving.cancel()

    def _wait_workers(self) -> None:
        for worker in self._workers:
            if worker.process is None:
                continue
            try:
                worker.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    return listener


def run_front(
    host: str, port: int, command: Sequence[str], workers: int, env: dict[str, str]
) -> None:
    """Bind, start ``workers`` copies of ``command``, then accept until SIGTERM/SIGINT."""
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("lego-proxy: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    listener = bind(host, port)
    front = Front(listener, command, workers, env)
    front.start()
    print(
        f"lego-proxy: {workers} workers serving http://{host}:{port} "
        "(each session kept on one worker)",
        file=sys.stderr,
        flush=True,
    )
    asyncio.run(front.serve())


class _HandedServer(uvicorn.Server):
    """A uvicorn server with no listener of its own: it serves connections handed to it."""

    def __init__(self, config: uvicorn.Config, channel: socket.socket) -> None:
        super().__init__(config)
        self._channel = channel
        self._receiver: asyncio.Task[None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=[])
        if self.should_exit:
            return
        self._receiver = asyncio.get_running_loop().create_task(self._receive())
        self._channel.send(READY)

    def _protocol(self) -> asyncio.Protocol:
        protocol: asyncio.Protocol = self.config.http_protocol_class(  # type: ignore[call-arg]
            config=self.config, server_state=self.server_state, app_state=self.lifespan.state
        )
        return protocol

    async def _receive(self) -> None:
        loop = asyncio.get_running_loop()
        self._channel.setblocking(False)
        while not self.should_exit:
            try:
                message, fds, _, _ = socket.recv_fds(self._channel, 16, 4)
            except BlockingIOError:
                readable: asyncio.Future[None] = loop.create_future()
                loop.add_reader(self._channel.fileno(), _wake, readable)
                try:
                    await readable
                finally:
                    loop.remove_reader(self._channel.fileno())
                continue
            if not message:  # the parent is gone: stop as on SIGTERM
                self.should_exit = True
                return
            for fd in fds:
                conn = socket.socket(fileno=fd)
                try:
                    await loop.connect_accepted_socket(self._protocol, conn)
                except OSError as exc:  # the client left before the worker took it
                    log.debug("handed connection closed early: %s", exc)
                    conn.close()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self._receiver is not None:
            self._receiver.cancel()
        await super().shutdown(sockets=sockets)


def run_worker(config: uvicorn.Config, channel_fd: int, index: int) -> None:
    """Serve connections handed over ``channel_fd`` until SIGTERM or the parent leaves."""
    channel = socket.socket(fileno=channel_fd)
    config.headers = [*config.headers, (WORKER_HEADER, str(index))]
    server = _HandedServer(config, channel)
    server.run()
    if not server.started:
        raise SystemExit(3)  # uvicorn's start-up failure
