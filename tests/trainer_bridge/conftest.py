"""Fixtures for the trainer: a real sampling engine and a real proxy on loopback.

The engine runs the tiny model WITHOUT a script: every token is the model's own sample,
so recomputation has something real to agree with. ``RolloutStack`` plays the
orchestrator: it creates runs and sessions, sends chat turns through the proxy with the
official OpenAI wire format, and finishes sessions with a reward.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine.config import EngineConfig
from engine.loopback import running_engine
from kernel.threaded import free_port, serve
from proxy.app import create_app
from proxy.settings import Settings

ADMIN_KEY = "trainer-test-admin-key"


@dataclass
class RolloutStack:
    proxy_url: str
    engine_url: str
    admin: httpx.Client

    def new_run(self) -> str:
        name = f"rl-{uuid.uuid4().hex[:8]}"
        run = self.admin.post("/api/v1/runs", json={"name": name}).raise_for_status().json()
        return str(run["id"])

    def create_group(
        self, run_id: str, group_id: str, seeds: list[int], *, max_tokens: int
    ) -> list[dict[str, Any]]:
        """One session per seed. A group is complete once all its sessions finish, so a
        round's sessions are all created before any of them runs."""
        return [
            self._new_session(run_id, group_id, index, seed, max_tokens)
            for index, seed in enumerate(seeds)
        ]

    def _new_session(
        self, run_id: str, group_id: str, index: int, seed: int, max_tokens: int
    ) -> dict[str, Any]:
        body = {
            "task_id": group_id,
            "group_id": group_id,
            "sample_index": index,
            "harness": "pytest",
            "sampling": {"temperature": 1.0, "top_p": 1.0, "seed": seed, "max_tokens": max_tokens},
        }
        response = self.admin.post(f"/api/v1/runs/{run_id}/sessions", json=body)
        return dict(response.raise_for_status().json())

    def chat(self, session: dict[str, Any], messages: list[dict[str, Any]], turns: int) -> str:
        history = list(messages)
        text = ""
        for turn in range(turns):
            reply = httpx.post(
                f"{session['openai_base_url']}/chat/completions",
                json={"model": "policy", "messages": history},
                timeout=120,
            ).raise_for_status()
            text = str(reply.json()["choices"][0]["message"]["content"] or "")
            history += [
                {"role": "assistant", "content": text},
                {"role": "user", "content": f"Go on ({turn + 1})."},
            ]
        return text

    def finish(self, session_id: str, reward: float, *, turns: int = 1) -> None:
        """Finish once the session's ``turns`` turns are recorded.

        The proxy records a turn just after the harness got its answer; finishing before
        that would let a trainer claim the group without it (seen as a missing sample).
        """
        deadline = time.monotonic() + 30
        while self.admin.get(f"/api/v1/sessions/{session_id}").json()["turn_count"] < turns:
            assert time.monotonic() < deadline, f"session {session_id}: turns never recorded"
            time.sleep(0.01)
        body = {"termination": "completed", "reward": reward}
        self.admin.post(f"/api/v1/sessions/{session_id}/finish", json=body).raise_for_status()


@contextmanager
def rollout_stack(
    model_dir: Path, data_dir: Path, dtype: str = "float32"
) -> Iterator[RolloutStack]:
    with running_engine(
        EngineConfig(
            model_path=model_dir,
            dtype=dtype,
            enable_return_routed_experts=True,
            # The sessions pin seeds: without this the engine ignores them, as SGLang does.
            enable_deterministic_inference=True,
        )
    ) as engine_url:
        port = free_port()
        settings = Settings(
            port=port,
            data_dir=data_dir,
            backend_url=engine_url,
            tokenizer_path=model_dir,
            admin_key=ADMIN_KEY,
            context_length=8192,
        )
        with (
            serve(create_app(settings), port=port) as url,
            httpx.Client(
                base_url=url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=120
            ) as admin,
        ):
            yield RolloutStack(proxy_url=url, engine_url=engine_url, admin=admin)


@pytest.fixture(scope="module")
def stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RolloutStack]:
    with rollout_stack(tiny_model_dir, tmp_path_factory.mktemp("trainer-proxy")) as built:
        yield built
