"""The engine's SGLang protocol against a real uvicorn server on loopback."""

from __future__ import annotations

import asyncio
import gc
import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from engine.config import EngineConfig
from engine.loopback import running_engine
from tests.engine.helpers import decode_routing, generate, stream_chunks

PROMPT = [1716, 882, 198, 71, 72, 1717, 198, 1716, 329, 198]
GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}


@pytest.fixture(scope="module")
def model(tiny_model_dir: Path) -> Any:
    loaded: Any = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    return loaded.eval()


@pytest.fixture(scope="module")
def tok(tiny_model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def test_non_streaming_response_shape(engine_url: str) -> None:
    out = generate(engine_url, {"input_ids": PROMPT, "sampling_params": GREEDY, "rid": "r-1"})
    meta = out["meta_info"]
    assert meta["id"] == "r-1"
    assert meta["finish_reason"] == {"type": "length", "length": 12}
    assert meta["prompt_tokens"] == len(PROMPT)
    assert meta["completion_tokens"] == 12 == len(out["output_ids"])
    assert meta["cached_tokens"] == 0
    assert meta["weight_version"] == "default"
    assert isinstance(meta["e2e_latency"], float)
    assert "output_token_logprobs" not in meta
    assert "routed_experts" not in meta


def test_greedy_matches_full_recompute(engine_url: str, model: Any) -> None:
    """KV-cached decoding gives the same tokens and logprobs as recomputing from scratch."""
    out = generate(
        engine_url, {"input_ids": PROMPT, "sampling_params": GREEDY, "return_logprob": True}
    )
    ids = list(PROMPT)
    for step in range(6):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
        logp = torch.log_softmax(logits, dim=-1)
        expected = int(torch.argmax(logits))
        lp, token, text = out["meta_info"]["output_token_logprobs"][step]
        assert token == expected == out["output_ids"][step]
        assert lp == pytest.approx(float(logp[expected]), abs=1e-4)
        assert text is None
        ids.append(expected)
    again = generate(engine_url, {"input_ids": PROMPT, "sampling_params": GREEDY})
    assert again["output_ids"] == out["output_ids"]


def test_seeded_sampling_is_reproducible(engine_url: str) -> None:
    params = {"temperature": 1.0, "max_new_tokens": 10, "sampling_seed": 42, "ignore_eos": True}
    a = generate(engine_url, {"input_ids": PROMPT, "sampling_params": params})
    b = generate(engine_url, {"input_ids": PROMPT, "sampling_params": params})
    assert a["output_ids"] == b["output_ids"]


def test_routed_experts_are_the_models_choices(engine_url: str, model: Any) -> None:
    params = {**GREEDY, "max_new_tokens": 5}
    out = generate(
        engine_url,
        {"input_ids": PROMPT, "sampling_params": params, "return_routed_experts": True},
    )
    rows = decode_routing(out["meta_info"])
    fed = PROMPT + out["output_ids"][:-1]
    assert rows.shape == (len(PROMPT) + 5 - 1, 4, 2)
    assert (rows[:, 0, :] == 0).all()  # layer 0 is dense
    with torch.no_grad():
        router_logits = model(
            input_ids=torch.tensor([fed]), output_router_logits=True
        ).router_logits
    for moe_index, layer in enumerate((1, 2, 3)):
        expected = torch.topk(router_logits[moe_index].reshape(len(fed), -1), 2, dim=-1).indices
        assert np.array_equal(np.sort(rows[:, layer, :], axis=1), np.sort(expected.numpy(), axis=1))

    tail = generate(
        engine_url,
        {
            "input_ids": PROMPT,
            "sampling_params": params,
            "return_routed_experts": True,
            "routed_experts_start_len": 4,
        },
    )
    tail_rows = decode_routing(tail["meta_info"])
    assert tail_rows.shape[0] == len(PROMPT) + 5 - 1 - 4
    assert np.array_equal(tail_rows, rows[4:])


def test_input_logprobs(engine_url: str) -> None:
    out = generate(
        engine_url,
        {
            "input_ids": PROMPT,
            "sampling_params": {**GREEDY, "max_new_tokens": 1},
            "return_logprob": True,
            "logprob_start_len": 0,
        },
    )
    entries = out["meta_info"]["input_token_logprobs"]
    assert [e[1] for e in entries] == PROMPT
    assert entries[0][0] is None
    assert all(e[0] < 0 for e in entries[1:])
    default = generate(
        engine_url, {"input_ids": PROMPT, "sampling_params": GREEDY, "return_logprob": True}
    )
    assert default["meta_info"]["input_token_logprobs"] == []


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"sampling_params": {"max_tokens": 3}}, "unknown field `max_tokens`"),
        (
            {"return_routed_experts": True, "routed_experts_start_len": len(PROMPT) + 1},
            "routed_experts_start_len",
        ),
        ({"return_logprob": True, "logprob_start_len": 99}, "logprob_start_len"),
        ({"sampling_params": {"top_k": 0}}, "top_k must be -1 (disable) or at least 1"),
    ],
)
def test_bad_requests_are_400(engine_url: str, body: dict[str, Any], needle: str) -> None:
    response = httpx.post(f"{engine_url}/generate", json={"input_ids": PROMPT, **body})
    assert response.status_code == 400
    assert needle in json.dumps(response.json()["error"])


