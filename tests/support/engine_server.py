"""Reusable test support: the tiny model directory and a real engine on loopback.

- ``tiny_model_dir``: a session-scoped pytest fixture; the tiny model is built once per
  test session under pytest's base temp dir, whichever conftest imports the fixture
  (``from tests.support.engine_server import tiny_model_dir as tiny_model_dir``).
- ``running_engine(config)``: starts ``create_engine_app(config)`` under uvicorn in a
  thread on a free 127.0.0.1 port, waits until it serves, yields its base URL and shuts it
  down on exit.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from engine.config import EngineConfig
from engine.server import create_engine_app
from engine.tiny import MODEL_NAME, ensure_tiny_model
from proxy.threaded import free_port, serve


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_tiny_model(tmp_path_factory.getbasetemp() / "models" / MODEL_NAME)


@contextmanager
def running_engine(config: EngineConfig) -> Iterator[str]:
    """Serve ``config`` (its host/port are replaced) on loopback; yield the base URL."""
    port = free_port()
    config = replace(config, host="127.0.0.1", port=port)
    with serve(create_engine_app(config), port=port) as base_url:
        httpx.get(f"{base_url}/health", timeout=5).raise_for_status()
        yield base_url
