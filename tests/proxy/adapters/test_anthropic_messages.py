"""Behaviour of the Anthropic Messages adapter, checked against the official anthropic SDK.

The SDK is fed the adapter's bytes through ``httpx2.MockTransport`` (the seam at the external
edge): what it parses and accumulates is what Claude Code would see.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import anthropic
import httpx2 as httpx  # the transport library anthropic 2.x is built on
import orjson
import pytest

from kernel.errors import (
    AuthenticationFailed,
    BackendError,
    BackendUnavailable,
    Conflict,
    InvalidRequest,
    LegoError,
    NotFound,
    PayloadTooLarge,
    Unsupported,
)
from proxy.adapters.anthropic_messages import AnthropicMessagesAdapter
from proxy.adapters.base import StreamState
from proxy.adapters.signing import ReasoningSigner
from proxy.canonical import (
    AssistantTurn,
    FinishReason,
    Message,
    OutputEvent,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolChoiceMode,
    TurnFinished,
    Usage,
)

Json = dict[str, Any]
SIGNER = ReasoningSigner(b"test-secret")
BASH: Json = {
    "name": "Bash",
    "description": "Run a command",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
    "cache_control": {"type": "ephemeral"},
}

# Claude Code with an unknown model name: system blocks, an in-array system message, adaptive
# thinking, cache_control moving around, a signed thinking block echoed, a tool loop.
CLAUDE_CODE_BODY: Json = {
    "model": "some-model",
    "max_tokens": 32000,
    "system": [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1;"},
        {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
    ],
    "messages": [
        {"role": "system", "content": "Agents: none."},
        {"role": "user", "content": [{"type": "text", "text": "create out.txt"}]},
        {
            "role": "assistant",
            "content": [
                {
                    "type": "thinking",
                    "thinking": "Use Bash.",
                    "signature": SIGNER.sign("Use Bash."),
                },
                {"type": "text", "text": "Creating it."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "Bash",
                    "input": {"command": "echo hi"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": "(Bash completed with no output)",
                    "is_error": False,
                    "cache_control": {"type": "ephemeral"},
                },
                {"type": "text", "text": "Thanks."},
            ],
        },
    ],
    "tools": [BASH],
    "metadata": {"user_id": '{"session_id": "s1"}'},
    "thinking": {"type": "adaptive"},
    "output_config": {"effort": "high"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    "stream": True,
}


def parse(body: Json) -> Any:
    return AnthropicMessagesAdapter(SIGNER).parse_request(orjson.dumps(body))


def body_with(**changes: Any) -> Json:
    body: Json = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    return body | changes


def sdk(handler: Callable[[httpx.Request], httpx.Response]) -> anthropic.Anthropic:
    http_client: Any = httpx.Client(transport=httpx.MockTransport(handler))
    return anthropic.Anthropic(
        api_key="k", base_url="http://proxy.test", max_retries=0, http_client=http_client
    )


def streamed(events: list[OutputEvent], *, error: LegoError | None = None) -> list[bytes]:
    adapter = AnthropicMessagesAdapter(SIGNER)
    state = StreamState("turn1", "some-model", 1_700_000_000, prompt_tokens=12)
    frames = adapter.stream_start(state) + adapter.stream_ping(state)
    for event in events:
        frames += adapter.stream_event(state, event)
    if error is not None:
        return frames + adapter.stream_error(state, error)
    return frames + adapter.stream_end(state)


def sse(frames: list[bytes]) -> Callable[[httpx.Request], httpx.Response]:
    def handler(request: httpx.Request) -> httpx.Response:
        headers = {"content-type": "text/event-stream"}
        return httpx.Response(200, headers=headers, content=iter(frames))

    return handler


def finished(reason: FinishReason, matched: str | None = None) -> TurnFinished:
    return TurnFinished("turn1", reason, Usage(12, 7, 3), matched)


# -- request ------------------------------------------------------------------------------------


def test_claude_code_request_becomes_canonical() -> None:
    request = parse(CLAUDE_CODE_BODY)
    roles = [m.role for m in request.messages]
    assert roles == ["system", "system", "user", "assistant", "tool", "user"]
    # The billing-header block is request metadata, not prompt text; see
    # test_anthropic_messages_claude_code_system.py.
    assert request.messages[0].content == "You are Claude Code."
    assistant = request.messages[3]
    assert assistant.reasoning == "Use Bash."
    assert assistant.content == "Creating it."
    assert assistant.tool_calls == (ToolCall("toolu_1", "Bash", '{"command":"echo hi"}'),)
    assert request.messages[4] == Message(
        "tool", "(Bash completed with no output)", tool_call_id="toolu_1"
    )
    assert request.messages[5].content == "Thanks."
    assert request.tools[0].parameters == BASH["input_schema"]
    assert request.stream
    assert request.enable_thinking is None
    assert request.sampling.max_tokens == 32000
    for field in (
        "metadata",
        "output_config",
        "context_management",
        "system[].cache_control",
        "tools[].cache_control",
        "messages[].content[].cache_control",
    ):
        assert field in request.ignored_fields


def test_sampling_thinking_and_tool_choice_mapping() -> None:
    request = parse(
        body_with(
            temperature=0.5,
            top_p=0.9,
            top_k=20,
            stop_sequences=["END"],
            thinking={"type": "enabled", "budget_tokens": 1024},
            tools=[BASH],
            tool_choice={"type": "tool", "name": "Bash", "disable_parallel_tool_use": True},
        )
    )
    sampling = request.sampling
    assert (sampling.temperature, sampling.top_p, sampling.top_k) == (0.5, 0.9, 20)
    assert sampling.stop == ("END",)
    assert request.enable_thinking is True
    assert request.tool_choice.mode is ToolChoiceMode.NAMED
    assert request.tool_choice.name == "Bash"
    assert "tool_choice.disable_parallel_tool_use" in request.ignored_fields
    assert parse(body_with(thinking={"type": "disabled"})).enable_thinking is False
    modes = {
        kind: parse(body_with(tools=[BASH], tool_choice={"type": kind})).tool_choice.mode
        for kind in ("auto", "any", "none")
    }
    assert modes == {
        "auto": ToolChoiceMode.AUTO,
        "any": ToolChoiceMode.REQUIRED,
        "none": ToolChoiceMode.NONE,
    }


def test_tool_result_blocks_and_redacted_thinking() -> None:
    request = parse(
        body_with(
            messages=[
                {"role": "user", "content": "go"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "redacted_thinking", "data": "opaque"},
                        {"type": "tool_use", "id": "t1", "name": "Bash", "input": {}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "content": [
                                {"type": "text", "text": "a"},
                                {"type": "text", "text": "b"},
                            ],
                            "is_error": True,
                        }
                    ],
                },
            ]
        )
    )
    assert request.messages[1].reasoning is None
    assert request.messages[2] == Message("tool", "a\n\nb", tool_call_id="t1")
    assert len(request.messages) == 3  # no empty user message after the tool result
    assert "messages[].content[].redacted_thinking" in request.ignored_fields
    assert "messages[].content[].is_error" in request.ignored_fields


def forged_thinking(signature: str | None) -> Json:
    block: Json = {"type": "thinking", "thinking": "secret plan"}
    if signature is not None:
        block["signature"] = signature
    return body_with(
        messages=[
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [block, {"type": "text", "text": "ok"}]},
            {"role": "user", "content": "more"},
        ]
    )


@pytest.mark.parametrize(
    ("body", "error", "param"),
    [
        (body_with(max_tokens=None), InvalidRequest, "max_tokens"),
        (body_with(max_tokens="5"), InvalidRequest, "max_tokens"),
        (body_with(messages=[]), InvalidRequest, "messages"),
        (
            body_with(messages=[{"role": "tool", "content": "x"}]),
            InvalidRequest,
            "messages[0].role",
        ),
        (body_with(temperature=1.5), InvalidRequest, "temperature"),
        (
            body_with(messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}]),
            Unsupported,
            "messages[0].content[0]",
        ),
        (
            body_with(messages=[{"role": "user", "content": [{"type": "tool_result"}]}]),
            InvalidRequest,
            "messages[0].content[0].tool_use_id",
        ),
        (forged_thinking("lego1.bad"), InvalidRequest, "messages[1].content[0].signature"),
        (forged_thinking(None), InvalidRequest, "messages[1].content[0].signature"),
        (
            body_with(tools=[{"type": "bash_20250124", "name": "bash"}]),
            Unsupported,
            "tools[0].type",
        ),
        (body_with(tools=[BASH, BASH]), InvalidRequest, "tools[1].name"),
        (body_with(tool_choice={"type": "any"}), InvalidRequest, "tool_choice.type"),
        (
            body_with(tools=[BASH], tool_choice={"type": "tool", "name": "Other"}),
            InvalidRequest,
            "tool_choice.name",
        ),
    ],
)
def test_bad_input_names_the_field(body: Json, error: type[LegoError], param: str) -> None:
    with pytest.raises(error) as raised:
        parse({k: v for k, v in body.items() if v is not None})
    assert type(raised.value) is error
    assert raised.value.param == param


def test_count_tokens_does_not_need_max_tokens() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    adapter = AnthropicMessagesAdapter(SIGNER)
    assert adapter.parse_count_request(orjson.dumps(body)).sampling.max_tokens is None
    with pytest.raises(InvalidRequest):
        adapter.parse_request(orjson.dumps(body))


# -- non-streaming response ---------------------------------------------------------------------


def test_sdk_reads_a_whole_answer_with_signed_thinking() -> None:
    call = ToolCall("toolu_x", "Bash", '{"command": "ls", "timeout": 5}')
    message = Message("assistant", "Listing.", "Need ls.", (call,))
    turn = AssistantTurn("turn9", message, FinishReason.TOOL_CALLS, Usage(40, 9))
    body = AnthropicMessagesAdapter(SIGNER).render_response(turn, model="some-model", created=1)
    reply = sdk(lambda _: httpx.Response(200, content=body)).messages.create(
        model="some-model", max_tokens=8, messages=[{"role": "user", "content": "x"}]
    )
    assert reply.id == "msg_turn9"
    thinking, text, tool_use = reply.content
    assert thinking.type == "thinking"
    assert SIGNER.verify(thinking.thinking, thinking.signature)
    assert text.type == "text"
    assert text.text == "Listing."
    assert tool_use.type == "tool_use"
    assert tool_use.input == {"command": "ls", "timeout": 5}
    assert reply.stop_reason == "tool_use"
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (40, 9)
    # What the client echoes back parses to the same canonical assistant message.
    echoed = [block.model_dump() for block in reply.content]
    request = parse(body_with(messages=[{"role": "assistant", "content": echoed}]))
    assert request.messages[0].reasoning == "Need ls."
    assert orjson.loads(request.messages[0].tool_calls[0].arguments) == orjson.loads(call.arguments)


@pytest.mark.parametrize(
    ("reason", "matched", "expected"),
    [
        (FinishReason.STOP, None, "end_turn"),
        (FinishReason.STOP, "END", "stop_sequence"),
        (FinishReason.LENGTH, None, "max_tokens"),
        (FinishReason.TOOL_CALLS, None, "tool_use"),
    ],
)
def test_stop_reasons(reason: FinishReason, matched: str | None, expected: str) -> None:
    turn = AssistantTurn("t", Message("assistant", "x"), reason, Usage(1, 1), matched)
    body = orjson.loads(
        AnthropicMessagesAdapter(SIGNER).render_response(turn, model="m", created=1)
    )
    assert body["stop_reason"] == expected
    assert body["stop_sequence"] == matched
    frames = streamed([TextDelta("x"), finished(reason, matched)])
    (delta,) = [f for f in frames if f.startswith(b"event: message_delta")]
    assert orjson.loads(delta.split(b"data: ", 1)[1])["delta"]["stop_reason"] == expected


# -- streaming response -------------------------------------------------------------------------


def test_sdk_accumulates_a_stream() -> None:
    call = ToolCall("toolu_2", "Bash", '{"command": "pwd"}')
    events: list[OutputEvent] = [
        ReasoningDelta("Think"),
        ReasoningDelta("ing."),
        TextDelta(""),
        TextDelta("Run"),
        TextDelta("ning."),
        ToolCallDelta(0, call),
        finished(FinishReason.TOOL_CALLS),
    ]
    client = sdk(sse(streamed(events)))
    with client.messages.stream(
        model="m", max_tokens=8, messages=[{"role": "user", "content": "x"}]
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert "signature" in kinds
    thinking, text, tool_use = final.content
    assert thinking.type == "thinking"
    assert thinking.thinking == "Thinking."
    assert SIGNER.verify("Thinking.", thinking.signature)
    assert text.type == "text"
    assert text.text == "Running."
    assert tool_use.type == "tool_use"
    assert tool_use.input == {"command": "pwd"}
    assert final.stop_reason == "tool_use"
    assert (final.usage.input_tokens, final.usage.output_tokens) == (12, 7)


def test_stream_golden_frames() -> None:
    frames = streamed([TextDelta("Hi"), TextDelta("!"), finished(FinishReason.STOP)])
    names = [frame.split(b"\n", 1)[0].removeprefix(b"event: ").decode() for frame in frames]
    assert names == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = orjson.loads(frames[0].split(b"data: ", 1)[1])
    assert start["message"]["id"] == "msg_turn1"
    assert start["message"]["usage"]["input_tokens"] == 12


def test_in_band_error_makes_the_sdk_raise() -> None:
    frames = streamed([TextDelta("partial")], error=BackendUnavailable("backend gone"))
    with (
        pytest.raises(anthropic.APIStatusError) as raised,
        sdk(sse(frames)).messages.stream(
            model="m", max_tokens=8, messages=[{"role": "user", "content": "x"}]
        ) as stream,
    ):
        for _ in stream:
            pass
    assert raised.value.body == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "backend gone"},
    }


# -- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "status", "kind", "sdk_error"),
    [
        (InvalidRequest("bad"), 400, "invalid_request_error", anthropic.BadRequestError),
        (AuthenticationFailed("who"), 401, "authentication_error", anthropic.AuthenticationError),
        (NotFound("gone"), 404, "not_found_error", anthropic.NotFoundError),
        (Conflict("finished"), 409, "invalid_request_error", anthropic.ConflictError),
        (PayloadTooLarge("big"), 413, "request_too_large", anthropic.APIStatusError),
        (BackendError("boom"), 502, "api_error", anthropic.InternalServerError),
        (BackendUnavailable("down"), 503, "overloaded_error", anthropic.InternalServerError),
        (LegoError("oops"), 500, "api_error", anthropic.InternalServerError),
    ],
)
def test_error_envelope(
    error: LegoError, status: int, kind: str, sdk_error: type[anthropic.APIStatusError]
) -> None:
    got_status, body = AnthropicMessagesAdapter(SIGNER).error_response(copy.copy(error))
    assert got_status == status
    assert orjson.loads(body) == {
        "type": "error",
        "error": {"type": kind, "message": error.message},
    }
    client = sdk(lambda _: httpx.Response(status, content=body))
    with pytest.raises(sdk_error) as raised:
        client.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "x"}])
    assert raised.value.status_code == status
