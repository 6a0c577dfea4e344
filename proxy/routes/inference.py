"""Inference endpoints harnesses call: ``/v1/chat/completions`` and ``/v1/models``.

Owns: reading the body under the size limit, finding the session key (a key in the
``/s/{key}/`` path wins over ``Authorization: Bearer`` and ``x-api-key``), driving the
adapter hooks around the pipeline, and turning client disconnects into cancellation.
Errors raised before the first byte get the adapter's status and envelope; after that they
go in-band, so a harness always gets its own protocol's error.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from proxy.adapters.base import Adapter, StreamState
from proxy.canonical import AssistantTurn, OutputEvent, collect
from proxy.errors import LegoError, PayloadTooLarge
from proxy.pipeline import PreparedTurn
from proxy.state import AppState

JSON = "application/json"


def session_key(request: Request, path_key: str | None) -> str | None:
    if path_key:
        return path_key
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return request.headers.get("x-api-key") or None


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"the request body is {declared} bytes; the limit is {limit}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"the request body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def handle_turn(
    state: AppState, adapter: Adapter, request: Request, path_key: str | None
) -> Response:
    metrics = state.metrics
    try:
        body = await read_body(request, state.settings.max_body_bytes)
        session = await state.sessions.active(session_key(request, path_key))
        chat = adapter.parse_request(body)
        for name in chat.ignored_fields:
            metrics.ignored_fields.labels(adapter=adapter.name, field=name).inc()
        prepared = await state.pipeline.prepare(session, chat)
        events = state.pipeline.run(prepared)
        if chat.stream:
            try:
                first = await anext(events)
            except BaseException:
                await events.aclose()
                raise
            metrics.requests.labels(adapter=adapter.name, status="200").inc()
            return StreamingResponse(
                _frames(adapter, prepared, first, events),
                media_type="text/event-stream",
                headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
            )
        turn = await _collect_unless_disconnected(request, events)
        if turn is None:
            metrics.requests.labels(adapter=adapter.name, status="499").inc()
            return Response(status_code=499)
        content = adapter.render_response(turn, model=chat.model, created=int(time.time()))
        metrics.requests.labels(adapter=adapter.name, status="200").inc()
        return Response(content, media_type=JSON)
    except LegoError as exc:
        status, content = adapter.error_response(exc)
        metrics.requests.labels(adapter=adapter.name, status=str(status)).inc()
        return Response(content, status_code=status, media_type=JSON)


async def _collect_unless_disconnected(
    request: Request, events: AsyncGenerator[OutputEvent, None]
) -> AssistantTurn | None:
    async def gather() -> list[OutputEvent]:
        return [event async for event in events]

    work = asyncio.ensure_future(gather())
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        done, _ = await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if work in done:
        return collect(work.result())
    # The harness hung up: cancelling the pipeline aborts the backend and records the turn.
    work.cancel()
    await asyncio.gather(work, return_exceptions=True)
    return None


async def _frames(
    adapter: Adapter,
    turn: PreparedTurn,
    first: OutputEvent,
    events: AsyncGenerator[OutputEvent, None],
) -> AsyncGenerator[bytes, None]:
    stream = StreamState(
        response_id=turn.turn_id,
        model=turn.request.model,
        created=int(turn.received_at),
        include_usage=turn.request.include_usage,
    )
    try:
        for frame in adapter.stream_start(stream):
            yield frame
        for frame in adapter.stream_event(stream, first):
            yield frame
        async for event in events:
            for frame in adapter.stream_event(stream, event):
                yield frame
        for frame in adapter.stream_end(stream):
            yield frame
    except LegoError as exc:
        for frame in adapter.stream_error(stream, exc):
            yield frame
    finally:
        await events.aclose()


def build_router(chat: Adapter) -> APIRouter:
    router = APIRouter()

    async def chat_completions(request: Request) -> Response:
        state: AppState = request.app.state.lego
        return await handle_turn(state, chat, request, request.path_params.get("key"))

    async def models(request: Request) -> Response:
        state: AppState = request.app.state.lego
        try:
            await state.sessions.active(session_key(request, request.path_params.get("key")))
        except LegoError as exc:
            status, content = chat.error_response(exc)
            return Response(content, status_code=status, media_type=JSON)
        return Response(
            state.models_response([state.served_model_name], int(time.time())),
            media_type=JSON,
        )

    for prefix in ("", "/s/{key}"):
        router.add_api_route(f"{prefix}/v1/chat/completions", chat_completions, methods=["POST"])
        router.add_api_route(f"{prefix}/v1/models", models, methods=["GET"])
    return router
