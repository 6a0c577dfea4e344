"""The Anthropic Messages path end to end: official ``anthropic`` SDK -> proxy -> engine.

Runs against a real uvicorn proxy (SQLite and Postgres), a real engine serving the tiny
model with the scripted policy, and a tap that shows what crossed the proxy/engine wire.
"""

from __future__ import annotations

import json
import time
from typing import Any

import anthropic
import httpx
import pytest

from tests.proxy.conftest import AFTER_TOOL_REPLY, DEFAULT_REPLY, Proxy
from tests.support.tap import BackendTap

BASH: Any = {
    "name": "bash",
    "description": "Run a shell command.",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
}


def client_for(session: dict[str, Any]) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=session["anthropic_base_url"], api_key="placeholder", max_retries=0
    )


def event_types(session: dict[str, Any], body: dict[str, Any]) -> list[tuple[str, Any]]:
    """(event name, data) of every SSE frame of a raw streamed request, pings included."""
    frames: list[tuple[str, Any]] = []
    url = f"{session['anthropic_base_url']}/v1/messages"
    with httpx.stream("POST", url, json=body | {"stream": True}, timeout=60) as response:
        assert response.status_code == 200
        name = ""
        for line in response.iter_lines():
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                frames.append((name, json.loads(line[5:])))
    return frames


def test_create_plain_answer(proxy: Proxy, tap: BackendTap) -> None:
    session = proxy.new_session()
    tap.reset()
    reply = client_for(session).messages.create(
        model="claude-any-name",
        max_tokens=256,
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        messages=[{"role": "user", "content": "hi"}],
        metadata={"user_id": "u1"},
    )
    assert reply.model == "claude-any-name"
    assert [block.type for block in reply.content] == ["text"]
    (text,) = reply.content
    assert text.type == "text"
    assert text.text == DEFAULT_REPLY
    assert reply.stop_reason == "end_turn"
    sent = tap.generates[-1]
    assert reply.usage.input_tokens == len(sent.body["input_ids"])
    assert reply.usage.output_tokens == len(sent.final["output_ids"])
    assert proxy.trajectory(session["id"])["turn_count"] == 1


def test_stream_accumulates_thinking_and_tool_use(proxy: Proxy) -> None:
    session = proxy.new_session()
    with client_for(session).messages.stream(
        model="m",
        max_tokens=256,
        messages=[{"role": "user", "content": "CALL_TOOL now"}],
        tools=[BASH],
    ) as stream:
        texts = [event.type for event in stream]
        final = stream.get_final_message()
    assert "content_block_delta" in texts
    thinking, tool_use = final.content
    assert thinking.type == "thinking"
    assert thinking.thinking.strip() == "I will use the shell."
    assert thinking.signature.startswith("lego1.")
    assert tool_use.type == "tool_use"
    assert tool_use.name == "bash"
    assert tool_use.input == {"command": "echo hi > out.txt"}
    assert final.stop_reason == "tool_use"
    assert final.usage.output_tokens > 0


def test_multi_turn_tool_loop_with_signed_thinking(proxy: Proxy, tap: BackendTap) -> None:
    session = proxy.new_session()
    client = client_for(session)
    messages: list[Any] = [{"role": "user", "content": "CALL_TOOL and then report"}]
    first = client.messages.create(model="m", max_tokens=256, messages=messages, tools=[BASH])
    tool_use = next(block for block in first.content if block.type == "tool_use")
    messages.append({"role": "assistant", "content": [b.model_dump() for b in first.content]})
    messages.append(
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": tool_use.id, "content": "done\n"},
            ],
        }
    )
    with client.messages.stream(
        model="m",
        max_tokens=256,
        messages=messages,
        tools=[BASH],
    ) as stream:
        second = stream.get_final_message()
    assert [b.type for b in second.content] == ["thinking", "text"]
    answer = second.content[1]
    assert answer.type == "text"
    assert answer.text == AFTER_TOOL_REPLY.split("\n\n", 1)[1]
    assert second.stop_reason == "end_turn"

    # Token-faithful: the second prompt starts with the first prompt + what was sampled.
    one, two = tap.generates[-2:]
    assert two.body["input_ids"][: len(one.body["input_ids"])] == one.body["input_ids"]
    trajectory = proxy.trajectory(session["id"])
    assert trajectory["turn_count"] == 2
    sampled = first.usage.output_tokens + second.usage.output_tokens
    assert sum(sum(s["loss_mask"]) for s in trajectory["segments"]) == sampled

    # A thinking block whose signature is not the proxy's is refused, and nothing runs.
    forged = json.loads(json.dumps(messages))
    forged[1]["content"][0]["signature"] = "lego1.forged"
    tap.reset()
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model="m", max_tokens=256, messages=forged, tools=[BASH])
    envelope: Any = refused.value.body
    assert envelope["error"]["type"] == "invalid_request_error"
    assert tap.generates == []


def test_golden_stream_transcript(proxy: Proxy) -> None:
    session = proxy.new_session()
    frames = event_types(
        session,
        {
            "model": "m",
            "max_tokens": 256,
            "messages": [{"role": "user", "content": "CALL_TOOL"}],
            "tools": [BASH],
        },
    )
    names = [name for name, _ in frames if name != "ping"]
    assert all(name == data["type"] for name, data in frames)
    deltas = [data["delta"]["type"] for name, data in frames if name == "content_block_delta"]
    collapsed = [n for i, n in enumerate(names) if i == 0 or n != names[i - 1]]
    assert collapsed == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert set(deltas[:-2]) == {"thinking_delta"}
    assert deltas[-2:] == ["signature_delta", "input_json_delta"]
    starts = [
        data["content_block"]["type"] for name, data in frames if name == "content_block_start"
    ]
    assert starts == ["thinking", "tool_use"]
    (delta,) = [data for name, data in frames if name == "message_delta"]
    assert delta["delta"]["stop_reason"] == "tool_use"


