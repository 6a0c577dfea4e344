"""The OpenAI Responses path end to end: official ``openai`` SDK -> proxy -> engine.

Runs against a real uvicorn proxy (SQLite and Postgres), a real engine serving the tiny
model with the scripted policy, and a tap that shows what crossed the proxy/engine wire.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from tests.proxy.conftest import AFTER_TOOL_REPLY, DEFAULT_REPLY, Proxy
from tests.support.tap import BackendTap

BASH: Any = {
    "type": "function",
    "name": "bash",
    "description": "Run a shell command.",
    "parameters": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
    "strict": False,
}
AFTER_TOOL_TEXT = AFTER_TOOL_REPLY.split("\n\n", 1)[1]


def client_for(session: dict[str, Any]) -> openai.OpenAI:
    return openai.OpenAI(base_url=session["openai_base_url"], api_key="ignored", max_retries=0)


def stream_frames(session: dict[str, Any], body: dict[str, Any]) -> list[dict[str, Any]]:
    frames: list[dict[str, Any]] = []
    url = f"{session['openai_base_url']}/responses"
    with httpx.stream("POST", url, json=body | {"stream": True}, timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data:"):
                frames.append(json.loads(line[5:]))
    return frames


def test_create_plain_answer(proxy: Proxy, tap: BackendTap) -> None:
    session = proxy.new_session()
    tap.reset()
    reply = client_for(session).responses.create(
        model="gpt-any", instructions="Be brief.", input="hi", max_output_tokens=64
    )
    assert reply.status == "completed"
    assert reply.output_text == DEFAULT_REPLY
    assert reply.id.startswith("resp_")
    sent = tap.generates[-1]
    assert reply.usage is not None
    assert reply.usage.input_tokens == len(sent.body["input_ids"])
    assert reply.usage.output_tokens == len(sent.final["output_ids"])
    assert sent.body["sampling_params"]["max_new_tokens"] == 64


def test_stream_tool_call_with_reasoning(proxy: Proxy) -> None:
    session = proxy.new_session()
    with client_for(session).responses.stream(
        model="m",
        input="CALL_TOOL now",
        tools=[BASH],
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert "response.reasoning_text.delta" in kinds
    reasoning, call = final.output
    assert reasoning.type == "reasoning"
    assert reasoning.content is not None
    assert reasoning.content[0].text.strip() == "I will use the shell."
    assert reasoning.encrypted_content
    assert call.type == "function_call"
    assert call.name == "bash"
    assert json.loads(call.arguments) == {"command": "echo hi > out.txt"}


def test_multi_turn_with_previous_response_id(proxy: Proxy, tap: BackendTap) -> None:
    session = proxy.new_session()
    client = client_for(session)
    first = client.responses.create(
        model="m",
        instructions="Be brief.",
        input="CALL_TOOL then report",
        tools=[BASH],
    )
    call = next(item for item in first.output if item.type == "function_call")
    output: Any = {"type": "function_call_output", "call_id": call.call_id, "output": "done\n"}
    with client.responses.stream(
        model="m",
        instructions="Be brief.",
        previous_response_id=first.id,
        input=[output],
        tools=[BASH],
    ) as stream:
        second = stream.get_final_response()
    assert second.output_text == AFTER_TOOL_TEXT
    one, two = tap.generates[-2:]
    # Token-faithful: the second prompt extends the first prompt + what was sampled.
    assert two.body["input_ids"][: len(one.body["input_ids"])] == one.body["input_ids"]
    assert (
        two.body["input_ids"][len(one.body["input_ids"]) :][: len(one.final["output_ids"])]
        == (one.final["output_ids"])
    )
    trajectory = proxy.trajectory(session["id"])
    assert trajectory["turn_count"] == 2
    assert len(trajectory["segments"]) == 1


def test_multi_turn_with_full_input_replay(proxy: Proxy, tap: BackendTap) -> None:
    """What Codex does: store false, the whole history every turn, reasoning echoed sealed."""
    session = proxy.new_session()
    client = client_for(session)
    history: list[Any] = [
        {"type": "message", "role": "developer", "content": "Be brief.", "id": "d1"},
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "CALL_TOOL"}],
        },
    ]
    first = client.responses.create(model="m", input=history, tools=[BASH], store=False)
    for item in first.output:
        echoed = item.model_dump(exclude_none=True)
        if echoed["type"] == "reasoning":
            echoed["content"] = None  # Codex keeps only the sealed copy
        history.append(echoed)
    call = next(item for item in first.output if item.type == "function_call")
    history.append({"type": "function_call_output", "call_id": call.call_id, "output": "done\n"})
    second = client.responses.create(model="m", input=history, tools=[BASH], store=False)
    assert second.output_text == AFTER_TOOL_TEXT
    one, two = tap.generates[-2:]
    assert two.body["input_ids"][: len(one.body["input_ids"])] == one.body["input_ids"]
    assert len(proxy.trajectory(session["id"])["segments"]) == 1

    with pytest.raises(openai.BadRequestError) as unstored:
        client.responses.create(model="m", previous_response_id=first.id, input="more")
    assert unstored.value.code == "invalid_request_error"


def test_golden_stream_transcript(proxy: Proxy) -> None:
    session = proxy.new_session()
    frames = stream_frames(session, {"model": "m", "input": "CALL_TOOL", "tools": [BASH]})
    kinds = [frame["type"] for frame in frames]
    assert [frame["sequence_number"] for frame in frames] == list(range(len(frames)))
    collapsed = [k for i, k in enumerate(kinds) if i == 0 or k != kinds[i - 1]]
    assert collapsed == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    text = stream_frames(session, {"model": "m", "input": "hi"})
    assert [frame["type"] for frame in text if "delta" not in frame["type"]] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert text[-1]["response"]["output"][0]["content"][0]["text"] == DEFAULT_REPLY


def test_bad_input_gets_openai_errors_and_records_nothing(proxy: Proxy, tap: BackendTap) -> None:
    session = proxy.new_session(max_prompt_tokens=64)
    client = client_for(session)
    url = f"{session['openai_base_url']}/responses"
    tap.reset()

    def refused(body: Any, status: int, **kwargs: Any) -> dict[str, Any]:
        response = httpx.post(url, timeout=60, **({"json": body} | kwargs))
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        return dict(error)

    assert refused(None, 400, content=b"{nope")["type"] == "invalid_request_error"
    assert refused({"model": "m"}, 400)["param"] == "input"
    # An offered hosted tool is left out (Codex sends one by default); forcing it is refused.
    shell = {"type": "function", "name": "sh", "parameters": {"type": "object"}}
    forced = {"type": "web_search"}
    web = refused(
        {"model": "m", "input": "x", "tools": [shell, forced], "tool_choice": forced}, 400
    )
    assert web["param"] == "tool_choice.type"
    image = {"type": "input_image", "image_url": "http://x/y.png"}
    parts = [{"role": "user", "content": [image]}]
    assert refused({"model": "m", "input": parts}, 400)["code"] == "unsupported_option"
    reasoning = {"type": "reasoning", "summary": [], "encrypted_content": "lego1.Zm9yZ2Vk"}
    forged = refused({"model": "m", "input": [reasoning, {"role": "user", "content": "x"}]}, 400)
    assert forged["param"] == "input[0].encrypted_content"
    assert refused({"model": "m", "input": "w " * 500}, 400)["code"] == "context_length_exceeded"
    missing = refused({"model": "m", "input": "x", "previous_response_id": "resp_nope"}, 404)
    assert missing["param"] == "previous_response_id"
    refused(None, 413, content=b"x" * (proxy.settings.max_body_bytes + 1))
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(
            base_url=f"{proxy.url}/v1", api_key="lego-sk-x", max_retries=0
        ).responses.create(model="m", input="hi")
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="m", input="hi", tool_choice="required")
    assert tap.generates == []
    assert proxy.trajectory(session["id"])["turn_count"] == 0


def test_backend_failure_mid_stream_is_in_band(proxy: Proxy, tap: BackendTap) -> None:
    session = proxy.new_session()
    tap.drop_after_chunks_once = 3
    seen: list[str] = []
    with (
        pytest.raises(openai.APIError),
        client_for(session).responses.stream(model="m", input="hello") as stream,
    ):
        seen.extend(event.type for event in stream)
    assert seen[-1] == "response.failed"
    (turn,) = proxy.trajectory(session["id"])["turns"]
    assert turn["status"] == "failed"
