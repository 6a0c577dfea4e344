"""The turn routes' own dispatch (``proxy.app.ProxyApp``, ``proxy.routes.inference``):
turns skip FastAPI's middleware and router, everything else still goes through them, and
a harness that hangs up on an unstreamed turn cancels it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.types import ASGIApp, Receive, Scope, Send

from kernel.threaded import free_port, serve
from proxy.adapters.anthropic_messages import AnthropicMessagesAdapter
from proxy.adapters.openai_chat import OpenAIChatAdapter
from proxy.adapters.openai_responses import OpenAIResponsesAdapter
from proxy.adapters.signing import ReasoningSigner
from proxy.app import create_app
from proxy.routes.inference import TurnRoutes, turn_routes
from proxy.settings import Settings
from tests.proxy.conftest import ADMIN_KEY, DEFAULT_REPLY, Proxy
from tests.support.tap import BackendTap


@pytest.fixture(scope="module")
def routes() -> TurnRoutes:
    signer = ReasoningSigner(b"secret")
    return turn_routes(
        OpenAIChatAdapter(), AnthropicMessagesAdapter(signer), OpenAIResponsesAdapter(signer)
    )


@pytest.mark.parametrize(
    ("path", "route", "key"),
    [
        ("/v1/chat/completions", "/v1/chat/completions", None),
        ("/v1/messages", "/v1/messages", None),
        ("/v1/responses", "/v1/responses", None),
        ("/s/abc/v1/chat/completions", "/v1/chat/completions", "abc"),
        ("/s/k-1.2_3/v1/messages", "/v1/messages", "k-1.2_3"),
        ("/s/a b/v1/responses", "/v1/responses", "a b"),
    ],
)
def test_turn_paths_match_as_starlette_would(
    routes: TurnRoutes, path: str, route: str, key: str | None
) -> None:
    found = routes.match(path)
    assert found is not None
    assert found == (routes.by_path[route], key)


@pytest.mark.parametrize(
    "path",
    [
        "/v1/chat/completions/",  # Starlette redirects a trailing slash
        "/v1/messages/count_tokens",  # not a turn
        "/v1/models",
        "/s//v1/chat/completions",  # an empty key is no key segment
        "/s/abc",
        "/s/abc/",
        "/s/a/b/v1/chat/completions",  # a key is one segment
        "/x/abc/v1/chat/completions",
        "/chat/completions",
        "",
    ],
)
def test_other_paths_are_left_to_fastapi(routes: TurnRoutes, path: str) -> None:
    assert routes.match(path) is None


class CountingMiddleware:
    """Counts the requests FastAPI's middleware stack sees, by path."""

    def __init__(self, app: ASGIApp, seen: list[str]) -> None:
        self.app = app
        self.seen = seen

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.seen.append(f"{scope['method']} {scope['path']}")
        await self.app(scope, receive, send)


@pytest.fixture(scope="module")
def counted(
    tap: BackendTap, model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Proxy, list[str]]]:
    port = free_port()
    settings = Settings(
        port=port,
        data_dir=tmp_path_factory.mktemp("dispatch"),
        backend_url=tap.url,
        tokenizer_path=model_dir,
        admin_key=ADMIN_KEY,
        context_length=8192,
    )
    app = create_app(settings)
    seen: list[str] = []
    app.add_middleware(CountingMiddleware, seen=seen)
    with (
        serve(app, port=port) as url,
        httpx.Client(
            base_url=url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=60
        ) as admin,
    ):
        yield Proxy(url=url, settings=settings, admin=admin), seen


def test_turns_skip_fastapis_stack_and_the_rest_goes_through_it(
    counted: tuple[Proxy, list[str]],
) -> None:
    proxy, seen = counted
    session = proxy.new_session()
    key = session["key"]
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64}
    seen.clear()

    by_path = httpx.post(f"{proxy.url}/s/{key}/v1/chat/completions", json=body, timeout=60)
    by_bearer = httpx.post(
        f"{proxy.url}/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {key}"},
        timeout=60,
    )
    for response in (by_path, by_bearer):
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["message"]["content"] == DEFAULT_REPLY
    assert seen == []  # neither turn went through FastAPI's middleware

    wrong_method = httpx.get(f"{proxy.url}/s/{key}/v1/chat/completions", timeout=60)
    assert wrong_method.status_code == 405
    assert wrong_method.headers["allow"] == "POST"
    assert wrong_method.json()["error"]["type"] == "invalid_request_error"
    no_key = httpx.post(f"{proxy.url}/s//v1/chat/completions", json=body, timeout=60)
    assert no_key.status_code == 404
    assert "no route" in no_key.json()["error"]["message"]
    models = httpx.get(f"{proxy.url}/s/{key}/v1/models", timeout=60)
    assert models.status_code == 200
    assert seen == [
        f"GET /s/{key}/v1/chat/completions",
        "POST /s//v1/chat/completions",
        f"GET /s/{key}/v1/models",
    ]
    turns = proxy.trajectory(session["id"])["turns"]
    assert [t["status"] for t in turns] == ["completed", "completed"]


def test_a_turn_under_a_root_path_goes_through_fastapi(
    counted: tuple[Proxy, list[str]], tmp_path: Path
) -> None:
    """Behind a reverse proxy that strips a prefix (uvicorn's ``--root-path``: the scope's
    ``path`` keeps the prefix, ``root_path`` names it), turns are left to Starlette's own
    path rules, and still answered."""
    proxy, _ = counted
    session = proxy.new_session()  # the same database: the second app shares its file
    app = create_app(proxy.settings.model_copy(update={"port": free_port()}))
    seen: list[str] = []
    app.add_middleware(CountingMiddleware, seen=seen)

    async def mounted(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope = {**scope, "root_path": "/api", "path": "/api" + scope["path"]}
        await app(scope, receive, send)

    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64}
    with serve(mounted) as url:
        response = httpx.post(f"{url}/s/{session['key']}/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == DEFAULT_REPLY
    assert seen == [f"POST /api/s/{session['key']}/v1/chat/completions"]


def test_hanging_up_on_an_unstreamed_turn_cancels_it(proxy: Proxy, tap: BackendTap) -> None:
    """The harness gives up on a slow unstreamed answer: the backend generation is aborted
    and the turn recorded ``cancelled``, not left sampling to its end."""
    session = proxy.new_session()
    tap.reset()
    body = {"model": "m", "messages": [{"role": "user", "content": "SLOW"}]}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{session['openai_base_url']}/chat/completions", json=body, timeout=0.5)
    deadline = time.monotonic() + 10
    while not tap.aborts and time.monotonic() < deadline:
        time.sleep(0.05)
    rid = tap.generates[-1].body["rid"]
    assert {"rid": rid} in tap.aborts
    deadline = time.monotonic() + 10
    turns: list[dict[str, object]] = []
    while not turns and time.monotonic() < deadline:
        turns = proxy.trajectory(session["id"])["turns"]
        time.sleep(0.05)
    (turn,) = turns
    assert turn["status"] == "cancelled"
    assert turn["id"] == rid
