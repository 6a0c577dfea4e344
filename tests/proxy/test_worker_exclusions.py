"""A worker a trainer takes out of rotation (export API) gets no turn on any replica, in a
plain worker list, until it is put back: two recording taps in front of one engine."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import openai
import pytest

from engine.config import EngineConfig
from engine.loopback import running_engine
from kernel.threaded import serve
from tests.proxy.conftest import Proxy, running_proxy
from tests.support.tap import BackendTap


@pytest.fixture(scope="module")
def workers(tiny_model_dir: Path) -> Iterator[list[BackendTap]]:
    config = EngineConfig(model_path=tiny_model_dir, zero_compute=True)
    with ExitStack() as stack:
        engine = stack.enter_context(running_engine(config))
        taps = []
        for _ in range(2):
            tap = BackendTap(upstream=engine)
            tap.url = stack.enter_context(serve(tap.app()))
            taps.append(tap)
        yield taps


def turns_on(proxy: Proxy, count: int) -> None:
    for _ in range(count):
        session = proxy.new_session()
        client = openai.OpenAI(base_url=session["openai_base_url"], api_key="k", max_retries=0)
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )


def test_excluded_workers_get_no_turns_on_any_replica(
    workers: list[BackendTap], tiny_model_dir: Path, tmp_path: Path
) -> None:
    listed = ",".join(tap.url for tap in workers)
    database = f"sqlite+aiosqlite:///{tmp_path / 'shared.sqlite3'}"
    settings: dict[str, Any] = {"return_routed_experts": False, "pause_sync_s": 0.05}
    with (
        running_proxy(listed, tiny_model_dir, tmp_path / "a", database, **settings) as first,
        running_proxy(listed, tiny_model_dir, tmp_path / "b", database, **settings) as second,
    ):
        out, kept = workers
        answer = first.admin.post(
            "/api/v1/workers/exclusions",
            json={"exclude": {out.url: "weight sync to step-2 failed"}},
        ).raise_for_status()
        assert answer.json() == {"excluded": {out.url: "weight sync to step-2 failed"}}
        time.sleep(0.5)  # ten polls of the exclusions by each replica
        for tap in workers:
            tap.reset()
        turns_on(first, 6)
        turns_on(second, 6)
        assert out.generates == []
        assert len(kept.generates) == 12

        back = second.admin.post("/api/v1/workers/exclusions", json={"include": [out.url]})
        assert back.raise_for_status().json() == {"excluded": {}}
        time.sleep(0.5)
        turns_on(first, 12)
        assert out.generates, "a worker put back gets its sessions again"
        listed_now = first.admin.get("/api/v1/workers/exclusions").raise_for_status().json()
        assert listed_now == {"excluded": {}}


def test_bad_exclusion_bodies_are_400(
    workers: list[BackendTap], tiny_model_dir: Path, tmp_path: Path
) -> None:
    with running_proxy(
        workers[0].url, tiny_model_dir, tmp_path, None, return_routed_experts=False
    ) as proxy:
        for body in ({"exclude": {"not-a-url": "x"}}, {"include": "http://a"}, {"other": 1}):
            response = proxy.admin.post("/api/v1/workers/exclusions", json=body)
            assert response.status_code == 400, body
