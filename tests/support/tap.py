"""A recording pass-through between the proxy and the engine: the tests' view of the wire.

It forwards every request to the real engine and keeps what crossed it (the ``/generate``
bodies, every streamed chunk, ``/abort_request`` calls), so tests can compare what the proxy
recorded with what the backend actually received and returned. It can also fail on
purpose, once, the way a backend fails: an HTTP error status, or a connection dropped after
some chunks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route


class InjectedFailure(Exception):
    """Raised inside the streamed body: uvicorn drops the connection mid-response."""


@dataclass
class Exchange:
    body: dict[str, Any]
    chunks: list[dict[str, Any]] = field(default_factory=list)

    @property
    def final(self) -> dict[str, Any]:
        return self.chunks[-1]


@dataclass
class BackendTap:
    upstream: str
    url: str = ""  # where the tap itself is served, set by whoever serves it
    generates: list[Exchange] = field(default_factory=list)
    aborts: list[dict[str, Any]] = field(default_factory=list)
    fail_status_once: int | None = None
    drop_after_chunks_once: int | None = None
    # True: aborts are recorded but not passed on, as a worker that never ends the request.
    swallow_aborts: bool = False
    # False: answer /server_info with 404, as a server whose configuration cannot be read,
    # so the proxy sends what only the server itself can refuse.
    server_info: bool = True

    def reset(self) -> None:
        self.generates.clear()
        self.aborts.clear()

    def app(self) -> Starlette:
        client = httpx.AsyncClient(base_url=self.upstream, timeout=120)

        async def generate(request: Request) -> Response:
            body = orjson.loads(await request.body())
            exchange = Exchange(body)
            self.generates.append(exchange)
            if self.fail_status_once is not None:
                status, self.fail_status_once = self.fail_status_once, None
                return Response(
                    orjson.dumps({"error": {"message": "injected backend failure"}}),
                    status_code=status,
                    media_type="application/json",
                )
            drop_after, self.drop_after_chunks_once = self.drop_after_chunks_once, None
            upstream = await client.send(
                client.build_request(
                    "POST",
                    "/generate",
                    content=orjson.dumps(body),
                    headers={"content-type": "application/json"},
                ),
                stream=True,
            )

            async def relay() -> AsyncIterator[bytes]:
                try:
                    async for line in upstream.aiter_lines():
                        if not line.startswith("data:"):
                            continue
                        payload = line[5:].strip()
                        if payload != "[DONE]":
                            if drop_after is not None and len(exchange.chunks) >= drop_after:
                                raise InjectedFailure("dropping the connection on purpose")
                            exchange.chunks.append(orjson.loads(payload))
                        yield f"data: {payload}\n\n".encode()
                finally:
                    await upstream.aclose()

            return StreamingResponse(relay(), media_type="text/event-stream")

        async def abort(request: Request) -> Response:
            body = orjson.loads(await request.body())
            self.aborts.append(body)
            if self.swallow_aborts:
                return Response(status_code=200)
            upstream = await client.post("/abort_request", json=body)
            return Response(upstream.content, status_code=upstream.status_code)

        async def forward_get(request: Request) -> Response:
            if request.url.path.endswith("server_info") and not self.server_info:
                return Response(status_code=404)
            upstream = await client.get(request.url.path)
            return Response(
                upstream.content,
                status_code=upstream.status_code,
                media_type=upstream.headers.get("content-type"),
            )

        return Starlette(
            routes=[
                Route("/generate", generate, methods=["POST"]),
                Route("/abort_request", abort, methods=["POST"]),
                Route("/health", forward_get, methods=["GET"]),
                Route("/model_info", forward_get, methods=["GET"]),
                Route("/server_info", forward_get, methods=["GET"]),
                Route("/get_server_info", forward_get, methods=["GET"]),
            ]
        )
