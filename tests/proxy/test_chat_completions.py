"""The OpenAI Chat Completions path end to end: official SDK -> proxy -> engine -> recorder.

Runs against a real uvicorn proxy on SQLite and on real Postgres, a real engine serving the
tiny model, and a tap that shows what crossed the proxy/engine wire.
"""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from openai.types.chat import ChatCompletionMessageFunctionToolCall
from openai.types.chat.chat_completion_chunk import ChoiceDeltaToolCall
from transformers import AutoTokenizer

from tests.proxy.conftest import (
    AFTER_TOOL_REPLY,
    BAD_CALL_REPLY,
    DEFAULT_REPLY,
    READ_TOOL,
    RESUMABLE_REPLY,
    SHELL_TOOL,
    UNICODE_REPLY,
    Proxy,
)
from tests.support.tap import BackendTap


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(str(model_dir))


def client_for(session: dict[str, Any], **kwargs: Any) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=session["openai_base_url"], api_key="ignored", max_retries=0, **kwargs
    )


def scripted_ids(tokenizer: Any, reply: str) -> list[int]:
    return [*tokenizer.encode(reply, add_special_tokens=False), tokenizer.eos_token_id]


def test_plain_answer_non_streaming(proxy: Proxy, tap: BackendTap, tokenizer: Any) -> None:
    session = proxy.new_session()
    tap.reset()
    reply = client_for(session).chat.completions.create(
        model="any-name-is-fine",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
    )
    assert reply.model == "any-name-is-fine"
    assert reply.choices[0].message.content == DEFAULT_REPLY
    assert reply.choices[0].finish_reason == "stop"
    expected = scripted_ids(tokenizer, DEFAULT_REPLY)
    assert reply.usage is not None
    assert reply.usage.completion_tokens == len(expected)
    sent = tap.generates[-1].body["input_ids"]
    assert reply.usage.prompt_tokens == len(sent)

    trajectory = proxy.trajectory(session["id"])
    assert trajectory["turn_count"] == 1
    (segment,) = trajectory["segments"]
    assert segment["tokens"] == sent + expected
    assert sum(segment["loss_mask"]) == reply.usage.completion_tokens


def test_recorded_turn_is_what_crossed_the_wire(proxy: Proxy, tap: BackendTap) -> None:
    """Invariants 1, 2 and 5: prompt ids, sampled ids, logprobs and experts, bit-exact."""
    session = proxy.new_session()
    tap.reset()
    client_for(session).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "CALL_TOOL please"}],
        tools=[SHELL_TOOL],
    )
    (exchange,) = tap.generates
    final = exchange.final["meta_info"]
    sampled = [t[1] for t in final["output_token_logprobs"]]
    logprobs = [t[0] for t in final["output_token_logprobs"]]
    assert exchange.final["output_ids"] == sampled
    experts = np.frombuffer(base64.b64decode(final["routed_experts"]), dtype="<i4")

    trajectory = proxy.trajectory(session["id"])
    (segment,) = trajectory["segments"]
    prompt = exchange.body["input_ids"]
    assert segment["tokens"] == prompt + sampled
    assert segment["loss_mask"] == [0] * len(prompt) + [1] * len(sampled)
    # Recorded logprobs are float32; the wire carries float64.
    recorded = np.array(segment["logprobs"][len(prompt) :], dtype=np.float32)
    assert np.array_equal(recorded, np.array(logprobs, dtype=np.float32))
    assert all(lp == 0.0 for lp in segment["logprobs"][: len(prompt)])
    routed = np.array(segment["routed_experts"], dtype=np.int32)
    layers, top_k = routed.shape[1], routed.shape[2]
    assert routed.shape[0] == len(segment["tokens"])
    wire = experts.reshape(-1, layers, top_k)
    assert wire.shape[0] == len(prompt) + len(sampled) - 1
    assert np.array_equal(routed[:-1], wire)
    assert not routed[-1].any()  # the last token is never fed back: padding row
    assert segment["weight_versions"] == [final["weight_version"]]