def test_ping_while_the_first_output_is_late(proxy: Proxy) -> None:
    session = proxy.new_session()
    frames = event_types(
        session,
        {
            "model": "m",
            "max_tokens": 256,
            "messages": [{"role": "user", "content": "LATE_TOOL"}],
            "tools": [BASH],
        },
    )
    names = [name for name, _ in frames]
    assert names[0] == "message_start"
    assert names[1] == "ping"
    assert names[-1] == "message_stop"
    assert "tool_use" in [
        d["content_block"]["type"] for n, d in frames if n == "content_block_start"
    ]


def test_stop_sequence_count_tokens_and_preconnect(proxy: Proxy, tap: BackendTap) -> None:
    session = proxy.new_session()
    client = client_for(session)
    reply = client.messages.create(
        model="m",
        max_tokens=256,
        stop_sequences=["scripted"],
        messages=[{"role": "user", "content": "hi"}],
    )
    assert reply.stop_reason == "stop_sequence"
    assert reply.stop_sequence == "scripted"
    tap.reset()
    counted = client.messages.count_tokens(
        model="m",
        system="Be brief.",
        messages=[{"role": "user", "content": "hi"}],
        tools=[BASH],
    )
    answered = client.messages.create(
        model="m",
        max_tokens=8,
        system="Be brief.",
        messages=[{"role": "user", "content": "hi"}],
        tools=[BASH],
    )
    assert counted.input_tokens == answered.usage.input_tokens
    assert len(tap.generates) == 1  # counting sends nothing to the backend
    beta = httpx.post(
        f"{proxy.url}/v1/messages?beta=true",
        headers={"x-api-key": session["key"], "anthropic-version": "2023-06-01"},
        json={"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
        timeout=60,
    )
    assert beta.status_code == 200
    assert beta.json()["type"] == "message"
    assert httpx.head(f"{proxy.url}/").status_code == 200
    assert httpx.head(session["anthropic_base_url"]).status_code == 200


def test_bad_input_gets_anthropic_errors_and_records_nothing(proxy: Proxy, tap: BackendTap) -> None:
    session = proxy.new_session(max_prompt_tokens=64)
    client = client_for(session)
    url = f"{session['anthropic_base_url']}/v1/messages"
    ok_message: Any = [{"role": "user", "content": "hi"}]
    tap.reset()

    def refused(body: Any, status: int, kind: str, **kwargs: Any) -> dict[str, Any]:
        response = httpx.post(url, timeout=60, **({"json": body} | kwargs))
        assert response.status_code == status, response.text
        envelope = response.json()
        assert envelope["type"] == "error"
        assert envelope["error"]["type"] == kind
        assert envelope["error"]["message"]
        return dict(envelope["error"])

    refused(None, 400, "invalid_request_error", content=b"{not json")
    refused({"model": "m", "messages": ok_message}, 400, "invalid_request_error")  # max_tokens
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "x"}}
    error = refused(
        {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [image]}]},
        400,
        "invalid_request_error",
    )
    assert "text only" in error["message"]
    web = {"type": "web_search_20250305", "name": "web_search"}
    refused(
        {"model": "m", "max_tokens": 8, "messages": ok_message, "tools": [web]},
        400,
        "invalid_request_error",
    )
    refused(
        {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "w " * 500}]},
        400,
        "invalid_request_error",
    )
    refused(None, 413, "request_too_large", content=b"x" * (proxy.settings.max_body_bytes + 1))
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(
            base_url=proxy.url, api_key="lego-sk-unknown", max_retries=0
        ).messages.create(
            model="m",
            max_tokens=8,
            messages=ok_message,
        )
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(
            model="m",
            max_tokens=8,
            messages=ok_message,
            tool_choice={"type": "tool", "name": "nope"},
            tools=[BASH],
        )
    assert tap.generates == []
    assert proxy.trajectory(session["id"])["turn_count"] == 0


def test_backend_failure_mid_stream_is_an_in_band_error(proxy: Proxy, tap: BackendTap) -> None:
    session = proxy.new_session()
    tap.drop_after_chunks_once = 3
    with (
        pytest.raises(anthropic.APIStatusError) as failed,
        client_for(session).messages.stream(
            model="m", max_tokens=256, messages=[{"role": "user", "content": "hello"}]
        ) as stream,
    ):
        for _ in stream:
            pass
    envelope: Any = failed.value.body
    assert envelope["error"]["type"] in ("api_error", "overloaded_error")
    (turn,) = proxy.trajectory(session["id"])["turns"]
    assert turn["status"] == "failed"


def test_disconnect_while_waiting_aborts_the_backend(proxy: Proxy, tap: BackendTap) -> None:
    session = proxy.new_session()
    tap.reset()
    body = {
        "model": "m",
        "max_tokens": 256,
        "stream": True,
        "messages": [{"role": "user", "content": "LATE_TOOL"}],
        "tools": [BASH],
    }
    url = f"{session['anthropic_base_url']}/v1/messages"
    with httpx.stream("POST", url, json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line == "event: ping":
                break  # hang up before the first output event
    deadline = time.monotonic() + 10
    while not tap.aborts and time.monotonic() < deadline:
        time.sleep(0.05)
    assert {"rid": tap.generates[-1].body["rid"]} in tap.aborts
    (turn,) = proxy.trajectory(session["id"])["turns"]
    assert turn["status"] == "cancelled"
