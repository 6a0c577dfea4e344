"""Inference endpoints harnesses call, one per wire protocol, each also under ``/s/{key}``.

``/v1/chat/completions`` and ``/v1/models`` (OpenAI Chat), ``/v1/messages`` and
``/v1/messages/count_tokens`` (Anthropic), ``/v1/responses`` (OpenAI Responses), and
``HEAD /`` (Claude Code's pre-connect check).

Owns: reading the body under the size limit, finding the session key (a key in the
``/s/{key}/`` path wins over ``Authorization: Bearer`` and ``x-api-key``), driving the
adapter hooks around the pipeline, keeping slow streams alive, and turning client
disconnects into cancellation. Errors raised before the first byte get the adapter's status
and envelope; after that they go in-band, so a harness always gets its own protocol's error.

Streaming: the route waits up to ``FIRST_EVENT_WAIT_S`` for the first output event before
sending headers, so errors that come quickly (a backend refusing the prompt) still get a real
HTTP status. If the model is slower, the stream starts and the adapter's ``stream_ping``
frame is sent at once and then whenever ``PING_INTERVAL_S`` pass without an event. A
harness that hangs up cancels a streamed turn at once (``EventStream`` watches the connection
while it waits on the model). An unstreamed turn is abandoned instead: its generation is
aborted, and the turn ends with the backend's last chunk, which holds every token sampled,
so the cancelled turn's record is whole (``ABANDONED_TURN_WAIT_S`` bounds that wait). One
task reads a streamed turn's events ahead (``proxy.routes.event_pump``), and the frames of
everything it buffered go out in one write: no task, waiter or timer per token.

Dispatch: ``TurnRoutes`` is the one table of the turn routes (path, adapter, resolver). The
FastAPI router registers them (OpenAPI, and every request the app does not dispatch
itself), and ``proxy.app`` answers a ``POST`` to one of them straight from the ASGI scope,
before FastAPI's middleware and router: they cost 0.07 ms of CPU per turn and add nothing
a turn uses (``handle_turn`` maps every error itself).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from contextlib import aclosing
from dataclasses import dataclass

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.types import Receive, Scope, Send

from kernel.errors import LegoError, Overloaded, PayloadTooLarge
from proxy.adapters.anthropic_messages import AnthropicMessagesAdapter, count_tokens_response
from proxy.adapters.base import Adapter, StreamState
from proxy.adapters.openai_responses import OpenAIResponsesAdapter
from proxy.canonical import AssistantTurn, ChatRequest, collect
from proxy.openapi import json_body
from proxy.pipeline import PreparedTurn
from proxy.routes.event_pump import EventPump, Events
from proxy.routes.responses_state import resolve_previous_response
from proxy.state import AppState
from recorder.records import SessionInfo

log = logging.getLogger(__name__)

JSON = "application/json"
FIRST_EVENT_WAIT_S = 1.0
PING_INTERVAL_S = 5.0
# How long an unstreamed turn whose harness hung up waits for the backend to end its aborted
# generation (SGLang: at its next step) before it is cancelled where it waits.
ABANDONED_TURN_WAIT_S = 2.0
# How long an unstreamed turn runs before its connection is watched for a hang-up.
WATCH_AFTER_S = 0.05

# Route-layer IO that completes a parsed request (e.g. ``previous_response_id``).
Resolver = Callable[[AppState, SessionInfo, ChatRequest], Awaitable[ChatRequest]]
Frames = AsyncGenerator[bytes, None]
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
SESSION_PREFIX = "/s/"  # ``/s/{key}/...``: the session key in the path


@dataclass(frozen=True, slots=True)
class TurnRoute:
    """A route that runs a harness turn: its protocol's adapter and its route-layer IO."""

    adapter: Adapter
    resolve: Resolver | None = None


class TurnRoutes:
    """The turn routes by path (without the ``/s/{key}`` prefix), found from a request's
    path the way Starlette matches ``{prefix}{path}``: a key is one non-empty segment."""

    def __init__(self, routes: Mapping[str, TurnRoute]) -> None:
        self.by_path = dict(routes)

    def match(self, path: str) -> tuple[TurnRoute, str | None] | None:
        """The route and the path's session key (None without one), or None."""
        route = self.by_path.get(path)
        if route is not None:
            return route, None
        if path.startswith(SESSION_PREFIX):
            key, slash, rest = path[len(SESSION_PREFIX) :].partition("/")
            route = self.by_path.get("/" + rest) if key and slash else None
            if route is not None:
                return route, key
        return None


def turn_routes(
    chat: Adapter, messages: AnthropicMessagesAdapter, responses: OpenAIResponsesAdapter
) -> TurnRoutes:
    return TurnRoutes(
        {
            "/v1/chat/completions": TurnRoute(chat),
            "/v1/messages": TurnRoute(messages),
            "/v1/responses": TurnRoute(responses, resolve_previous_response),
        }
    )


def key_of(path_key: str | None, authorization: str, api_key: str | None) -> str | None:
    """The session key a request names: its ``/s/{key}/`` path, else its bearer token, else
    its ``x-api-key`` (``serve --workers`` routes connections by the same rule)."""
    if path_key:
        return path_key
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return api_key or None


