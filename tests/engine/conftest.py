"""Engine test fixtures: the shared tiny model and a default engine on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from engine.loopback import running_engine
from tests.engine.helpers import engine_config


@pytest.fixture(scope="session")
def tok(tiny_model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


@pytest.fixture(scope="session")
def engine_url(tiny_model_dir: Path) -> Iterator[str]:
    with running_engine(engine_config(tiny_model_dir)) as url:
        yield url
