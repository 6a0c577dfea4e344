"""A server command in a child process, started and waited for until its URL answers.

Contract: ``start_server(cmd, env, url, log)`` runs ``cmd`` with its output in ``log`` and
returns the process once ``GET url`` answers 200; a child that exits first, or does not
answer within ``timeout_s``, is killed and ``ServerDidNotStart`` carries the tail of its log.
``python_module(name, *args)`` is the command line that runs ``python -m name`` with the
interpreter of this process. The benchmarks start engines and proxies this way.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx

from kernel.errors import LegoError


class ServerDidNotStart(LegoError):
    """A child server exited or never answered its health URL."""


def python_module(name: str, *args: str) -> list[str]:
    return [sys.executable, "-m", name, *args]


def start_server(
    cmd: list[str],
    env: dict[str, str],
    url: str,
    log: Path,
    *,
    timeout_s: float = 240.0,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    with log.open("wb") as sink:
        process = subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT, cwd=cwd)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServerDidNotStart(f"{cmd[:5]} exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            pass  # not listening yet
        time.sleep(0.2)
    process.kill()
    process.wait()
    raise ServerDidNotStart(f"{cmd[:5]} did not answer {url} in {timeout_s} s")
