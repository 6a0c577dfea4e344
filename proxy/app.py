"""``create_app(settings)``: the one place the proxy's lifecycles live.

Start-up, in order: the embedded engine (only when no backend URL is set), the pooled HTTP
client, the backend's topology and every worker's ``/server_info`` (the proxy refuses to
start, with one line naming the worker and the flag, when it would record without routed
experts it expects; limits are tightened to what the workers accept), the tokenizer whose
chat template renders prompts (checked, and its tool-call format decided, by
``proxy.served_template``), the database (brought to the current schema under a lock),
the turn writer, then the routes; what start-up built, and later what outlives a full
pass of the cyclic collector, is then frozen out of its sight while the app serves
(``kernel.heap``). Shutdown reverses it and
flushes every pending turn. Nothing happens at import time and nothing is global: two apps
in one process share nothing but the process's garbage collector.

``ProxyApp`` is FastAPI with one difference: a ``POST`` to a turn route
(``proxy.routes.inference.TurnRoutes``) is answered straight from the ASGI scope, before
FastAPI's middleware and router; everything else (and a request under a ``root_path``)
goes through FastAPI as before.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException
from starlette.routing import Match
from starlette.types import Receive, Scope, Send

from kernel.errors import BackendMisconfigured, LegoError, MethodNotAllowed, NotFound
from kernel.heap import FullCollections, long_lived_frozen, reclaim_if_due
from kernel.paths import default_model_dir
from proxy.adapters.anthropic_messages import AnthropicMessagesAdapter
from proxy.adapters.openai_chat import OpenAIChatAdapter, models_response
from proxy.adapters.openai_responses import OpenAIResponsesAdapter
from proxy.adapters.signing import ReasoningSigner
from proxy.backend import ExpertShape, SGLangBackend, stream_client
from proxy.conversations import ConversationBook
from proxy.embedded import EmbeddedEngine
from proxy.gate import RunGate
from proxy.ledger import LedgerBook
from proxy.metrics import Metrics
from proxy.openapi import describe
from proxy.pipeline import Pipeline
from proxy.readiness import check_readiness
from proxy.routes import behaviour, control, export, inference, ui
from proxy.routes.auth import is_admin
from proxy.served_template import served_template
from proxy.sessions import SessionCache
from proxy.settings import Settings
from proxy.state import AppState
from proxy.stream_client import StreamClient
from recorder.disks import RecorderDisks
from recorder.export import ExportStore
from recorder.journal import Journal
from recorder.migrate import upgrade_database
from recorder.store import Store
from recorder.writer import TurnWriter

_log = logging.getLogger(__name__)


def expert_shape(model_dir: Path) -> ExpertShape | None:
    """Layers x top-k of an MoE model directory; None for dense models or bare tokenizers."""
    config_file = model_dir / "config.json"
    if not config_file.is_file():
        return None
    config = json.loads(config_file.read_text())
    config = config.get("text_config", config)
    top_k = config.get("num_experts_per_tok")
    layers = config.get("num_hidden_layers")
    if not isinstance(top_k, int) or not isinstance(layers, int):
        return None
    return ExpertShape(num_layers=layers, top_k=top_k)


RECLAIM_CHECK_S = 10.0


async def _reclaim_when_due(collections: FullCollections) -> None:
    """Give the frozen heap back for one full pass when it has grown enough to hold
    garbage worth freeing (``kernel.heap.reclaim_if_due``, which looks at its size only
    every ten minutes)."""
    while True:
        await asyncio.sleep(RECLAIM_CHECK_S)
        if reclaim_if_due(collections):
            _log.info(
                "garbage collector: reclaimed the frozen heap (%d objects frozen now)",
                collections.frozen_at_reclaim,
            )


async def _sync_pauses(
    store: Store,
    gate: RunGate,
    backend: SGLangBackend,
    settings: Settings,
    metrics: Metrics,
) -> None:
    """Keep this replica's gate in step with the runs paused in the database, and its
    backend with the workers taken out of rotation."""
    while True:
        try:
            state = await asyncio.wait_for(store.pause_state(), 1.0)
            gate.sync(state.paused_runs)
            backend.exclude(state.worker_exclusions)
        except (TimeoutError, LegoError):
            # Deliberately swallowed: a database outage must not stop inference; the gate
            # keeps its last known state until the next poll succeeds.
            metrics.pause_sync_failures.inc()
        await asyncio.sleep(settings.pause_sync_s)


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route of the app serves at the request's path (one route per
    method, so Starlette's own Allow names only the first route it tried)."""
    allowed = []
    for method in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"):
        scope = {**request.scope, "method": method}
        if any(route.matches(scope)[0] is Match.FULL for route in request.app.routes):
            allowed.append(method)
    return allowed


