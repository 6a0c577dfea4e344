"""The tiny model directory as a session-scoped pytest fixture.

``tiny_model_dir`` is built once per test session under pytest's base temp dir, whichever
conftest imports the fixture (``from tests.support.engine_server import tiny_model_dir as
tiny_model_dir``). A real engine on loopback is ``engine.loopback.running_engine``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.tiny import ensure_tiny_model
from kernel.paths import TINY_MODEL_NAME


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_tiny_model(tmp_path_factory.getbasetemp() / "models" / TINY_MODEL_NAME)