def test_streamed_tool_call_with_reasoning(proxy: Proxy, tap: BackendTap) -> None:
    session = proxy.new_session()
    stream = client_for(session).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "CALL_TOOL now"}],
        tools=[SHELL_TOOL],
        stream=True,
        stream_options={"include_usage": True},
    )
    reasoning: list[str] = []
    content: list[str] = []
    calls: list[ChoiceDeltaToolCall] = []
    finish, usage = None, None
    chunks = 0
    for chunk in stream:
        chunks += 1
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            extra = choice.delta.model_extra or {}
            if extra.get("reasoning_content"):
                reasoning.append(extra["reasoning_content"])
            if choice.delta.content:
                content.append(choice.delta.content)
            calls.extend(choice.delta.tool_calls or [])
            finish = choice.finish_reason or finish
    assert chunks > 3  # really streamed, not one blob
    assert "".join(reasoning).strip() == "I will use the shell."
    assert "".join(content).strip() == ""
    assert finish == "tool_calls"
    (call,) = calls
    assert call.function is not None
    assert call.function.name == "bash"
    assert json.loads(call.function.arguments or "") == {"command": "echo hi > out.txt"}
    assert call.id
    assert usage is not None
    assert usage.completion_tokens == len(tap.generates[-1].final["output_ids"])


def test_multi_turn_tool_loop_extends_one_segment(proxy: Proxy, tap: BackendTap) -> None:
    """Invariant 3 through the whole stack: turn 2's prompt starts with turn 1's exact ids.

    The harness re-serializes the assistant message (compact JSON arguments, reasoning
    dropped); the ledger must still continue from the sampled tokens.
    """
    session = proxy.new_session()
    client = client_for(session)
    tap.reset()
    messages: list[Any] = [{"role": "user", "content": "CALL_TOOL and then report"}]
    first = client.chat.completions.create(model="m", messages=messages, tools=[SHELL_TOOL])
    call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert isinstance(call, ChatCompletionMessageFunctionToolCall)
    arguments = json.dumps(json.loads(call.function.arguments), separators=(",", ":"))
    messages.append(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call.id, "type": "function",
                 "function": {"name": call.function.name, "arguments": arguments}}
            ],
        }
    )  # fmt: skip
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "done\n"})
    second = client.chat.completions.create(model="m", messages=messages, tools=[SHELL_TOOL])
    assert second.choices[0].message.content == AFTER_TOOL_REPLY.split("\n\n", 1)[1]
    assert second.choices[0].finish_reason == "stop"

    turn1, turn2 = tap.generates
    sampled1 = turn1.final["output_ids"]
    assert turn2.body["input_ids"][: len(turn1.body["input_ids"]) + len(sampled1)] == (
        turn1.body["input_ids"] + sampled1
    )
    # Only the rows the earlier turn could not have: from its last sampled token on.
    assert (
        turn2.body["routed_experts_start_len"] == len(turn1.body["input_ids"]) + len(sampled1) - 1
    )

    trajectory = proxy.trajectory(session["id"])
    assert trajectory["turn_count"] == 2
    assert [t["classification"] for t in trajectory["turns"]] == ["root", "extend"]
    assert trajectory["turns"][1]["parent_turn_id"] == trajectory["turns"][0]["id"]
    (segment,) = trajectory["segments"]
    total_sampled = first.usage.completion_tokens + second.usage.completion_tokens  # type: ignore[union-attr]
    assert sum(segment["loss_mask"]) == total_sampled
    assert segment["tokens"] == turn2.body["input_ids"] + turn2.final["output_ids"]
    n = len(segment["tokens"])
    assert len(segment["loss_mask"]) == len(segment["logprobs"]) == n
    routed = np.array(segment["routed_experts"], dtype=np.int32)
    assert routed.shape[0] == n
    layers, top_k = routed.shape[1:]
    rows1 = np.frombuffer(base64.b64decode(turn1.final["meta_info"]["routed_experts"]), "<i4")
    rows2 = np.frombuffer(base64.b64decode(turn2.final["meta_info"]["routed_experts"]), "<i4")
    rows1 = rows1.reshape(-1, layers, top_k)
    rows2 = rows2.reshape(-1, layers, top_k)
    start = turn2.body["routed_experts_start_len"]
    assert np.array_equal(routed[: len(rows1)], rows1)
    assert np.array_equal(routed[start : start + len(rows2)], rows2)
    assert weight_versions_per_turn(segment) == 2