class ProxyApp(FastAPI):
    """FastAPI, with the turn routes dispatched before its middleware and router (set
    ``turns`` once the routes are registered)."""

    turns: inference.TurnRoutes | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            self.turns is not None
            and scope["type"] == "http"
            and scope["method"] == "POST"
            and not scope.get("root_path")
        ):
            found = self.turns.match(scope["path"])
            if found is not None:
                scope["app"] = self
                route, key = found
                await inference.answer_turn(self.state.lego, route, key, scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def create_app(settings: Settings, *, instance: str | None = None) -> ProxyApp:
    """The proxy app. ``instance`` names its spool and journal directories (default: the
    port; ``serve --workers`` gives each worker its own, ``recorder.disks``)."""
    disk_name = instance or str(settings.port)
    metrics = Metrics()
    chat_adapter = OpenAIChatAdapter()
    signer = ReasoningSigner(settings.effective_signing_secret)
    messages_adapter = AnthropicMessagesAdapter(signer)
    responses_adapter = OpenAIResponsesAdapter(signer)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        model_dir = settings.tokenizer_path or default_model_dir(settings.data_dir)
        # Everything started is stopped in ``finally``, whatever failed after it: a failed
        # start never leaves the engine child running.
        engine: EmbeddedEngine | None = None
        client: httpx.AsyncClient | None = None
        streams: StreamClient | None = None
        store: Store | None = None
        exports: ExportStore | None = None
        backend: SGLangBackend | None = None
        writer: TurnWriter | None = None
        try:
            backend_urls = settings.backend_urls
            if not backend_urls:
                engine = EmbeddedEngine(
                    model_dir=settings.tokenizer_path,
                    data_dir=settings.data_dir,
                    extra_args=settings.engine_args,
                    routed_experts=settings.return_routed_experts,
                )
                await engine.start()
                backend_urls = (engine.url,)
            client = httpx.AsyncClient(
                timeout=httpx.Timeout(settings.backend_timeout_s, connect=5.0),
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
            )
            streams = stream_client()
            store = await Store.open(settings.effective_database_url)
            exports = ExportStore.open(settings.effective_database_url)
            backend = SGLangBackend(
                client,
                backend_urls,
                expert_shape(model_dir),
                health_interval_s=settings.backend_health_interval_s,
                context_length=settings.context_length,
                require_experts=settings.return_routed_experts,
                streams=streams,
                read_timeout_s=settings.backend_timeout_s,
            )
            try:
                await backend.connect()
            except BackendMisconfigured as exc:
                _log.error("lego-proxy cannot start: %s", exc.message)
                raise
            template = served_template(model_dir, settings.tool_parser)
            tokenizer = template.tokenizer
            _log.info("tool-call format %s (%s)", template.tool_parser, template.tool_parser_source)
            await upgrade_database(settings.effective_database_url)
            disks = RecorderDisks(settings.data_dir, await store.identity())
            spool = disks.spool(disk_name)
            journal = Journal(disks.journal(disk_name)) if settings.journal else None
            writer = TurnWriter(
                store,
                spool=spool,
                orphans=disks.orphans(),
                journal=journal,
                journal_after_s=settings.journal_after_s,
                quarantine=disks.quarantine(disk_name),
                metrics=metrics.recorder,
            )
            writer.start()
            gate = RunGate(
                metrics,
                max_wait_s=settings.pause_max_wait_s,
                retry_after_s=settings.pause_retry_after_s,
            )
            sessions = SessionCache(store)
            ledger = LedgerBook(
                tokenizer,
                keep_reasoning=settings.keep_reasoning,
                max_sessions=settings.max_sessions_held,
            )
            conversations = ConversationBook(settings.max_sessions_held)
            pipeline = Pipeline(
                settings=settings,
                tokenizer=tokenizer,
                tool_parser=template.tool_parser,
                ledger=ledger,
                conversations=conversations,
                backend=backend,
                store=store,
                writer=writer,
                metrics=metrics,
                gate=gate,
            )
            app.state.lego_export = export.ExportState(store, exports, writer, gate, metrics)
            state = AppState(
                settings=settings,
                metrics=metrics,
                store=store,
                writer=writer,
                sessions=sessions,
                pipeline=pipeline,
                conversations=conversations,
                served_model_name=model_dir.name,
                models_response=models_response,
            )
            app.state.lego = state
            app.state.lego_backend = backend
            backend.start()
            pause_sync = asyncio.create_task(_sync_pauses(store, gate, backend, settings, metrics))
            with long_lived_frozen() as collections:
                metrics.watch_collections(collections)
                reclaims = asyncio.create_task(_reclaim_when_due(collections))
                yield
                reclaims.cancel()
            pause_sync.cancel()
        finally:
            if backend is not None:
                await backend.close()
            if writer is not None:
                await writer.close()
            if exports is not None:
                await exports.close()
            if store is not None:
                await store.close()
            if client is not None:
                await client.aclose()
            if streams is not None:
                await streams.close()
            if engine is not None:
                await engine.stop()

    admin_key = settings.effective_admin_key.encode()
    app = ProxyApp(title="lego-proxy", lifespan=lifespan, docs_url=None, redoc_url=None)
    turns = inference.turn_routes(chat_adapter, messages_adapter, responses_adapter)
    app.include_router(inference.build_router(turns, chat_adapter, messages_adapter))
    app.include_router(control.build_router(settings, chat_adapter.error_response))
    app.include_router(export.build_router(settings, chat_adapter.error_response))
    app.include_router(behaviour.build_router(settings, chat_adapter.error_response))
    app.include_router(ui.build_router(settings))
    describe(app)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz(request: Request) -> Response:
        state: AppState = request.app.state.lego
        verdict = await check_readiness(state.store, request.app.state.lego_backend, state.writer)
        detailed = is_admin(request.headers.get("authorization", ""), admin_key)
        return Response(
            orjson.dumps(verdict.to_json(detailed=detailed)),
            status_code=200 if verdict.ready else 503,
            media_type="application/json",
        )

    @app.get("/metrics")
    async def metrics_endpoint(request: Request) -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/")
    async def index() -> dict[str, object]:
        """Where a newcomer who opens the proxy's URL goes next."""
        return {
            "name": "lego-proxy",
            "live_ui": "/ui",
            "health": "/healthz",
            "readiness": "/readyz",
            "metrics": "/metrics",
            "control_api": "/api/v1/runs (Authorization: Bearer <admin key>)",
            "harness_base_urls": "POST /api/v1/runs/{run_id}/sessions answers them",
        }

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        where = f"{request.method} {request.url.path}"
        headers: dict[str, str] = {}
        error: LegoError
        if exc.status_code == 404:
            error = NotFound(f"no route {where}")
        elif exc.status_code == 405:
            allowed = ", ".join(_allowed_methods(request))
            error = MethodNotAllowed(f"{where}: the method is not allowed (allowed: {allowed})")
            headers = {"allow": allowed}
        else:
            error = LegoError(f"{exc.detail} ({where})")
            error.status = exc.status_code
            error.code = "http_error"
        # The Messages routes answer in Anthropic's shape, whatever went wrong.
        anthropic = "/v1/messages" in request.url.path
        adapter = messages_adapter if anthropic else chat_adapter
        status, content = adapter.error_response(error)
        return Response(content, status_code=status, media_type="application/json", headers=headers)

    app.turns = turns
    return app
