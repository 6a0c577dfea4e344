"""Fixtures for end-to-end proxy tests: real engine, real proxy, real databases, real SDK.

The engine runs the tiny local model in scripted-policy mode (replies chosen by markers in
the conversation, tokenized and teacher-forced through the real model). A recording tap
sits between the proxy and the engine so tests can see exactly what crossed the wire.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai.types.chat import ChatCompletionFunctionToolParam
from prometheus_client.parser import text_string_to_metric_families
from starlette.types import ASGIApp

from engine.config import EngineConfig
from engine.loopback import running_engine
from kernel.threaded import free_port, serve
from proxy.app import create_app
from proxy.settings import Settings
from recorder.scratch_postgres import PostgresServer
from tests.support.tap import BackendTap

ADMIN_KEY = "test-admin-key"

TOOL_CALL_REPLY = (
    "<think>\nI will use the shell.\n</think>\n\n<tool_call>\n"
    '{"name": "bash", "arguments": {"command": "echo hi > out.txt"}}\n</tool_call>'
)
TWO_CALLS_REPLY = (
    '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "read", "arguments": {"path": "a.txt"}}\n</tool_call>'
)
BAD_CALL_REPLY = '<tool_call>\n{"name": "bash", "arguments": {oops}\n</tool_call>'
AFTER_TOOL_REPLY = "<think>\nThe tool ran.\n</think>\n\nThe file is created."
UNICODE_REPLY = "Grüße 👋 你好, done."
SLOW_REPLY = " ".join(["streaming"] * 60)
RESUMABLE_REPLY = " ".join(["resumed"] * 30)
DEFAULT_REPLY = "Hello! I am a scripted policy."
# The whole answer is one tool call, held back until complete: the first event comes late.
LATE_TOOL_REPLY = '<tool_call>\n{"name": "bash", "arguments": {"command": "sleep 1"}}\n</tool_call>'

SCRIPT: dict[str, Any] = {
    "rules": [
        {"match": "<tool_response>", "reply": AFTER_TOOL_REPLY},
        {"match": "TWO_CALLS", "reply": TWO_CALLS_REPLY},
        {"match": "BAD_CALL", "reply": BAD_CALL_REPLY},
        {"match": "CALL_TOOL", "reply": TOOL_CALL_REPLY},
        {"match": "UNICODE", "reply": UNICODE_REPLY},
        {"match": "SLOW", "reply": SLOW_REPLY, "delay_s": 0.05},
        {"match": "RESUMABLE", "reply": RESUMABLE_REPLY, "delay_s": 0.02},
        {"match": "LATE_TOOL", "reply": LATE_TOOL_REPLY, "delay_s": 0.1},
    ],
    "default": DEFAULT_REPLY,
}

SHELL_TOOL: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}
READ_TOOL: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {
        "name": "read",
        "description": "Read a file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
    },
}


@pytest.fixture(scope="session")
def model_dir(tiny_model_dir: Path) -> Path:
    return tiny_model_dir


@pytest.fixture(scope="session")
def scripted_engine_url(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    script = tmp_path_factory.mktemp("script") / "policy.json"
    script.write_text(json.dumps(SCRIPT))
    with running_engine(
        EngineConfig(model_path=model_dir, script_path=script, enable_return_routed_experts=True)
    ) as url:
        yield url


@pytest.fixture(scope="session")
def tap(scripted_engine_url: str) -> Iterator[BackendTap]:
    recorder = BackendTap(upstream=scripted_engine_url)
    with serve(recorder.app()) as url:
        recorder.url = url
        yield recorder


@dataclass
class Proxy:
    url: str
    settings: Settings
    admin: httpx.Client

    def new_session(self, **overrides: Any) -> dict[str, Any]:
        name = f"test-{uuid.uuid4().hex[:8]}"
        run = self.admin.post("/api/v1/runs", json={"name": name}).raise_for_status().json()
        body = {"task_id": "t1", "group_id": "g1", "sample_index": 0, "harness": "pytest"}
        body.update(overrides)
        response = self.admin.post(f"/api/v1/runs/{run['id']}/sessions", json=body)
        return dict(response.raise_for_status().json())

    def trajectory(self, session_id: str) -> dict[str, Any]:
        response = self.admin.get(f"/api/v1/sessions/{session_id}/trajectory")
        return dict(response.raise_for_status().json())

    def metric_total(self, name: str) -> float:
        """The sum of ``name``'s samples on ``/metrics``, whatever their labels (0 if none)."""
        text = httpx.get(f"{self.url}/metrics").raise_for_status().text
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name
        )


@contextmanager
def running_proxy(
    backend_url: str,
    model_dir: Path,
    data_dir: Path,
    database_url: str | None,
    *,
    wrap: Callable[[ASGIApp], ASGIApp] | None = None,
    **overrides: Any,
) -> Iterator[Proxy]:
    """A proxy on a free loopback port in front of ``backend_url``, with an admin client;
    ``wrap`` puts an ASGI layer of the test's around the app (to watch its loop)."""
    port = free_port()
    settings = Settings(
        **{
            "port": port,
            "data_dir": data_dir,
            "database_url": database_url,
            "backend_url": backend_url,
            "tokenizer_path": model_dir,
            "admin_key": ADMIN_KEY,
            "context_length": 8192,
            "max_body_bytes": 1024 * 1024,
            **overrides,
        }
    )
    with (
        serve((wrap or (lambda app: app))(create_app(settings)), port=port) as url,
        httpx.Client(
            base_url=url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=60
        ) as admin,
    ):
        yield Proxy(url=url, settings=settings, admin=admin)


async def proxy_on_database(
    request: pytest.FixtureRequest,
    backend_url: str,
    tokenizer_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    **overrides: Any,
) -> AsyncIterator[Proxy]:
    """A real proxy on loopback in front of ``backend_url``, on the database that
    ``request.param`` names (``sqlite`` or ``postgres``, a fresh database either way)."""
    data_dir = tmp_path_factory.mktemp("proxy-data")
    database_url: str | None = None
    server: PostgresServer | None = None
    if request.param == "postgres":
        server = request.getfixturevalue("postgres_server")
        database_url = await server.create_database()
    defaults = {"context_length": Settings.model_fields["context_length"].default}
    defaults["max_body_bytes"] = Settings.model_fields["max_body_bytes"].default
    with running_proxy(
        backend_url, tokenizer_path, data_dir, database_url, **{**defaults, **overrides}
    ) as started:
        yield started
    if server is not None and database_url is not None:
        await server.drop_database(database_url)


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
async def proxy(
    request: pytest.FixtureRequest,
    tap: BackendTap,
    model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Proxy]:
    async for started in proxy_on_database(
        request,
        tap.url,
        model_dir,
        tmp_path_factory,
        context_length=8192,
        max_body_bytes=1024 * 1024,
    ):
        yield started
