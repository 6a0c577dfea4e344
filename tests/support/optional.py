"""Test inputs fetched from registries (real tokenizers, SGLang's parsers): skip without
them, with the reason, except under CI, where every suite must run (``CI`` set)."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI must run these tests)")
    pytest.skip(reason)
