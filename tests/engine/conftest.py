"""Engine test fixtures: the shared tiny model and a default engine on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.config import EngineConfig
from engine.loopback import running_engine


@pytest.fixture(scope="session")
def engine_url(tiny_model_dir: Path) -> Iterator[str]:
    with running_engine(EngineConfig(model_path=tiny_model_dir)) as url:
        yield url
