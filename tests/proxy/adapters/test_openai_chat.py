"""Behaviour of the OpenAI Chat Completions adapter, checked against the official openai SDK.

The SDK is fed the adapter's bytes through ``httpx.MockTransport`` (the seam at the external
edge): what it parses into its typed objects is what a real harness would see.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionMessageFunctionToolCall

from kernel.errors import (
    AuthenticationFailed,
    BackendError,
    BackendUnavailable,
    Conflict,
    ContextLengthExceeded,
    InvalidRequest,
    LegoError,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    RecorderError,
    Unsupported,
)
from proxy.adapters.base import StreamState
from proxy.adapters.openai_chat import OpenAIChatAdapter, models_response
from proxy.canonical import (
    AssistantTurn,
    FinishReason,
    Message,
    OutputEvent,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolChoice,
    ToolChoiceMode,
    TurnFinished,
    Usage,
)

Json = dict[str, Any]

BASH_TOOL: Json = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}, "timeout": {"type": "number"}},
            "required": ["command"],
        },
    },
}

# OpenCode (@ai-sdk/openai-compatible): string system prompt, max_tokens, tool_choice auto,
# streamed with usage, assistant echoed with content "" + reasoning_content + compact arguments.
OPENCODE_BODY: Json = {
    "model": "some-model",
    "max_tokens": 32000,
    "messages": [
        {"role": "system", "content": "You are opencode, an interactive CLI tool."},
        {"role": "user", "content": '"create out.txt containing hello"'},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "I should use bash.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "bash", "arguments": '{"command":"echo hello > out.txt"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "(no output)"},
    ],
    "tools": [BASH_TOOL],
    "tool_choice": "auto",
    "stream": True,
    "stream_options": {"include_usage": True},
}

# OpenHands SDK (litellm): system as a list of text parts, prompt_cache_key, reasoning_effort,
# assistant echoed without a content key, tool results with a name and text parts.
OPENHANDS_BODY: Json = {
    "messages": [
        {
            "role": "system",
            "content": [{"type": "text", "text": "You are OpenHands agent.", "cache_control": {}}],
        },
        {"role": "user", "content": [{"type": "text", "text": "create out.txt containing hello"}]},
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {
                        "name": "terminal",
                        "arguments": '{"command": "echo hello > out.txt", "is_input": false}',
                    },
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "toolu_1",
            "name": "terminal",
            "content": [{"type": "text", "text": "Command "}, {"type": "text", "text": "ran."}],
        },
    ],
    "model": "some-model",
    "prompt_cache_key": "conv-123",
    "reasoning_effort": "high",
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "terminal",
                "description": "Execute a bash command",
                "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
            },
        },
        {"type": "function", "function": {"name": "finish", "description": "Finish"}},
    ],
}

MINIMAL: Json = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def adapter() -> OpenAIChatAdapter:
    return OpenAIChatAdapter()


def encode(body: object) -> bytes:
    return orjson.dumps(body)


def with_changes(base: Json, **changes: object) -> bytes:
    body = copy.deepcopy(base)
    body.update(changes)
    return encode(body)


def sdk_client(handler: Callable[[httpx.Request], httpx.Response]) -> openai.OpenAI:
    # Newer SDKs annotate http_client as httpx2.Client yet accept an httpx.Client at run time
    # (openai._httpx2 keeps that path); httpx is what this project and older SDKs depend on.
    http_client: Any = httpx.Client(transport=httpx.MockTransport(handler))
    return openai.OpenAI(
        api_key="session-key",
        base_url="http://proxy.test/v1",
        max_retries=0,
        http_client=http_client,
    )


def sse_response(frames: list[bytes]) -> Callable[[httpx.Request], httpx.Response]:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, headers={"content-type": "text/event-stream"}, content=iter(frames)
        )

    return handler


def stream_frames(
    adapter: OpenAIChatAdapter, events: list[OutputEvent], *, include_usage: bool
) -> list[bytes]:
    state = StreamState("turn-7", "some-model", 1_700_000_000, include_usage=include_usage)
    frames = adapter.stream_start(state)
    for event in events:
        frames += adapter.stream_event(state, event)
    return frames + adapter.stream_end(state)


def frame_payloads(frames: list[bytes]) -> Iterator[Json]:
    for frame in frames:
        assert frame.startswith(b"data: ")
        assert frame.endswith(b"\n\n")
        data = frame[len(b"data: ") : -2]
        if data != b"[DONE]":
            yield orjson.loads(data)


FINISHED = TurnFinished("turn-7", FinishReason.TOOL_CALLS, Usage(120, 30, reasoning_tokens=9))
TOOL_EVENTS: list[OutputEvent] = [
    ReasoningDelta("Need to "),
    ReasoningDelta("list files."),
    TextDelta("Listing "),
    TextDelta("now."),
    ToolCallDelta(0, ToolCall("call_a", "bash", '{"command": "ls"}')),
    ToolCallDelta(1, ToolCall("call_b", "bash", '{"command":"pwd"}')),
    FINISHED,
]


# -- request: realistic bodies ---------------------------------------------------------------


def test_opencode_request(adapter: OpenAIChatAdapter) -> None:
    req = adapter.parse_request(encode(OPENCODE_BODY))
    assert req.adapter == "openai_chat"
    assert req.model == "some-model"
    assert [m.role for m in req.messages] == ["system", "user", "assistant", "tool"]
    assert req.messages[1].content == '"create out.txt containing hello"'
    assistant = req.messages[2]
    assert assistant.content == ""
    assert assistant.reasoning == "I should use bash."
    assert assistant.tool_calls == (
        ToolCall("call_1", "bash", '{"command":"echo hello > out.txt"}'),
    )
    assert req.messages[3] == Message("tool", "(no output)", tool_call_id="call_1")
    assert req.tools[0].name == "bash"
    assert req.tools[0].description == "Run a shell command"
    assert req.tools[0].parameters["required"] == ["command"]
    assert req.tool_choice == ToolChoice(ToolChoiceMode.AUTO)
    assert req.sampling.max_tokens == 32000
    assert req.stream is True
    assert req.include_usage is True
    assert req.ignored_fields == ()


def test_openhands_request(adapter: OpenAIChatAdapter) -> None:
    req = adapter.parse_request(encode(OPENHANDS_BODY))
    assert req.messages[0] == Message("system", "You are OpenHands agent.")
    assert req.messages[1].content == "create out.txt containing hello"
    assistant = req.messages[2]
    assert assistant.content == ""
    assert assistant.reasoning is None
    assert assistant.tool_calls[0].arguments == (
        '{"command": "echo hello > out.txt", "is_input": false}'
    )
    assert req.messages[3] == Message(
        "tool", "Command ran.", tool_call_id="toolu_1", name="terminal"
    )
    assert [t.name for t in req.tools] == ["terminal", "finish"]
    assert req.tools[1].parameters == {}
    assert req.stream is False
    assert req.include_usage is False
    assert req.ignored_fields == (
        "messages[].content[].cache_control",
        "prompt_cache_key",
        "reasoning_effort",
    )


def test_arguments_are_kept_verbatim(adapter: OpenAIChatAdapter) -> None:
    odd = '{ "b" :1,\n  "a": [ ] }'
    body = copy.deepcopy(OPENCODE_BODY)
    body["messages"][2]["tool_calls"][0]["function"]["arguments"] = odd
    assert adapter.parse_request(encode(body)).messages[2].tool_calls[0].arguments == odd


def test_sampling_fields(adapter: OpenAIChatAdapter) -> None:
    req = adapter.parse_request(
        with_changes(
            MINIMAL,
            max_tokens=100,
            max_completion_tokens=50,
            temperature=0,
            top_p=1,
            top_k=20,
            stop="</s>",
            seed=7,
            n=1,
        )
    )
    s = req.sampling
    assert (s.max_tokens, s.temperature, s.top_p, s.top_k, s.stop, s.seed) == (
        50,
        0.0,
        1.0,
        20,
        ("</s>",),
        7,
    )
    listed = adapter.parse_request(with_changes(MINIMAL, stop=["a", "b"], max_tokens=9))
    assert listed.sampling.stop == ("a", "b")
    assert listed.sampling.max_tokens == 9


def test_defaults_and_nulls(adapter: OpenAIChatAdapter) -> None:
    req = adapter.parse_request(
        with_changes(MINIMAL, n=None, stop=None, stream=None, tool_choice=None)
    )
    assert req.sampling.max_tokens is None
    assert req.sampling.stop == ()
    assert req.tool_choice == ToolChoice()
    assert req.enable_thinking is None
    assert req.stream is False


def test_roles_and_reasoning_alias(adapter: OpenAIChatAdapter) -> None:
    body = with_changes(
        MINIMAL,
        messages=[
            {"role": "developer", "content": "dev rules", "name": "codex"},
            {"role": "user", "content": "hi", "name": "alice"},
            {"role": "assistant", "content": "a", "reasoning": "alias"},
            {"role": "assistant", "content": "b", "reasoning": "x", "reasoning_content": "wins"},
            {"role": "assistant", "content": None, "reasoning_content": ""},
        ],
    )
    msgs = adapter.parse_request(body).messages
    assert msgs[0] == Message("system", "dev rules", name="codex")
    assert msgs[1] == Message("user", "hi", name="alice")
    assert msgs[2].reasoning == "alias"
    assert msgs[3].reasoning == "wins"
    assert msgs[4] == Message("assistant", "", reasoning="")


def test_thinking_and_include_usage(adapter: OpenAIChatAdapter) -> None:
    req = adapter.parse_request(
        with_changes(
            MINIMAL,
            chat_template_kwargs={"enable_thinking": False, "custom": 1},
            stream_options={"include_usage": True},
        )
    )
    assert req.enable_thinking is False
    # include_usage only means something on a stream.
    assert req.include_usage is False
    assert req.ignored_fields == ("chat_template_kwargs.custom",)


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("auto", ToolChoice(ToolChoiceMode.AUTO)),
        ("none", ToolChoice(ToolChoiceMode.NONE)),
        ("required", ToolChoice(ToolChoiceMode.REQUIRED)),
        (
            {"type": "function", "function": {"name": "bash"}},
            ToolChoice(ToolChoiceMode.NAMED, "bash"),
        ),
    ],
)
def test_tool_choice(adapter: OpenAIChatAdapter, choice: object, expected: ToolChoice) -> None:
    req = adapter.parse_request(with_changes(MINIMAL, tools=[BASH_TOOL], tool_choice=choice))
    assert req.tool_choice == expected


def test_ignored_fields_are_recorded(adapter: OpenAIChatAdapter) -> None:
    tool = copy.deepcopy(BASH_TOOL)
    tool["function"]["strict"] = True
    tool["function"]["x_extra"] = 1
    body = with_changes(
        MINIMAL,
        messages=[
            {"role": "user", "content": "hi", "cache_control": {"type": "ephemeral"}},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "c",
                        "type": "function",
                        "function": {"name": "bash", "arguments": "{}", "x_fn": 1},
                        "x_call": 2,
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c", "content": "ok", "reasoning_content": "?"},
        ],
        tools=[tool],
        user="u1",
        metadata={"k": "v"},
        store=False,
        parallel_tool_calls=True,
        service_tier="auto",
        logit_bias={"50256": -100},
        frequency_penalty=0.5,
        presence_penalty=0,
        logprobs=True,
        top_logprobs=5,
        stream=True,
        stream_options={"include_usage": False, "x_opt": True},
        response_format={"type": "text"},
        modalities=["text"],
    )
    assert adapter.parse_request(body).ignored_fields == (
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "messages[].cache_control",
        "messages[].reasoning_content",
        "messages[].tool_calls[].function.x_fn",
        "messages[].tool_calls[].x_call",
        "metadata",
        "modalities",
        "parallel_tool_calls",
        "service_tier",
        "store",
        "stream_options.x_opt",
        "tools[].function.strict",
        "tools[].function.x_extra",
        "top_logprobs",
        "user",
    )


def test_neutral_values_are_not_recorded(adapter: OpenAIChatAdapter) -> None:
    body = with_changes(MINIMAL, frequency_penalty=0, presence_penalty=0.0, logprobs=False)
    assert adapter.parse_request(body).ignored_fields == ()


# -- request: every rejection ----------------------------------------------------------------

TEXT_PART = {"type": "text", "text": "look"}
CALL: Json = {"id": "c", "type": "function", "function": {"name": "bash", "arguments": "{}"}}


def user(content: object) -> list[Json]:
    return [{"role": "user", "content": content}]


REJECTIONS: list[tuple[str, bytes, type[InvalidRequest], str | None]] = [
    ("malformed json", b'{"model": "m", "messages": [', InvalidRequest, None),
    ("empty body", b"", InvalidRequest, None),
    ("not an object", b'["model"]', InvalidRequest, None),
    ("missing model", encode({"messages": MINIMAL["messages"]}), InvalidRequest, "model"),
    ("model not a string", with_changes(MINIMAL, model=3), InvalidRequest, "model"),
    ("missing messages", encode({"model": "m"}), InvalidRequest, "messages"),
    ("empty messages", with_changes(MINIMAL, messages=[]), InvalidRequest, "messages"),
    (
        "unknown role",
        with_changes(MINIMAL, messages=[{"role": "bot", "content": "x"}]),
        InvalidRequest,
        "messages[0].role",
    ),
    (
        "legacy function role",
        with_changes(MINIMAL, messages=[{"role": "function", "name": "f", "content": "x"}]),
        Unsupported,
        "messages[0].role",
    ),
    (
        "legacy function_call in a message",
        with_changes(
            MINIMAL,
            messages=[{"role": "assistant", "content": None, "function_call": {"name": "f"}}],
        ),
        Unsupported,
        "messages[0].function_call",
    ),
    (
        "content a number",
        with_changes(MINIMAL, messages=user(5)),
        InvalidRequest,
        "messages[0].content",
    ),
    (
        "user content null",
        with_changes(MINIMAL, messages=user(None)),
        InvalidRequest,
        "messages[0].content",
    ),
    (
        "text part without text",
        with_changes(MINIMAL, messages=user([{"type": "text"}])),
        InvalidRequest,
        "messages[0].content[0].text",
    ),
    (
        "text part text not a string",
        with_changes(MINIMAL, messages=user([{"type": "text", "text": 1}])),
        InvalidRequest,
        "messages[0].content[0].text",
    ),
    (
        "image part",
        with_changes(
            MINIMAL,
            messages=[
                {"role": "system", "content": "s"},
                {"role": "user", "content": [TEXT_PART, {"type": "image_url", "image_url": {}}]},
            ],
        ),
        Unsupported,
        "messages[1].content[1]",
    ),
    (
        "audio part",
        with_changes(MINIMAL, messages=user([{"type": "input_audio", "input_audio": {}}])),
        Unsupported,
        "messages[0].content[0]",
    ),
    (
        "file part",
        with_changes(MINIMAL, messages=user([TEXT_PART, TEXT_PART, {"type": "file"}])),
        Unsupported,
        "messages[0].content[2]",
    ),
    (
        "unknown part type",
        with_changes(MINIMAL, messages=user([{"type": "video", "text": "x"}])),
        InvalidRequest,
        "messages[0].content[0].type",
    ),
    (
        "tool message without tool_call_id",
        with_changes(MINIMAL, messages=[{"role": "tool", "content": "ok"}]),
        InvalidRequest,
        "messages[0].tool_call_id",
    ),
    (
        "tool_calls on a user message",
        with_changes(MINIMAL, messages=[{"role": "user", "content": "x", "tool_calls": [CALL]}]),
        InvalidRequest,
        "messages[0].tool_calls",
    ),
    (
        "custom tool call",
        with_changes(
            MINIMAL,
            messages=[{"role": "assistant", "tool_calls": [CALL, dict(CALL, type="custom")]}],
        ),
        Unsupported,
        "messages[0].tool_calls[1].type",
    ),
    (
        "arguments as an object",
        with_changes(
            MINIMAL,
            messages=[
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "c", "type": "function", "function": {"name": "b", "arguments": {}}}
                    ],
                }
            ],
        ),
        InvalidRequest,
        "messages[0].tool_calls[0].function.arguments",
    ),
    (
        "tool call without id",
        with_changes(
            MINIMAL,
            messages=[
                {"role": "assistant", "tool_calls": [{"function": {"name": "b", "arguments": ""}}]}
            ],
        ),
        InvalidRequest,
        "messages[0].tool_calls[0].id",
    ),
    (
        "legacy functions",
        with_changes(MINIMAL, functions=[{"name": "f"}]),
        Unsupported,
        "functions",
    ),
    (
        "legacy function_call",
        with_changes(MINIMAL, function_call="auto"),
        Unsupported,
        "function_call",
    ),
    (
        "non-function tool",
        with_changes(MINIMAL, tools=[{"type": "web_search"}]),
        Unsupported,
        "tools[0].type",
    ),
    (
        "function tool without function",
        with_changes(MINIMAL, tools=[BASH_TOOL, {"type": "function"}]),
        InvalidRequest,
        "tools[1].function",
    ),
    (
        "tool without a name",
        with_changes(MINIMAL, tools=[{"type": "function", "function": {"description": "d"}}]),
        InvalidRequest,
        "tools[0].function.name",
    ),
    (
        "tool parameters not an object",
        with_changes(
            MINIMAL, tools=[{"type": "function", "function": {"name": "a", "parameters": []}}]
        ),
        InvalidRequest,
        "tools[0].function.parameters",
    ),
    (
        "duplicate tool names",
        with_changes(MINIMAL, tools=[BASH_TOOL, BASH_TOOL]),
        InvalidRequest,
        "tools[1].function.name",
    ),
    (
        "unknown tool_choice string",
        with_changes(MINIMAL, tools=[BASH_TOOL], tool_choice="any"),
        InvalidRequest,
        "tool_choice",
    ),
    (
        "tool_choice a number",
        with_changes(MINIMAL, tools=[BASH_TOOL], tool_choice=1),
        InvalidRequest,
        "tool_choice",
    ),
    (
        "named tool not among tools",
        with_changes(
            MINIMAL, tools=[BASH_TOOL], tool_choice={"type": "function", "function": {"name": "x"}}
        ),
        InvalidRequest,
        "tool_choice.function.name",
    ),
    (
        "named tool without function",
        with_changes(MINIMAL, tools=[BASH_TOOL], tool_choice={"type": "function"}),
        InvalidRequest,
        "tool_choice.function",
    ),
    (
        "allowed_tools tool_choice",
        with_changes(MINIMAL, tools=[BASH_TOOL], tool_choice={"type": "allowed_tools"}),
        Unsupported,
        "tool_choice.type",
    ),
    (
        "required without tools",
        with_changes(MINIMAL, tool_choice="required"),
        InvalidRequest,
        "tool_choice",
    ),
    ("max_tokens zero", with_changes(MINIMAL, max_tokens=0), InvalidRequest, "max_tokens"),
    ("max_tokens a string", with_changes(MINIMAL, max_tokens="5"), InvalidRequest, "max_tokens"),
    (
        "max_completion_tokens zero",
        with_changes(MINIMAL, max_tokens=5, max_completion_tokens=0),
        InvalidRequest,
        "max_completion_tokens",
    ),
    ("temperature too high", with_changes(MINIMAL, temperature=2.5), InvalidRequest, "temperature"),
    (
        "temperature negative",
        with_changes(MINIMAL, temperature=-0.1),
        InvalidRequest,
        "temperature",
    ),
    ("top_p zero", with_changes(MINIMAL, top_p=0), InvalidRequest, "top_p"),
    ("top_p above one", with_changes(MINIMAL, top_p=1.01), InvalidRequest, "top_p"),
    ("top_k a float", with_changes(MINIMAL, top_k=1.5), InvalidRequest, "top_k"),
    ("five stops", with_changes(MINIMAL, stop=["a", "b", "c", "d", "e"]), InvalidRequest, "stop"),
    ("stop a number", with_changes(MINIMAL, stop=1), InvalidRequest, "stop"),
    ("stop list of numbers", with_changes(MINIMAL, stop=["a", 2]), InvalidRequest, "stop[1]"),
    ("seed a string", with_changes(MINIMAL, seed="7"), InvalidRequest, "seed"),
    ("n two", with_changes(MINIMAL, n=2), Unsupported, "n"),
    ("n zero", with_changes(MINIMAL, n=0), InvalidRequest, "n"),
    ("stream a string", with_changes(MINIMAL, stream="yes"), InvalidRequest, "stream"),
    (
        "include_usage a string",
        with_changes(MINIMAL, stream=True, stream_options={"include_usage": "true"}),
        InvalidRequest,
        "stream_options.include_usage",
    ),
    (
        "enable_thinking a string",
        with_changes(MINIMAL, chat_template_kwargs={"enable_thinking": "no"}),
        InvalidRequest,
        "chat_template_kwargs.enable_thinking",
    ),
    (
        "json_schema output",
        with_changes(MINIMAL, response_format={"type": "json_schema", "json_schema": {}}),
        Unsupported,
        "response_format.type",
    ),
    (
        "json_object output",
        with_changes(MINIMAL, response_format={"type": "json_object"}),
        Unsupported,
        "response_format.type",
    ),
    (
        "unknown output format",
        with_changes(MINIMAL, response_format={"type": "xml"}),
        InvalidRequest,
        "response_format.type",
    ),
    (
        "penalty out of range",
        with_changes(MINIMAL, presence_penalty=3),
        InvalidRequest,
        "presence_penalty",
    ),
]


@pytest.mark.parametrize(
    ("body", "kind", "param"),
    [pytest.param(body, kind, param, id=case) for case, body, kind, param in REJECTIONS],
)
def test_rejections(
    adapter: OpenAIChatAdapter, body: bytes, kind: type[InvalidRequest], param: str | None
) -> None:
    with pytest.raises(InvalidRequest) as caught:
        adapter.parse_request(body)
    error = caught.value
    assert type(error) is kind
    assert error.param == param
    assert error.message
    status, raw = adapter.error_response(error)
    assert status == 400
    assert orjson.loads(raw) == {
        "error": {
            "message": error.message,
            "type": "invalid_request_error",
            "param": param,
            "code": "unsupported_option" if kind is Unsupported else "invalid_request_error",
        }
    }


def test_rejection_messages_are_readable(adapter: OpenAIChatAdapter) -> None:
    def message(body: bytes) -> str:
        with pytest.raises(InvalidRequest) as caught:
            adapter.parse_request(body)
        return caught.value.message

    assert message(b"{").startswith("could not parse the JSON body")
    assert message(encode({"messages": []})) == "missing required parameter 'model'"
    assert message(with_changes(MINIMAL, max_tokens="5")) == (
        "invalid value for 'max_tokens': input should be a valid integer"
    )
    assert message(with_changes(MINIMAL, top_p=0, seed="x")).endswith("(and 1 more problem(s))")
    assert "text only" in message(with_changes(MINIMAL, messages=user([{"type": "image_url"}])))


# -- non-streaming response ------------------------------------------------------------------


def tool_turn() -> AssistantTurn:
    message = Message(
        "assistant",
        "",
        reasoning="Need to list files.",
        tool_calls=(
            ToolCall("call_a", "bash", '{"command": "ls"}'),
            ToolCall("call_b", "bash", '{"command":"pwd"}'),
        ),
    )
    return AssistantTurn("turn-1", message, FinishReason.TOOL_CALLS, Usage(120, 30, 9))


def test_render_text_response(adapter: OpenAIChatAdapter) -> None:
    turn = AssistantTurn("turn-1", Message("assistant", "Done."), FinishReason.STOP, Usage(100, 5))
    body = orjson.loads(adapter.render_response(turn, model="claude-sonnet-4-5", created=123))
    assert body == {
        "id": "chatcmpl-turn-1",
        "object": "chat.completion",
        "created": 123,
        "model": "claude-sonnet-4-5",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Done.", "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": 100,
            "completion_tokens": 5,
            "total_tokens": 105,
            "completion_tokens_details": {"reasoning_tokens": 0},
        },
        "system_fingerprint": None,
    }


def test_render_tool_call_response(adapter: OpenAIChatAdapter) -> None:
    body = orjson.loads(adapter.render_response(tool_turn(), model="m", created=1))
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    assert choice["message"]["reasoning_content"] == "Need to list files."
    assert choice["message"]["tool_calls"][1] == {
        "id": "call_b",
        "type": "function",
        "function": {"name": "bash", "arguments": '{"command":"pwd"}'},
    }


def test_length_finish_keeps_empty_content(adapter: OpenAIChatAdapter) -> None:
    turn = AssistantTurn("t", Message("assistant", ""), FinishReason.LENGTH, Usage(1, 4))
    choice = orjson.loads(adapter.render_response(turn, model="m", created=1))["choices"][0]
    assert choice["message"]["content"] == ""
    assert choice["finish_reason"] == "length"


def test_sdk_parses_the_response(adapter: OpenAIChatAdapter) -> None:
    raw = adapter.render_response(tool_turn(), model="some-model", created=1_700_000_000)
    client = sdk_client(lambda request: httpx.Response(200, content=raw))
    completion = client.chat.completions.create(
        model="some-model", messages=[{"role": "user", "content": "hi"}]
    )
    assert isinstance(completion, ChatCompletion)
    assert completion.id == "chatcmpl-turn-1"
    assert completion.model == "some-model"
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = [
        call
        for call in choice.message.tool_calls or []
        if isinstance(call, ChatCompletionMessageFunctionToolCall)
    ]
    assert [(c.id, c.function.name, c.function.arguments) for c in calls] == [
        ("call_a", "bash", '{"command": "ls"}'),
        ("call_b", "bash", '{"command":"pwd"}'),
    ]
    assert getattr(choice.message, "reasoning_content", None) == "Need to list files."
    assert completion.usage is not None
    assert completion.usage.total_tokens == 150
    assert completion.usage.completion_tokens_details is not None
    assert completion.usage.completion_tokens_details.reasoning_tokens == 9


# -- streaming response ------------------------------------------------------------------------


def test_stream_frames(adapter: OpenAIChatAdapter) -> None:
    frames = stream_frames(adapter, TOOL_EVENTS, include_usage=True)
    assert frames[-1] == b"data: [DONE]\n\n"
    chunks = list(frame_payloads(frames))
    assert {(c["id"], c["created"], c["model"], c["object"]) for c in chunks} == {
        ("chatcmpl-turn-7", 1_700_000_000, "some-model", "chat.completion.chunk")
    }
    deltas = [c["choices"][0]["delta"] for c in chunks[:-1]]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert deltas[1:5] == [
        {"reasoning_content": "Need to "},
        {"reasoning_content": "list files."},
        {"content": "Listing "},
        {"content": "now."},
    ]
    assert deltas[5] == {
        "tool_calls": [
            {
                "index": 0,
                "id": "call_a",
                "type": "function",
                "function": {"name": "bash", "arguments": '{"command": "ls"}'},
            }
        ]
    }
    assert deltas[7] == {}
    assert chunks[7]["choices"][0]["finish_reason"] == "tool_calls"
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {
        "prompt_tokens": 120,
        "completion_tokens": 30,
        "total_tokens": 150,
        "completion_tokens_details": {"reasoning_tokens": 9},
    }


def test_stream_without_usage(adapter: OpenAIChatAdapter) -> None:
    events: list[OutputEvent] = [
        TextDelta(""),
        TextDelta("Hi"),
        TurnFinished("t", FinishReason.STOP, Usage(3, 2)),
    ]
    chunks = list(frame_payloads(stream_frames(adapter, events, include_usage=False)))
    assert len(chunks) == 3  # role, "Hi", finish: the empty delta makes no frame
    assert all("usage" not in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_stream_id_is_not_prefixed_twice(adapter: OpenAIChatAdapter) -> None:
    state = StreamState("chatcmpl-abc", "m", 1)
    (chunk,) = frame_payloads(adapter.stream_start(state))
    assert chunk["id"] == "chatcmpl-abc"


def test_sdk_accumulates_the_stream(adapter: OpenAIChatAdapter) -> None:
    client = sdk_client(sse_response(stream_frames(adapter, TOOL_EVENTS, include_usage=True)))
    with client.chat.completions.stream(
        model="some-model", messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        final = stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Listing now."
    calls = choice.message.tool_calls or []
    assert [(c.id, c.function.name, c.function.arguments) for c in calls] == [
        ("call_a", "bash", '{"command": "ls"}'),
        ("call_b", "bash", '{"command":"pwd"}'),
    ]
    assert final.usage is not None
    assert final.usage.completion_tokens == 30


def test_sdk_reads_raw_chunks(adapter: OpenAIChatAdapter) -> None:
    client = sdk_client(sse_response(stream_frames(adapter, TOOL_EVENTS, include_usage=True)))
    chunks = list(
        client.chat.completions.create(
            model="some-model", messages=[{"role": "user", "content": "hi"}], stream=True
        )
    )
    assert len(chunks) == 9
    reasoning = "".join(
        getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices
    )
    assert reasoning == "Need to list files."
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == 120


# -- errors --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "status", "kind"),
    [
        (InvalidRequest("bad"), 400, "invalid_request_error"),
        (Unsupported("no"), 400, "invalid_request_error"),
        (ContextLengthExceeded("long"), 400, "invalid_request_error"),
        (AuthenticationFailed("who"), 401, "authentication_error"),
        (PermissionDenied("no"), 403, "permission_error"),
        (NotFound("gone"), 404, "not_found_error"),
        (Conflict("done"), 409, "invalid_request_error"),
        (PayloadTooLarge("big"), 413, "invalid_request_error"),
        (BackendError("boom"), 502, "server_error"),
        (BackendError("boom", retryable=False), 502, "api_error"),
        (BackendUnavailable("down"), 503, "server_error"),
        (RecorderError("db"), 500, "server_error"),
        (LegoError("oops"), 500, "server_error"),
    ],
)
def test_error_response(
    adapter: OpenAIChatAdapter, error: LegoError, status: int, kind: str
) -> None:
    got_status, raw = adapter.error_response(error)
    assert got_status == status
    assert orjson.loads(raw) == {
        "error": {"message": error.message, "type": kind, "param": None, "code": error.code}
    }


def test_sdk_raises_typed_errors(adapter: OpenAIChatAdapter) -> None:
    status, raw = adapter.error_response(Unsupported("n must be 1", param="n"))
    client = sdk_client(lambda request: httpx.Response(status, content=raw))
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert caught.value.code == "unsupported_option"
    assert caught.value.param == "n"
    assert caught.value.type == "invalid_request_error"

    status, raw = adapter.error_response(AuthenticationFailed("unknown session key"))
    client = sdk_client(lambda request: httpx.Response(status, content=raw))
    with pytest.raises(openai.AuthenticationError, match="unknown session key"):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])


def test_stream_error_frame(adapter: OpenAIChatAdapter) -> None:
    state = StreamState("t", "m", 1, include_usage=True)
    frames = adapter.stream_error(state, BackendUnavailable("backend went away"))
    assert len(frames) == 1
    assert b"[DONE]" not in frames[0]
    assert list(frame_payloads(frames)) == [
        {
            "error": {
                "message": "backend went away",
                "type": "server_error",
                "param": None,
                "code": "backend_unavailable",
            }
        }
    ]


def test_sdk_raises_on_stream_error(adapter: OpenAIChatAdapter) -> None:
    state = StreamState("t", "some-model", 1)
    frames = adapter.stream_start(state) + adapter.stream_event(state, TextDelta("partial"))
    frames += adapter.stream_error(state, BackendError("backend failed mid-turn"))
    client = sdk_client(sse_response(frames))
    stream = client.chat.completions.create(
        model="some-model", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    received = [next(stream).choices[0].delta.content, next(stream).choices[0].delta.content]
    assert received == ["", "partial"]
    with pytest.raises(openai.APIError, match="backend failed mid-turn") as caught:
        next(stream)
    assert caught.value.code == "backend_error"
    assert caught.value.type == "server_error"


# -- models list ---------------------------------------------------------------------------------


def test_models_response_parses_in_the_sdk() -> None:
    raw = models_response(["some-model", "claude-sonnet-4-5"], created=42)
    assert orjson.loads(raw)["data"][0] == {
        "id": "some-model",
        "object": "model",
        "created": 42,
        "owned_by": "lego-proxy",
    }
    client = sdk_client(lambda request: httpx.Response(200, content=raw))
    models = list(client.models.list())
    assert [(m.id, m.owned_by) for m in models] == [
        ("some-model", "lego-proxy"),
        ("claude-sonnet-4-5", "lego-proxy"),
    ]
