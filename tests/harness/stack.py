"""The system under test for harness runs: scripted engine -> tap -> ``lego-proxy`` app.

Owns ``HarnessStack``: a real local engine in scripted-policy mode, the recording tap in
front of it (so a test can inject one backend failure), and the proxy app built by
``create_app`` with a fresh SQLite database (or a Postgres URL), each on its own loopback
uvicorn server. ``new_session`` creates a run + session through the control API and returns
the session JSON (its ``key``, ``openai_base_url``, ``anthropic_base_url``); ``trajectory``
reads the recorded session back. Nothing here knows which harness will be pointed at it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from engine.config import EngineConfig
from engine.loopback import running_engine
from kernel.threaded import free_port, serve
from proxy.app import create_app
from proxy.settings import Settings
from tests.support.tap import BackendTap

ADMIN_KEY = "harness-admin-key"
# Harness prompts are large (system + tool schemas: 7-20 K tokens of this tiny vocabulary)
# and Claude Code asks for 32 K output tokens: leave room for both.
CONTEXT_LENGTH = 131072


@dataclass(frozen=True)
class HarnessStack:
    url: str
    tap: BackendTap
    admin: httpx.Client

    def new_session(self, harness: str) -> dict[str, Any]:
        run = self.admin.post("/api/v1/runs", json={"name": f"{harness}-{uuid.uuid4().hex[:8]}"})
        body = {"task_id": "write-file", "group_id": "g", "sample_index": 0, "harness": harness}
        created = self.admin.post(
            f"/api/v1/runs/{run.raise_for_status().json()['id']}/sessions", json=body
        )
        return dict(created.raise_for_status().json())

    def trajectory(self, session_id: str) -> dict[str, Any]:
        response = self.admin.get(f"/api/v1/sessions/{session_id}/trajectory")
        return dict(response.raise_for_status().json())

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=10).text


@contextmanager
def harness_stack(
    model_dir: Path, script: dict[str, Any], data_dir: Path, database_url: str | None = None
) -> Iterator[HarnessStack]:
    script_file = data_dir / "policy.json"
    script_file.write_text(json.dumps(script))
    with ExitStack() as stack:
        engine_url = stack.enter_context(
            running_engine(
                EngineConfig(
                    model_path=model_dir, script_path=script_file, enable_return_routed_experts=True
                )
            )
        )
        tap = BackendTap(upstream=engine_url)
        tap.url = stack.enter_context(serve(tap.app()))
        port = free_port()
        settings = Settings(
            port=port,
            data_dir=data_dir,
            database_url=database_url,
            backend_url=tap.url,
            tokenizer_path=model_dir,
            admin_key=ADMIN_KEY,
            context_length=CONTEXT_LENGTH,
        )
        url = stack.enter_context(serve(create_app(settings), port=port))
        admin = stack.enter_context(
            httpx.Client(base_url=url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=60)
        )
        yield HarnessStack(url=url, tap=tap, admin=admin)
