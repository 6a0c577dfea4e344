"""Fixtures for the output-parser tests: the project's real tiny tokenizer, built once."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from engine.tiny import build_tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    path = Path(tmp_path_factory.mktemp("parsing-tokenizer"))
    build_tokenizer(path)
    return AutoTokenizer.from_pretrained(str(path))
