"""The Live UI's routes under ``/ui`` (admin key), for people with a browser.

Authentication: ``Authorization: Bearer <admin key>``, or the ``lego_ui`` cookie that
``POST /ui/login`` (form field ``key``) sets: HttpOnly, SameSite=Strict, scoped to
``/ui``, expiring (``Max-Age``, and checked on the server), revoked by ``POST /ui/logout``,
never holding the admin key (``proxy.routes.ui_login``). Wrong keys are throttled per
client address (429 with ``Retry-After`` once locked out). A browser without either is
redirected to the login form; a wrong Bearer key gets 401. Every UI response forbids
framing and carries a Content-Security-Policy (scripts and styles from ``/ui/static``
only; inline style attributes, which the pages use for colours, are allowed). Errors
(unknown run, bad page) render as an HTML page with the error's status.

    GET  /ui                                 runs
    GET  /ui/runs/{run_id}                   overview: training curves, flagged steps, collapse
    GET  /ui/runs/{run_id}/steps             stage times and terminations per trainer step
    GET  /ui/runs/{run_id}/epochs            success histogram and zero-variance share per epoch
    GET  /ui/runs/{run_id}/tasks?sort&page   per-task solve rate, first vs latest version
    GET  /ui/runs/{run_id}/sessions?...      sessions, filtered and sorted (proxy.ui.queries)
    GET  /ui/runs/{run_id}/behaviour?k       agent behaviour, first vs last third (Table 9)
    GET  /ui/sessions/{session_id}           the session's tree of turns
    GET  /ui/static/{name}                   CSS and JS (no authentication)
    GET|POST /ui/login, POST /ui/logout
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from importlib import resources
from pathlib import Path
from urllib.parse import parse_qs, quote

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from transformers import PreTrainedTokenizerBase

from kernel.errors import InvalidRequest, LegoError, NotFound, Overloaded
from kernel.paths import default_model_dir
from proxy.render import load_tokenizer
from proxy.routes.admin_api import query_int
from proxy.routes.auth import require_admin
from proxy.routes.behaviour import MAX_K
from proxy.routes.ui_login import LoginGuard
from proxy.settings import Settings
from proxy.state import AppState
from proxy.ui.pages import Pages
from proxy.ui.queries import SessionsQuery
from recorder.read_models.behaviour import load_behaviour
from recorder.read_models.epochs import load_epochs
from recorder.read_models.overview import load_overview
from recorder.read_models.session_view import load_session
from recorder.read_models.steps import load_steps
from recorder.read_models.tables import (
    load_runs,
    load_session_choices,
    load_sessions,
    load_tasks,
)

log = logging.getLogger(__name__)

COOKIE = "lego_ui"
SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; connect-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
}
MAX_PAGE = 1_000_000
_STATIC = {"ui.css": "text/css", "ui.js": "text/javascript"}
Handler = Callable[[AppState, Request], Awaitable[str]]


class _Tokens:
    """The served tokenizer, loaded on first use (only the session page needs it)."""

    def __init__(self, model_dir: Path) -> None:
        self._model_dir = model_dir
        self._tokenizer: PreTrainedTokenizerBase | None = None
        self._lock = asyncio.Lock()

    async def decoder(self) -> Callable[[int], str]:
        async with self._lock:
            if self._tokenizer is None:
                self._tokenizer = await asyncio.to_thread(load_tokenizer, self._model_dir)
        tokenizer = self._tokenizer
        return lambda token: str(tokenizer.decode([token], skip_special_tokens=False))


def _page_number(request: Request) -> int:
    raw = request.query_params.get("page", "1")
    if not raw.isdigit() or len(raw) > 7 or int(raw) > MAX_PAGE:
        raise InvalidRequest(f"page must be an integer from 1 to {MAX_PAGE}", param="page")
    return int(raw)


def _html(body: str, status: int) -> HTMLResponse:
    headers = {"cache-control": "no-store", **SECURITY_HEADERS}
    return HTMLResponse(body, status_code=status, headers=headers)


def _safe_next(value: str) -> str:
    # Only local UI paths: a login form must not become an open redirect.
    return value if value.startswith("/ui") and not value.startswith("//") else "/ui"


def build_router(settings: Settings) -> APIRouter:
    router = APIRouter(prefix="/ui")
    admin_key = settings.effective_admin_key.encode()
    guard = LoginGuard(admin_key)
    pages = Pages()
    tokens = _Tokens(settings.tokenizer_path or default_model_dir(settings.data_dir))

    def authorized(request: Request) -> bool:
        auth = request.headers.get("authorization")
        if auth is not None:
            require_admin(auth, admin_key, "live UI")
            return True
        return guard.valid(request.cookies.get(COOKIE, ""))

    def page(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                if not authorized(request):
                    query = f"?{request.url.query}" if request.url.query else ""
                    target = quote(request.url.path + query)
                    return RedirectResponse(f"/ui/login?next={target}", status_code=303)
                state: AppState = request.app.state.lego
                html = await handler(state, request)
            except LegoError as exc:
                return _html(pages.error(exc.status, exc.message), exc.status)
            except Exception as exc:
                log.exception("unexpected error in the live UI")
                return _html(pages.error(500, f"internal error ({type(exc).__name__})"), 500)
            return _html(html, 200)

        return endpoint

    async def runs_page(state: AppState, request: Request) -> str:
        return pages.runs(await load_runs(state.store, _page_number(request)))

    async def overview_page(state: AppState, request: Request) -> str:
        overview = await load_overview(state.store, request.path_params["run_id"])
        return pages.overview(overview)

    async def tasks_page(state: AppState, request: Request) -> str:
        run_id = request.path_params["run_id"]
        sort = request.query_params.get("sort", "task")
        rows = await load_tasks(state.store, run_id, sort, _page_number(request))
        return pages.tasks(run_id, rows, sort)

    async def steps_page(state: AppState, request: Request) -> str:
        return pages.steps(await load_steps(state.store, request.path_params["run_id"]))

    async def epochs_page(state: AppState, request: Request) -> str:
        return pages.epochs(await load_epochs(state.store, request.path_params["run_id"]))

    async def sessions_page(state: AppState, request: Request) -> str:
        run_id = request.path_params["run_id"]
        query = SessionsQuery.parse(dict(request.query_params))
        rows = await load_sessions(
            state.store, run_id, query.page, wanted=query.wanted(), sort=query.order
        )
        choices = await load_session_choices(state.store, run_id)
        return pages.sessions(run_id, rows, query, choices)

    async def behaviour_page(state: AppState, request: Request) -> str:
        raw = request.query_params.get("k") or None
        k = None if raw is None else query_int(raw, "k", default=1, low=1, high=MAX_K)
        view = await load_behaviour(state.store, request.path_params["run_id"], k)
        return pages.behaviour(view, asked_k=k is not None)

    async def session_page(state: AppState, request: Request) -> str:
        view = await load_session(state.store, request.path_params["session_id"])
        return pages.session(view, await tokens.decoder())

    async def login_form(request: Request) -> Response:
        next_url = _safe_next(request.query_params.get("next", "/ui"))
        return _html(pages.login(None, next_url), 200)

    async def login(request: Request) -> Response:
        form = parse_qs((await request.body())[: 64 * 1024].decode("utf-8", "replace"))
        key = (form.get("key") or [""])[0]
        next_url = _safe_next((form.get("next") or ["/ui"])[0])
        client = request.client.host if request.client is not None else "-"
        try:
            guard.check(client, key)
        except Overloaded as exc:
            refused = _html(pages.login(exc.message, next_url), 429)
            refused.headers["retry-after"] = str(max(1, math.ceil(exc.retry_after_s)))
            return refused
        except LegoError as exc:
            return _html(pages.login(exc.message, next_url), exc.status)
        response = RedirectResponse(next_url, status_code=303, headers=SECURITY_HEADERS)
        response.set_cookie(
            COOKIE,
            guard.issue(),
            max_age=int(guard.ttl_s),
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path="/ui",
        )
        return response

    async def logout(request: Request) -> Response:
        guard.revoke(request.cookies.get(COOKIE, ""))  # a copy of the cookie stops working
        response = RedirectResponse("/ui/login", status_code=303, headers=SECURITY_HEADERS)
        response.delete_cookie(COOKIE, path="/ui")
        return response

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in _STATIC:
            error = NotFound(f"no static file {name!r}")
            return _html(pages.error(error.status, error.message), 404)
        body = resources.files("proxy.ui").joinpath("static", name).read_bytes()
        return Response(body, media_type=_STATIC[name], headers={"cache-control": "max-age=300"})

    router.add_api_route("", page(runs_page), methods=["GET"])
    router.add_api_route("/", page(runs_page), methods=["GET"])
    router.add_api_route("/runs/{run_id}", page(overview_page), methods=["GET"])
    router.add_api_route("/runs/{run_id}/steps", page(steps_page), methods=["GET"])
    router.add_api_route("/runs/{run_id}/epochs", page(epochs_page), methods=["GET"])
    router.add_api_route("/runs/{run_id}/tasks", page(tasks_page), methods=["GET"])
    router.add_api_route("/runs/{run_id}/sessions", page(sessions_page), methods=["GET"])
    router.add_api_route("/runs/{run_id}/behaviour", page(behaviour_page), methods=["GET"])
    router.add_api_route("/sessions/{session_id}", page(session_page), methods=["GET"])
    router.add_api_route("/login", login_form, methods=["GET"])
    router.add_api_route("/login", login, methods=["POST"])
    router.add_api_route("/logout", logout, methods=["POST"])
    router.add_api_route("/static/{name}", static, methods=["GET"])
    return router
