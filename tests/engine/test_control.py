"""The engine's control plane behaves like SGLang 0.5.23's: aborts by rid prefix, pauses,
weight updates that drain running requests, weight-version spans, timeouts, flags.

Requests are slow scripted replies (one token per 20 ms) streamed by an async client while
the test drives the control routes, all on a real loopback server.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine.loopback import running_engine
from tests.engine.helpers import engine_config, generate

SLOW = "tick " * 40
SCRIPT = {"rules": [{"match": "slow", "reply": SLOW, "delay_s": 0.02}], "default": "OK."}


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("script") / "script.json"
    path.write_text(json.dumps(SCRIPT))
    return path


@pytest.fixture
def slow_engine(tiny_model_dir: Path, script: Path) -> Iterator[str]:
    # One engine per test: pauses and weight versions are server-wide state.
    with running_engine(engine_config(tiny_model_dir, script_path=script)) as url:
        yield url


@pytest.fixture(scope="module")
def slow_prompt(tok: Any) -> list[int]:
    ids: list[int] = tok.encode(
        "<|im_start|>user\nslow please<|im_end|>\n<|im_start|>assistant\n",
        add_special_tokens=False,
    )
    return ids


async def _stream(client: httpx.AsyncClient, body: dict[str, Any]) -> list[dict[str, Any]]:
    chunks: list[dict[str, Any]] = []
    async with client.stream("POST", "/generate", json={**body, "stream": True}) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    return chunks


async def _until_tokens(chunks_task: asyncio.Task[Any], client: httpx.AsyncClient) -> None:
    """Wait until the engine is running a request that has sampled something."""
    for _ in range(200):
        await asyncio.sleep(0.02)
        if chunks_task.done():
            raise AssertionError("the request finished before the test could act on it")
        if (await client.post("/flush_cache")).status_code == 400:  # something is running
            await asyncio.sleep(0.1)  # a few tokens in
            return
    raise AssertionError("the request never started")


async def _started(
    client: httpx.AsyncClient, prompt: list[int], max_new_tokens: int
) -> tuple[dict[str, Any], asyncio.Task[list[dict[str, Any]]]]:
    """A slow request, streaming, once it has sampled a few tokens; and its body."""
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": max_new_tokens}}
    running = asyncio.create_task(_stream(client, body))
    await _until_tokens(running, client)
    return body, running


async def test_abort_matches_by_prefix_once_the_exact_rid_is_live(
    slow_engine: str, slow_prompt: list[int]
) -> None:
    async with httpx.AsyncClient(base_url=slow_engine, timeout=60) as client:
        body = {"input_ids": slow_prompt, "sampling_params": {"max_new_tokens": 40}}
        first = asyncio.create_task(_stream(client, {**body, "rid": "turn"}))
        resumed = asyncio.create_task(_stream(client, {**body, "rid": "turn-r1"}))
        await _until_tokens(first, client)
        # SGLang's tokenizer ignores a rid it does not hold: a bare prefix aborts nothing.
        await client.post("/abort_request", json={"rid": "tur"})
        await asyncio.sleep(0.1)
        assert not first.done()
        assert not resumed.done()
        await client.post("/abort_request", json={"rid": "turn"})
        both = await asyncio.gather(first, resumed)
    for chunks in both:
        finish = chunks[-1]["meta_info"]["finish_reason"]
        assert finish["type"] == "abort"
        assert finish["status_code"] is None  # a user abort: resumable


async def test_pause_in_abort_mode_aborts_and_holds_new_requests(
    slow_engine: str, slow_prompt: list[int]
) -> None:
    async with httpx.AsyncClient(base_url=slow_engine, timeout=60) as client:
        body, running = await _started(client, slow_prompt, 40)
        assert (await client.post("/pause_generation", json={"mode": "abort"})).status_code == 200
        aborted = await running
        assert aborted[-1]["meta_info"]["finish_reason"]["status_code"] is None
        assert (await client.get("/ready")).status_code == 503
        held = asyncio.create_task(
            _stream(client, {**body, "sampling_params": {"max_new_tokens": 2}})
        )
        await asyncio.sleep(0.3)
        assert not held.done()
        await client.post("/continue_generation", json={})
        assert (await client.get("/ready")).status_code == 200
        finished = await held
    assert finished[-1]["meta_info"]["finish_reason"]["type"] == "length"


async def test_a_weight_update_waits_for_running_requests_and_holds_new_ones(
    slow_engine: str, slow_prompt: list[int], tiny_model_dir: Path
) -> None:
    async with httpx.AsyncClient(base_url=slow_engine, timeout=60) as client:
        body, running = await _started(client, slow_prompt, 30)
        update = asyncio.create_task(
            client.post(
                "/update_weights_from_disk",
                json={"model_path": str(tiny_model_dir), "weight_version": "v2"},
            )
        )
        await asyncio.sleep(0.1)
        later = asyncio.create_task(
            _stream(client, {**body, "sampling_params": {"max_new_tokens": 2}})
        )
        await asyncio.sleep(0.1)
        # Both wait: the update for the running request, the new request for the update.
        assert not running.done()
        assert not update.done()
        assert not later.done()
        old = await running
        response = await update
        assert response.json()["success"] is True
        new = await later
    # The running request finished on the old weights, whole, and was never aborted.
    assert old[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 30}
    assert old[-1]["meta_info"]["weight_version"] == "default"
    assert old[-1]["meta_info"]["weight_versions"] == [
        {"version": "default", "start": 0, "end": 30}
    ]
    # The request that arrived during the update waited for it and ran on the new weights.
    assert new[-1]["meta_info"]["weight_version"] == "v2"


async def test_a_request_that_straddles_a_version_change_reports_spans(
    slow_engine: str, slow_prompt: list[int]
) -> None:
    async with httpx.AsyncClient(base_url=slow_engine, timeout=60) as client:
        _, running = await _started(client, slow_prompt, 30)
        await client.post("/pause_generation", json={"mode": "in_place"})
        change = {"new_version": "v2", "abort_all_requests": False}
        assert (await client.post("/update_weight_version", json=change)).status_code == 200
        await client.post("/continue_generation", json={})
        chunks = await running
    meta = chunks[-1]["meta_info"]
    spans = meta["weight_versions"]
    assert [s["version"] for s in spans] == ["default", "v2"]
    assert spans[0]["start"] == 0
    assert 0 < spans[0]["end"] == spans[1]["start"] < 30
    assert spans[1]["end"] == 30
    assert meta["weight_version"] == "v2"
    assert all("weight_versions" not in c["meta_info"] for c in chunks[:-1])


def test_a_request_past_the_running_timeout_ends_in_a_503_abort(
    tiny_model_dir: Path, script: Path, slow_prompt: list[int]
) -> None:
    config = engine_config(tiny_model_dir, script_path=script, req_running_timeout_s=0.2)
    body = {"input_ids": slow_prompt, "sampling_params": {"max_new_tokens": 40}}
    with running_engine(config) as url:
        out = httpx.post(f"{url}/generate", json=body, timeout=60)
        streamed = asyncio.run(_stream_once(url, body))
    assert out.status_code == 503
    finish = streamed[-1]["meta_info"]["finish_reason"]
    assert finish["type"] == "abort"
    assert finish["status_code"] == 503
    assert finish["message"] == "Request running timeout reached."


async def _stream_once(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        return await _stream(client, body)


def test_without_the_flags_no_routed_experts_and_seeds_are_ignored(tiny_model_dir: Path) -> None:
    config = engine_config(
        tiny_model_dir, enable_return_routed_experts=False, enable_deterministic_inference=False
    )
    params = {"temperature": 1.0, "max_new_tokens": 12, "sampling_seed": 42, "ignore_eos": True}
    body = {"input_ids": [1716, 882, 198], "sampling_params": params, "return_routed_experts": True}
    with running_engine(config) as url:
        info = httpx.get(f"{url}/server_info").json()
        outs = [generate(url, body) for _ in range(3)]
    assert info["enable_return_routed_experts"] is False
    assert info["enable_deterministic_inference"] is False
    assert all("routed_experts" not in out["meta_info"] for out in outs)
    # With the seed honoured, the three would be identical.
    assert len({tuple(out["output_ids"]) for out in outs}) > 1
