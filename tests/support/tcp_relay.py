"""A loopback TCP relay that counts the connections opened through it.

Sits between a client and a server (``TcpRelay(upstream_port)`` as a context manager; its
``url`` is what the client dials) and copies bytes both ways without looking at them, so a
test can see how many TCP connections a client opened for a run of requests: keep-alive
reuse shows as one connection for many requests.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType


class TcpRelay:
    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self._upstream = (upstream_host, upstream_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._lock = threading.Lock()
        self._accepted = 0
        self._threads: list[threading.Thread] = []
        self._closing = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    @property
    def accepted(self) -> int:
        with self._lock:
            return self._accepted

    def __enter__(self) -> TcpRelay:
        self._start(self._accept_loop)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._closing = True
        self._listener.close()

    def _start(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        thread.start()
        self._threads.append(thread)

    def _accept_loop(self) -> None:
        while not self._closing:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._accepted += 1
            upstream = socket.create_connection(self._upstream)
            self._start(self._pipe, client, upstream)
            self._start(self._pipe, upstream, client)

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
