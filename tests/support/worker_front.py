"""A stand-in worker in front of a real engine: forwards everything, logs each call, and
fails one route on demand (``worker_front``), for the weight-sync tests' failing workers.

``worker_front(upstream, refuse=path, refusal=body)`` answers ``path`` with 400 and
``refusal`` without forwarding it (a bad checkpoint, a full disk, a worker that cannot join
a group), and passes every other request through to ``upstream`` unchanged. The paths it
was called with are in ``app.state.calls``, in order.
"""

from __future__ import annotations

import json

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

REFUSAL = {"success": False, "message": "cannot load weights"}


def worker_front(
    upstream: str, *, refuse: str | None = None, refusal: dict[str, object] | None = None
) -> Starlette:
    client = httpx.AsyncClient(base_url=upstream, timeout=60)
    calls: list[str] = []
    answer = json.dumps(REFUSAL if refusal is None else refusal)

    async def forward(request: Request) -> Response:
        calls.append(request.url.path)
        if request.url.path == refuse:
            return Response(answer, status_code=400, media_type="application/json")
        upstream_response = await client.request(
            request.method, request.url.path, content=await request.body(),
            headers={"content-type": "application/json"},
        )  # fmt: skip
        return Response(
            upstream_response.content,
            status_code=upstream_response.status_code,
            media_type=upstream_response.headers.get("content-type"),
        )

    app = Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST"])])
    app.state.calls = calls
    return app