def test_unknown_sampling_key_error_is_a_plain_string(engine_url: str) -> None:
    response = httpx.post(
        f"{engine_url}/generate", json={"input_ids": PROMPT, "sampling_params": {"foo": 1}}
    )
    assert response.status_code == 400
    assert response.json()["error"].startswith("unknown field `foo`, expected one of")


def test_prompt_longer_than_context_is_400(engine_url: str) -> None:
    response = httpx.post(f"{engine_url}/generate", json={"input_ids": [5] * 131072}, timeout=60)
    assert response.status_code == 400
    assert "context length" in response.json()["error"]["message"]


def test_text_input_is_tokenized(engine_url: str, tok: Any) -> None:
    text = "hello world"
    out = generate(engine_url, {"text": text, "sampling_params": {**GREEDY, "max_new_tokens": 1}})
    assert out["meta_info"]["prompt_tokens"] == len(tok.encode(text, add_special_tokens=False))


def test_stop_string_trims_text_not_ids(engine_url: str, tok: Any) -> None:
    ids = generate(engine_url, {"input_ids": PROMPT, "sampling_params": GREEDY})["output_ids"]
    for k in range(2, len(ids)):
        stop = tok.decode(ids[:k])[-2:]
        if stop.strip() and "\ufffd" not in stop and stop not in tok.decode(ids[: k - 1]):
            break
    else:
        pytest.skip("no usable stop string in the greedy output")
    out = generate(engine_url, {"input_ids": PROMPT, "sampling_params": {**GREEDY, "stop": stop}})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert out["output_ids"] == ids[:k]
    full = tok.decode(ids[:k])
    assert out["text"] == full[: full.find(stop)]
    kept = generate(
        engine_url,
        {"input_ids": PROMPT, "sampling_params": {**GREEDY, "stop": stop, "no_stop_trim": True}},
    )
    assert kept["text"] == full


def test_stop_token_ids_and_eos(engine_url: str, tok: Any) -> None:
    ids = generate(engine_url, {"input_ids": PROMPT, "sampling_params": GREEDY})["output_ids"]
    stop_id = ids[3]
    first = ids.index(stop_id)
    params = {"temperature": 0, "max_new_tokens": 12, "stop_token_ids": [stop_id]}
    out = generate(engine_url, {"input_ids": PROMPT, "sampling_params": params})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}
    assert out["output_ids"] == ids[: first + 1]
    assert out["text"] == tok.decode(ids[:first], skip_special_tokens=True)
    # ignore_eos switches token-based stops off, as in SGLang.
    ignored = generate(
        engine_url, {"input_ids": PROMPT, "sampling_params": {**params, "ignore_eos": True}}
    )
    assert ignored["output_ids"] == ids