def session_key(request: Request, path_key: str | None) -> str | None:
    headers = request.headers
    return key_of(path_key, headers.get("authorization", ""), headers.get("x-api-key"))


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


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class EventStream(Response):
    """A ``text/event-stream`` response whose frames see the connection: ``frames(gone)``
    gets a future done when the harness hangs up, so a stream waiting on the model stops
    (and cancels its turn) at once rather than at its next frame; Starlette's
    ``StreamingResponse`` watches the same with a task group of its own per stream."""

    media_type = "text/event-stream"

    def __init__(
        self,
        frames: Callable[[asyncio.Future[None]], Frames],
        abandon: Callable[[], Awaitable[None]],
    ) -> None:
        self.status_code = 200
        self.background = None
        self.init_headers(SSE_HEADERS)
        self._frames = frames
        self._abandon = abandon

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gone = asyncio.ensure_future(_wait_disconnect(receive))
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            # aclosing: a send that fails still ends the frames (and so the turn) here.
            async with aclosing(self._frames(gone)) as frames:
                async for frame in frames:
                    await send({"type": "http.response.body", "body": frame, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            gone.cancel()
            # The frames end their turn themselves; this ends one whose frames never
            # started (the response's start failed to send). A no-op after the frames.
            await self._abandon()


def internal_error(exc: BaseException) -> LegoError:
    return LegoError(f"internal error ({type(exc).__name__}); the proxy's log has the details")


def error_reply(adapter: Adapter, error: LegoError) -> Response:
    """The adapter's error shape and status, plus ``Retry-After`` when the caller should wait."""
    status, content = adapter.error_response(error)
    headers = {}
    if isinstance(error, Overloaded):
        headers["retry-after"] = str(max(1, math.ceil(error.retry_after_s)))
    return Response(content, status_code=status, media_type=JSON, headers=headers)


async def handle_turn(
    state: AppState,
    adapter: Adapter,
    request: Request,
    path_key: str | None,
    resolve: Resolver | None = None,
) -> Response:
    metrics = state.metrics
    try:
        body = await read_body(request, state.settings.max_body_bytes)
        session = await state.sessions.active(session_key(request, path_key))
        chat = adapter.parse_request(body)
        for name in chat.ignored_fields:
            metrics.ignored_fields.labels(
                adapter=adapter.name, field=metrics.ignored_field(name)
            ).inc()
        if resolve is not None:
            chat = await resolve(state, session, chat)
        await state.pipeline.admit(session)
        prepared = await state.pipeline.prepare(session, chat)
        events = state.pipeline.run(prepared)
        if chat.stream:
            pump = EventPump(events)
            try:
                await pump.wait(FIRST_EVENT_WAIT_S)
                if pump.ended:
                    pump.finish()  # an early error gets a real HTTP status
            except BaseException:
                await pump.cancel()
                raise
            metrics.child(metrics.requests, adapter=adapter.name, status="200").inc()
            return EventStream(lambda gone: _frames(adapter, prepared, pump, gone), pump.cancel)
        turn = await collect_unless_disconnected(
            request.receive, events, lambda: state.pipeline.abandon(prepared.turn_id)
        )
        if turn is None:
            metrics.child(metrics.requests, adapter=adapter.name, status="499").inc()
            return Response(status_code=499)
        content = adapter.render_response(turn, model=chat.model, created=int(time.time()))
        metrics.child(metrics.requests, adapter=adapter.name, status="200").inc()
        return Response(content, media_type=JSON)
    except LegoError as exc:
        metrics.child(metrics.requests, adapter=adapter.name, status=str(exc.status)).inc()
        return error_reply(adapter, exc)
    except Exception as exc:
        # A bug: the harness still gets its protocol's error, never a bare text 500.
        log.exception("unexpected error in a %s request", adapter.name)
        metrics.child(metrics.requests, adapter=adapter.name, status="500").inc()
        return error_reply(adapter, internal_error(exc))


async def collect_unless_disconnected(
    receive: Receive, events: Events, abandon: Callable[[], bool]
) -> AssistantTurn | None:
    """The turn's answer, or None when the harness hung up first. Then ``abandon`` aborts
    the generation and the turn ends with everything the backend sampled (its record is
    whole), or, when it is not generating or its backend does not end it within
    ``ABANDONED_TURN_WAIT_S``, the turn is cancelled where it waits.

    The turn runs in this task. The connection is watched (a task waiting on ``receive``)
    only once the turn has run ``WATCH_AFTER_S``: most unstreamed turns end sooner, and a
    watcher and its cancellation cost more CPU than the rest of the route's work; a hang-up
    is then noticed at most that much later."""
    task = asyncio.current_task()
    assert task is not None
    hung_up = False
    watcher: asyncio.Task[None] | None = None

    async def watch() -> None:
        nonlocal hung_up
        await _wait_disconnect(receive)
        hung_up = True
        if abandon():
            # Aborted: the turn ends by itself with what was sampled, unless it takes long.
            await asyncio.sleep(ABANDONED_TURN_WAIT_S)
        task.cancel()

    def start_watching() -> None:
        nonlocal watcher
        watcher = asyncio.ensure_future(watch())

    timer = asyncio.get_running_loop().call_later(WATCH_AFTER_S, start_watching)
    try:
        answer = [event async for event in events]
    except asyncio.CancelledError:
        if hung_up and task.uncancel() == 0:
            return None  # the watcher's own cancellation: the harness is gone
        raise
    except LegoError:
        if hung_up:
            # Deliberately swallowed: nobody is left to hear it; the turn is recorded with
            # its error, and the caller counts the request as a 499.
            return None
        raise
    finally:
        timer.cancel()
        if watcher is not None:
            watcher.cancel()
    return None if hung_up else collect(answer)


async def _frames(
    adapter: Adapter, turn: PreparedTurn, pump: EventPump, gone: asyncio.Future[None]
) -> Frames:
    stream = StreamState(
        response_id=turn.turn_id,
        model=turn.request.model,
        created=int(turn.received_at),
        include_usage=turn.request.include_usage,
        prompt_tokens=len(turn.prompt_ids),
    )
    pump.watch(gone)
    # Frames are sent together until the stream has to wait for the model: one write (one
    # TCP segment, one wake-up of the harness) per burst instead of one per frame.
    out: list[bytes] = list(adapter.stream_start(stream))
    try:
        waited = not pump.ready  # the first event is already over FIRST_EVENT_WAIT_S late
        while True:
            while not pump.ready:
                if waited:
                    out.extend(adapter.stream_ping(stream))
                if out:
                    yield b"".join(out)
                    out.clear()
                waited = True
                await pump.wait(PING_INTERVAL_S)
                if gone.done():
                    return  # the harness hung up: ``finally`` cancels the turn
            events = pump.take()
            for event in events:
                out.extend(adapter.stream_event(stream, event))
            if events:
                waited = False
            if pump.ended:
                pump.finish()  # what ended the turn, after every event before it
                break
        out.extend(adapter.stream_end(stream))
    except LegoError as exc:
        out.extend(adapter.stream_error(stream, exc))
    except Exception as exc:
        # A bug mid-stream: end it with the protocol's in-band error, not a cut connection.
        log.exception("unexpected error in a %s stream", adapter.name)
        out.extend(adapter.stream_error(stream, internal_error(exc)))
    finally:
        await pump.cancel()
    yield b"".join(out)


async def answer_turn(
    state: AppState, route: TurnRoute, key: str | None, scope: Scope, receive: Receive, send: Send
) -> None:
    """Run and answer one turn straight from its ASGI scope (``proxy.app``'s dispatch)."""
    response = await handle_turn(state, route.adapter, Request(scope, receive), key, route.resolve)
    await response(scope, receive, send)


def build_router(turns: TurnRoutes, chat: Adapter, messages: AnthropicMessagesAdapter) -> APIRouter:
    router = APIRouter()

    def turn_route(route: TurnRoute) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            state: AppState = request.app.state.lego
            key = request.path_params.get("key")
            return await handle_turn(state, route.adapter, request, key, route.resolve)

        return endpoint

    async def models(request: Request) -> Response:
        state: AppState = request.app.state.lego
        try:
            await state.sessions.active(session_key(request, request.path_params.get("key")))
        except LegoError as exc:
            return error_reply(chat, exc)
        return Response(
            state.models_response([state.served_model_name], int(time.time())),
            media_type=JSON,
        )

    async def count_tokens(request: Request) -> Response:
        state: AppState = request.app.state.lego
        try:
            body = await read_body(request, state.settings.max_body_bytes)
            session = await state.sessions.active(
                session_key(request, request.path_params.get("key"))
            )
            # prepare renders exactly what a turn would send, and records nothing.
            prepared = await state.pipeline.prepare(session, messages.parse_count_request(body))
        except LegoError as exc:
            return error_reply(messages, exc)
        except Exception as exc:
            log.exception("unexpected error in count_tokens")
            return error_reply(messages, internal_error(exc))
        return Response(count_tokens_response(len(prepared.prompt_ids)), media_type=JSON)

    async def preconnect(request: Request) -> Response:
        # Claude Code sends HEAD to its base URL before the first request; it must not fail.
        return Response(status_code=200)

    for prefix in ("", "/s/{key}"):
        for path, route in turns.by_path.items():
            router.add_api_route(
                f"{prefix}{path}",
                turn_route(route),
                methods=["POST"],
                openapi_extra=json_body(route.adapter.request_model),
            )
        router.add_api_route(f"{prefix}/v1/models", models, methods=["GET"])
        router.add_api_route(
            f"{prefix}/v1/messages/count_tokens",
            count_tokens,
            methods=["POST"],
            openapi_extra=json_body(messages.request_model),
        )
        router.add_api_route(f"{prefix}/", preconnect, methods=["HEAD"])
    router.add_api_route("/s/{key}", preconnect, methods=["HEAD"])
    return router
