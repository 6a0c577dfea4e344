"""bench.gc_pauses' fill: no turn it times waits for a client to be made."""

from __future__ import annotations

import subprocess
from typing import Any, cast

import httpx
import pytest
from fastapi import FastAPI

from bench.gc_pauses import fill
from bench.overhead import Proxy
from kernel.threaded import serve


def _chat_app() -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def answer() -> dict[str, object]:
        return {"choices": [{"message": {"role": "assistant", "content": "OK."}}]}

    return app


async def test_every_client_is_made_before_the_first_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Making an ``httpx.AsyncClient`` (its TLS context) took 35 ms on the development
    machine; made inside the fill, the turns already sent waited for the others and were
    the fill's p99.9 and max."""
    events: list[str] = []
    made = httpx.AsyncClient.__init__
    post = httpx.AsyncClient.post

    def making(self: httpx.AsyncClient, *args: Any, **kwargs: Any) -> None:
        events.append("made")
        made(self, *args, **kwargs)

    async def posting(self: httpx.AsyncClient, *args: Any, **kwargs: Any) -> httpx.Response:
        events.append("turn")
        return await post(self, *args, **kwargs)

    monkeypatch.setattr(httpx.AsyncClient, "__init__", making)
    monkeypatch.setattr(httpx.AsyncClient, "post", posting)
    with serve(_chat_app()) as url:
        proxy = Proxy("scripted", url, "run", cast("subprocess.Popen[bytes]", None))
        latencies = await fill(proxy, [f"key{i}" for i in range(6)], turns=2, concurrency=3)
    assert len(latencies) == 12
    assert events == ["made"] * 3 + ["turn"] * 12