def test_min_new_tokens_masks_stop_tokens(engine_url: str) -> None:
    ids = generate(engine_url, {"input_ids": PROMPT, "sampling_params": GREEDY})["output_ids"]
    params = {"temperature": 0, "max_new_tokens": 12, "stop_token_ids": [ids[0]]}
    assert generate(engine_url, {"input_ids": PROMPT, "sampling_params": params})["output_ids"] == [
        ids[0]
    ]
    params["min_new_tokens"] = 3
    out = generate(engine_url, {"input_ids": PROMPT, "sampling_params": params})
    assert ids[0] not in out["output_ids"][:3]


def test_cumulative_stream(engine_url: str) -> None:
    body = {"input_ids": PROMPT, "sampling_params": GREEDY, "return_logprob": True}
    reference = generate(engine_url, body)
    chunks = stream_chunks(engine_url, {**body, "return_routed_experts": True})
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    assert all("routed_experts" not in c["meta_info"] for c in chunks[:-1])
    assert all("e2e_latency" not in c["meta_info"] for c in chunks[:-1])
    previous: list[int] = []
    for chunk in chunks:
        assert chunk["output_ids"][: len(previous)] == previous
        assert len(chunk["meta_info"]["output_token_logprobs"]) == len(chunk["output_ids"])
        previous = chunk["output_ids"]
    final = chunks[-1]
    assert final["output_ids"] == reference["output_ids"]
    assert final["text"] == reference["text"]
    assert final["meta_info"]["finish_reason"] == {"type": "length", "length": 12}
    assert decode_routing(final["meta_info"]).shape == (len(PROMPT) + 11, 4, 2)


async def _read_stream(
    client: httpx.AsyncClient, body: dict[str, Any], chunks: list[dict[str, Any]]
) -> None:
    async with client.stream("POST", "/generate", json={**body, "stream": True}) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line[6:]))


LONG = {"temperature": 0, "max_new_tokens": 20000, "ignore_eos": True}


async def _wait_for(predicate: Any, limit_s: float = 20) -> None:
    deadline = asyncio.get_running_loop().time() + limit_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def test_concurrent_streams_interleave_and_abort_by_rid(engine_url: str) -> None:
    async with httpx.AsyncClient(base_url=engine_url, timeout=60) as client:
        a: list[dict[str, Any]] = []
        b: list[dict[str, Any]] = []
        task_a = asyncio.create_task(
            _read_stream(client, {"input_ids": PROMPT, "sampling_params": LONG, "rid": "long-a"}, a)
        )
        task_b = asyncio.create_task(
            _read_stream(
                client, {"input_ids": PROMPT[:5], "sampling_params": LONG, "rid": "long-b"}, b
            )
        )
        await _wait_for(lambda: len(a) > 3 and len(b) > 3)
        assert all(chunk["meta_info"]["finish_reason"] is None for chunk in a)
        assert (await client.post("/abort_request", json={"rid": "long-a"})).status_code == 200
        await asyncio.wait_for(task_a, 20)
        reason = a[-1]["meta_info"]["finish_reason"]
        assert reason["type"] == "abort"
        assert reason["status_code"] is None
        assert not task_b.done()
        await client.post("/abort_request", json={"abort_all": True})
        await asyncio.wait_for(task_b, 20)
        assert b[-1]["meta_info"]["finish_reason"]["type"] == "abort"
        assert b[-1]["meta_info"]["completion_tokens"] == len(b[-1]["output_ids"]) > 0


