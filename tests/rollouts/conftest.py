"""Fixtures for the rollout proof: real harnesses in bwrap, one proxy stack per module.

``installed`` is the harness suite's (the pinned CLIs). ``fetch_server`` is an HTTP
server on the host's loopback holding the reference fix, recording every request it
gets (a sandboxed agent must never reach it). ``scenario_pool(harness)`` writes one
generated task per scenario of ``tests.rollouts.policy`` (the instruction starts with
the scenario's marker). ``proof_stack`` is the scripted engine + proxy whose policy plays
every scenario for every harness.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse

from kernel.threaded import serve
from tasks import generated
from tests.harness.conftest import installed as installed
from tests.harness.stack import HarnessStack, harness_stack
from tests.rollouts.policy import SCENARIOS, marker, script


@dataclass
class FetchServer:
    url: str
    requests: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def seen(self) -> list[str]:
        with self.lock:
            return list(self.requests)


@pytest.fixture(scope="module")
def fetch_server() -> Iterator[FetchServer]:
    app = FastAPI()
    holder: list[FetchServer] = []

    @app.get("/{path:path}")
    async def anything(path: str, request: Request) -> PlainTextResponse:
        with holder[0].lock:
            holder[0].requests.append(f"{request.method} /{path}")
        return PlainTextResponse("the reference fix")

    with serve(app) as url:
        holder.append(FetchServer(url))
        yield holder[0]


PROOF_HARNESSES = ("codex", "opencode", "claude-code", "openhands")


@pytest.fixture(scope="module")
def proof_stack(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory, fetch_server: FetchServer
) -> Iterator[HarnessStack]:
    policy = script(PROOF_HARNESSES, f"{fetch_server.url}/solution.patch")
    data_dir = tmp_path_factory.mktemp("rollout-proxy")
    with harness_stack(tiny_model_dir, policy, data_dir) as stack:
        yield stack


def scenario_pool(pool: Path, harness: str, scenarios: tuple[str, ...] = tuple(SCENARIOS)) -> Path:
    for scenario in scenarios:
        variant, timeout_s, _ = SCENARIOS[scenario]
        root = generated.make_task(pool, f"{harness}-{scenario}", variant=variant)
        spec = json.loads((root / "task.json").read_text())
        spec["instruction"] = f"{marker(harness, scenario)} {spec['instruction']}"
        if timeout_s is not None:
            spec["agent_timeout_s"] = timeout_s
        (root / "task.json").write_text(json.dumps(spec, indent=2) + "\n")
    return pool