def weight_versions_per_turn(segment: dict[str, Any]) -> int:
    assert len(segment["weight_versions"]) == len(segment["turn_ids"])
    return len(segment["turn_ids"])


def test_parallel_tool_calls_and_unicode(proxy: Proxy) -> None:
    session = proxy.new_session()
    client = client_for(session)
    reply = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "TWO_CALLS"}],
        tools=[SHELL_TOOL, READ_TOOL],
    )
    calls = reply.choices[0].message.tool_calls or []
    assert [c.function.name for c in calls] == ["bash", "read"]  # type: ignore[union-attr]
    assert len({c.id for c in calls}) == 2
    text = "".join(
        chunk.choices[0].delta.content or ""
        for chunk in client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "UNICODE"}], stream=True
        )
        if chunk.choices
    )
    assert text == UNICODE_REPLY


def test_malformed_tool_call_is_returned_as_text_and_flagged(proxy: Proxy) -> None:
    session = proxy.new_session()
    reply = client_for(session).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "BAD_CALL"}],
        tools=[SHELL_TOOL],
    )
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].message.content == BAD_CALL_REPLY
    assert reply.choices[0].finish_reason == "stop"
    metrics = httpx.get(f"{proxy.url}/metrics").text
    assert "lego_malformed_tool_calls_total" in metrics


def test_sampling_mapping_and_session_overrides(proxy: Proxy, tap: BackendTap) -> None:
    session = proxy.new_session(sampling={"temperature": 0.0, "seed": 7})
    tap.reset()
    reply = client_for(session).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "hello"}],
        temperature=1.5,
        top_p=0.9,
        max_completion_tokens=3,
        stop=["NEVER"],
        seed=1,
        extra_body={"top_k": 20},
    )
    params = tap.generates[-1].body["sampling_params"]
    assert params["temperature"] == 0.0  # pinned by the orchestrator
    assert params["sampling_seed"] == 7
    assert params["top_p"] == 0.9
    assert params["top_k"] == 20
    assert params["max_new_tokens"] == 3
    assert params["stop"] == ["NEVER"]
    assert "max_tokens" not in params
    assert "seed" not in params
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 3


def test_session_key_in_path_wins_over_header(proxy: Proxy) -> None:
    session = proxy.new_session()
    client = openai.OpenAI(base_url=session["openai_base_url"], api_key="placeholder")
    assert [m.id for m in client.models.list()]
    header_client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=session["key"])
    reply = header_client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}]
    )
    assert reply.choices[0].message.content == DEFAULT_REPLY
    raw = httpx.post(
        f"{proxy.url}/v1/chat/completions",
        headers={"x-api-key": session["key"]},
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        timeout=60,
    )
    assert raw.status_code == 200


def test_bad_input_gets_openai_errors_and_records_nothing(proxy: Proxy, tap: BackendTap) -> None:
    session = proxy.new_session(max_prompt_tokens=64)
    client = client_for(session)
    url = f"{session['openai_base_url']}/chat/completions"
    tap.reset()

    bad_json = httpx.post(url, content=b"{not json", headers={"content-type": "application/json"})
    assert bad_json.status_code == 400
    assert bad_json.json()["error"]["type"] == "invalid_request_error"

    wrong_type = httpx.post(url, json={"model": "m", "messages": [{"role": 5, "content": "x"}]})
    assert wrong_type.status_code == 400
    assert wrong_type.json()["error"]["param"] == "messages[0].role"

    with pytest.raises(openai.BadRequestError) as too_many:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], n=2)
    assert too_many.value.status_code == 400

    with pytest.raises(openai.BadRequestError) as too_long:
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "word " * 500}]
        )
    assert too_long.value.code == "context_length_exceeded"

    huge = httpx.post(url, content=b"x" * (proxy.settings.max_body_bytes + 1))
    assert huge.status_code == 413
    assert "error" in huge.json()

    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(
            base_url=f"{proxy.url}/v1", api_key="lego-sk-unknown"
        ).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    missing = httpx.post(f"{proxy.url}/v1/chat/completions", json={"model": "m", "messages": []})
    assert missing.status_code == 401

    assert tap.generates == []
    assert proxy.trajectory(session["id"])["turn_count"] == 0

    proxy.admin.post(
        f"/api/v1/sessions/{session['id']}/finish", json={"termination": "completed", "reward": 1}
    ).raise_for_status()
    with pytest.raises(openai.ConflictError):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])