async def test_pause_in_place_freezes_and_continue_resumes(engine_url: str) -> None:
    async with httpx.AsyncClient(base_url=engine_url, timeout=60) as client:
        chunks: list[dict[str, Any]] = []
        body = {"input_ids": PROMPT, "sampling_params": LONG, "rid": "paused"}
        task = asyncio.create_task(_read_stream(client, body, chunks))
        await _wait_for(lambda: len(chunks) > 2)
        assert (await client.post("/pause_generation", json={"mode": "in_place"})).json()[
            "status"
        ] == "ok"
        await asyncio.sleep(0.2)
        frozen_at = len(chunks)
        late = asyncio.create_task(
            client.post("/generate", json={"input_ids": PROMPT, "sampling_params": GREEDY})
        )
        await asyncio.sleep(0.4)
        assert len(chunks) == frozen_at
        assert not late.done()
        await client.post("/continue_generation", json={})
        response = await asyncio.wait_for(late, 20)
        assert response.json()["meta_info"]["finish_reason"]["type"] == "length"
        await _wait_for(lambda: len(chunks) > frozen_at)
        await client.post("/abort_request", json={"rid": "paused"})
        await asyncio.wait_for(task, 20)


async def test_pause_abort_mode_aborts_running(engine_url: str) -> None:
    async with httpx.AsyncClient(base_url=engine_url, timeout=60) as client:
        chunks: list[dict[str, Any]] = []
        task = asyncio.create_task(
            _read_stream(client, {"input_ids": PROMPT, "sampling_params": LONG}, chunks)
        )
        await _wait_for(lambda: len(chunks) > 1)
        await client.post("/pause_generation")
        await asyncio.wait_for(task, 20)
        reason = chunks[-1]["meta_info"]["finish_reason"]
        assert reason["type"] == "abort"
        assert reason["err_type"] is None
        await client.post("/continue_generation", json={})


def test_weight_updates_and_version(engine_url: str, tiny_model_dir: Path) -> None:
    before = httpx.get(f"{engine_url}/model_info").json()
    assert before["architectures"] == ["Qwen3MoeForCausalLM"]
    assert before["weight_version"] == "default"
    ok = httpx.post(
        f"{engine_url}/update_weights_from_disk",
        json={"model_path": str(tiny_model_dir), "weight_version": "step-7"},
        timeout=60,
    )
    assert ok.status_code == 200
    assert ok.json()["success"] is True
    assert ok.json()["num_paused_requests"] == 0
    assert httpx.get(f"{engine_url}/model_info").json()["weight_version"] == "step-7"
    out = generate(engine_url, {"input_ids": PROMPT, "sampling_params": GREEDY})
    assert out["meta_info"]["weight_version"] == "step-7"
    bad = httpx.post(
        f"{engine_url}/update_weights_from_disk",
        json={"model_path": str(tiny_model_dir / "missing"), "weight_version": "nope"},
        timeout=60,
    )
    assert bad.status_code == 400
    assert bad.json()["success"] is False
    renamed = httpx.post(
        f"{engine_url}/update_weight_version", json={"new_version": "default"}
    ).json()
    assert renamed["success"] is True
    assert renamed["new_version"] == "default"
    assert httpx.get(f"{engine_url}/model_info").json()["weight_version"] == "default"


def test_health_and_flush(engine_url: str) -> None:
    assert httpx.get(f"{engine_url}/health").status_code == 200
    assert httpx.get(f"{engine_url}/health_generate", timeout=30).status_code == 200
    assert httpx.post(f"{engine_url}/flush_cache").status_code == 200
    assert httpx.get(f"{engine_url}/flush_cache").status_code == 200


def test_the_local_engine_serves_with_its_start_up_heap_frozen(tiny_model_dir: Path) -> None:
    with running_engine(EngineConfig(model_path=tiny_model_dir, zero_compute=True)) as url:
        httpx.get(f"{url}/health", timeout=5).raise_for_status()
        assert gc.get_freeze_count() > 10_000  # the tokenizer, the modules
    assert gc.get_freeze_count() == 0
