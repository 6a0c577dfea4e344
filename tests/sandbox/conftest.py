"""Fixtures of the sandbox suite: a bwrap backend in a scratch runtime directory, a task-like
workspace owned by the sandbox user, and real HTTP servers on 127.0.0.1 (one stands for the
proxy, another for a host service the sandbox must not reach)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from sandbox.bwrap import Bwrap
from sandbox.spec import Workspace

UID = 1000


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive

    def do_GET(self) -> None:
        if self.path.startswith("/stream"):
            self._stream()
            return
        body = f"served by {self.server.server_port} {self.path}\n".encode()  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _stream(self) -> None:
        """Server-sent events: one event per chunk, flushed as it is written."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for index in range(5):
            event = f"data: event {index}\n\n".encode()
            self.wfile.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, format: str, *args: object) -> None:
        del format, args


@pytest.fixture
def http_server() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def other_server() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def runtime_dir(tmp_path: Path) -> Path:
    return tmp_path / "runtime"


@pytest.fixture
def bwrap(runtime_dir: Path) -> Bwrap:
    return Bwrap(runtime_dir=runtime_dir)


def give_to_sandbox_user(path: Path) -> None:
    if os.geteuid() == 0:
        for root, dirs, files in os.walk(path):
            for name in (".", *dirs, *files):
                os.lchown(os.path.join(root, name), UID, UID)


@pytest.fixture
def workspace(tmp_path: Path) -> Workspace:
    lower = tmp_path / "image" / "repo"
    lower.mkdir(parents=True)
    (lower / "module.py").write_text("VALUE = 1\n")
    (lower / "tests").mkdir()
    (lower / "tests" / "test_module.py").write_text("def test(): pass\n")
    give_to_sandbox_user(lower)
    return Workspace(lower=lower, upper=tmp_path / "upper", work=tmp_path / "work")