def test_backend_failure_mid_stream_is_in_band_and_recorded(proxy: Proxy, tap: BackendTap) -> None:
    session = proxy.new_session()
    client = client_for(session)
    tap.drop_after_chunks_once = 3
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hello"}], stream=True
    )
    with pytest.raises(openai.APIError):
        for _ in stream:
            pass
    tap.fail_status_once = 500
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    # The harness retries and the retry succeeds.
    ok = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert ok.choices[0].message.content == DEFAULT_REPLY

    trajectory = proxy.trajectory(session["id"])
    statuses = [t["status"] for t in trajectory["turns"]]
    assert statuses == ["failed", "failed", "completed"]
    assert all(t["error"] for t in trajectory["turns"][:2])
    (segment,) = trajectory["segments"]  # failed turns are not training data
    assert segment["turn_ids"] == [trajectory["turns"][2]["id"]]


def test_disconnect_aborts_the_backend_request(proxy: Proxy, tap: BackendTap) -> None:
    session = proxy.new_session()
    tap.reset()
    with (
        httpx.Client(timeout=60) as client,
        client.stream(
            "POST",
            f"{session['openai_base_url']}/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "SLOW"}], "stream": True},
        ) as response,
    ):
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data:") and "content" in line:
                break
    deadline = time.monotonic() + 10
    while not tap.aborts and time.monotonic() < deadline:
        time.sleep(0.05)
    rid = tap.generates[-1].body["rid"]
    assert {"rid": rid} in tap.aborts
    trajectory = proxy.trajectory(session["id"])
    (turn,) = trajectory["turns"]
    assert turn["status"] == "cancelled"
    assert turn["id"] == rid
    assert trajectory["segments"] == []


def test_pause_abort_is_resumed_transparently(
    proxy: Proxy, tap: BackendTap, scripted_engine_url: str, tokenizer: Any
) -> None:
    """A weight-sync pause aborts the generation; the harness still gets one whole answer."""
    session = proxy.new_session()
    tap.reset()
    text: list[str] = []

    def content(line: str) -> str:
        if not line.startswith("data:") or line == "data: [DONE]":
            return ""
        return "".join(c["delta"].get("content") or "" for c in json.loads(line[5:])["choices"])

    with (
        httpx.Client(timeout=60) as client,
        client.stream(
            "POST",
            f"{session['openai_base_url']}/chat/completions",
            json={
                "model": "m",
                "messages": [{"role": "user", "content": "RESUMABLE"}],
                "stream": True,
            },
        ) as response,
    ):
        lines = response.iter_lines()
        for line in lines:
            text.append(content(line))
            if "".join(text):
                break
        paused = httpx.post(f"{scripted_engine_url}/pause_generation", json={"mode": "abort"})
        assert paused.status_code == 200
        time.sleep(0.3)
        assert httpx.post(f"{scripted_engine_url}/continue_generation", json={}).status_code == 200
        text.extend(content(line) for line in lines)
    assert "".join(text) == RESUMABLE_REPLY

    first, second = tap.generates
    partial = first.final["output_ids"]
    assert first.final["meta_info"]["finish_reason"]["type"] == "abort"
    assert 0 < len(partial) < len(scripted_ids(tokenizer, RESUMABLE_REPLY))
    assert second.body["input_ids"] == first.body["input_ids"] + partial
    budget = first.body["sampling_params"]["max_new_tokens"]
    assert second.body["sampling_params"]["max_new_tokens"] == budget - len(partial)

    trajectory = proxy.trajectory(session["id"])
    (turn,) = trajectory["turns"]
    assert turn["status"] == "completed"
    assert turn["resumptions"] == 1
    (segment,) = trajectory["segments"]
    assert segment["tokens"] == first.body["input_ids"] + scripted_ids(tokenizer, RESUMABLE_REPLY)
