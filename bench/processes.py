"""Helpers the benchmarks share: the engine and proxy command lines, start a server process
and wait for it, and percentiles."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx


def zero_compute_engine(model: Path, port: int) -> list[str]:
    """The local engine answering without a forward pass, so the proxy is what is timed."""
    return [sys.executable, "-m", "engine", "--model", str(model), "--port", str(port),
            "--zero-compute"]  # fmt: skip


PROXY = [sys.executable, "-m", "proxy.cli", "serve", "--log-level", "warning"]


def start(cmd: list[str], env: dict[str, str], url: str, log: Path) -> subprocess.Popen[bytes]:
    """Run ``cmd`` with its output in ``log``; return once ``url`` answers 200."""
    with log.open("wb") as sink:
        process = subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{cmd[:5]} exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            pass  # not listening yet
        time.sleep(0.2)
    process.kill()
    raise SystemExit(f"{cmd[:5]} did not start")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")
