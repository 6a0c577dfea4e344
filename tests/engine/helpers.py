"""Small HTTP helpers shared by the engine's server tests."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt

from engine.config import EngineConfig


def generate(url: str, body: dict[str, Any], timeout: float = 60) -> dict[str, Any]:
    response = httpx.post(f"{url}/generate", json=body, timeout=timeout)
    response.raise_for_status()
    result: dict[str, Any] = response.json()
    return result


def stream_chunks(url: str, body: dict[str, Any], timeout: float = 60) -> list[dict[str, Any]]:
    """POST a streaming /generate; return the JSON chunks (asserting the [DONE] trailer)."""
    chunks: list[dict[str, Any]] = []
    done = False
    with httpx.stream(
        "POST", f"{url}/generate", json={**body, "stream": True}, timeout=timeout
    ) as r:
        r.raise_for_status()
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if not line:
                continue
            assert line.startswith("data: ")
            if line == "data: [DONE]":
                done = True
            else:
                assert not done
                chunks.append(json.loads(line[len("data: ") :]))
    assert done
    return chunks


def decode_routing(meta: dict[str, Any], layers: int = 4, top_k: int = 2) -> npt.NDArray[np.int32]:
    raw = base64.b64decode(meta["routed_experts"])
    return np.frombuffer(raw, dtype="<i4").reshape(-1, layers, top_k)


def engine_config(model_path: Path, **overrides: Any) -> EngineConfig:
    """An engine launched as the tests need it: routed experts on, seeds honoured (both
    off by default, as in SGLang)."""
    flags: dict[str, Any] = {
        "enable_return_routed_experts": True,
        "enable_deterministic_inference": True,
    }
    return EngineConfig(model_path=model_path, **{**flags, **overrides})
