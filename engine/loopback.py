"""The local engine served in this process, on a free loopback port, for as long as needed.

Contract: ``running_engine(config)`` serves ``create_engine_app(config)`` (its host and port
replaced by 127.0.0.1 and a free port) on a real uvicorn server in a thread, waits until
``/health`` answers, yields the base URL, and shuts the server down on exit. Tests and
benchmarks use it where a child process would only cost start-up time.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import httpx

from engine.config import EngineConfig
from engine.server import create_engine_app
from kernel.threaded import free_port, serve


@contextmanager
def running_engine(config: EngineConfig) -> Iterator[str]:
    port = free_port()
    config = replace(config, host="127.0.0.1", port=port)
    with serve(create_engine_app(config), port=port) as base_url:
        httpx.get(f"{base_url}/health", timeout=5).raise_for_status()
        yield base_url
