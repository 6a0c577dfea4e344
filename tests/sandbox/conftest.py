"""Fixtures of the sandbox suite: a bwrap backend in a scratch runtime directory, a task-like
workspace owned by the sandbox user, and real HTTP servers on 127.0.0.1 (one stands for the
proxy, another for a host service the sandbox must not reach)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from sandbox.bwrap import Bwrap
from sandbox.spec import Workspace
from tests.sandbox.servers import serve, stop

UID = 1000


@pytest.fixture
def http_server() -> Iterator[ThreadingHTTPServer]:
    server = serve()
    yield server
    stop(server)


@pytest.fixture
def other_server() -> Iterator[ThreadingHTTPServer]:
    server = serve()
    yield server
    stop(server)


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
