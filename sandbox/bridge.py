"""The host end of a sandbox's proxy-only network: a Unix socket that reaches the proxy.

``ProxyBridge(path, route)`` listens on the Unix socket ``path`` (in the sandbox's own
scratch directory, the only host socket bound into it) and relays every connection to
``route.host:route.port`` and nowhere else: what the sandbox sends picks no destination.
Each connection gets its own relay threads (``sandbox.inside.relay``), so concurrent
requests, streamed answers and keep-alive connections pass as they are. The threads are
daemons of the runner: they end with it, whatever kills it. ``close()`` stops accepting,
cuts the open connections and removes the socket.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from pathlib import Path
from types import TracebackType

from kernel.errors import SandboxError
from sandbox.inside import relay
from sandbox.spec import ProxyRoute

CONNECT_TIMEOUT_S = 10.0


class ProxyBridge:
    def __init__(self, path: Path, route: ProxyRoute, *, owner: tuple[int, int] | None) -> None:
        self._route = route
        self._path = path
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._listener.bind(str(path))
            if owner is not None:
                os.chown(path, *owner)
            os.chmod(path, 0o600)
            self._listener.listen(256)
        except OSError as exc:
            self._listener.close()
            raise SandboxError(f"cannot listen on the proxy bridge {path}: {exc}") from exc
        self._thread = threading.Thread(target=self._accept, name=f"bridge {path}", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed by close()
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(
                (self._route.host, self._route.port), timeout=CONNECT_TIMEOUT_S
            )
        except OSError:
            # The proxy is down: the harness sees its connection refused, as it would
            # talking to the proxy directly.
            client.close()
            return
        upstream.settimeout(None)
        with self._lock:
            self._open.update((client, upstream))
        try:
            relay(client, upstream)
        finally:
            with self._lock:
                self._open.difference_update((client, upstream))

    def close(self) -> None:
        with contextlib.suppress(OSError):  # it only wakes accept(); nothing to fail
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._thread.join()
        with self._lock:
            still_open = list(self._open)
        for end in still_open:
            with contextlib.suppress(OSError):  # closed meanwhile by its own relay
                end.shutdown(socket.SHUT_RDWR)
        self._path.unlink(missing_ok=True)

    def __enter__(self) -> ProxyBridge:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
