"""Behaviour of the OpenAI Responses adapter, checked against the official openai SDK.

The SDK is fed the adapter's bytes through ``httpx.MockTransport`` (the seam at the external
edge): what it parses and accumulates is what Codex or an SDK user would see.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import openai
import orjson
import pytest

from kernel.errors import (
    AuthenticationFailed,
    BackendError,
    BackendUnavailable,
    InvalidRequest,
    LegoError,
    NotFound,
    Unsupported,
)
from proxy.adapters.base import StreamState
from proxy.adapters.openai_responses import OpenAIResponsesAdapter, continue_from
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
EXEC: Json = {
    "type": "function",
    "name": "exec_command",
    "description": "Run a command",
    "strict": False,
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
}

# Codex CLI: no instructions, developer items, ids on every item, store false, reasoning
# echoed with encrypted_content and content null, arguments echoed verbatim.
CODEX_BODY: Json = {
    "model": "some-model",
    "stream": True,
    "input": [
        {
            "type": "message",
            "role": "developer",
            "id": "i1",
            "content": [{"type": "input_text", "text": "You are Codex."}],
        },
        {
            "type": "message",
            "role": "user",
            "id": "i2",
            "content": [{"type": "input_text", "text": "create out.txt"}],
        },
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [],
            "content": None,
            "encrypted_content": SIGNER.seal("Use exec."),
        },
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "exec_command",
            "arguments": '{"cmd": "echo hi"}',
        },
        {
            "type": "function_call_output",
            "id": "o1",
            "call_id": "call_1",
            "output": "Process exited with code 0",
        },
    ],
    "tools": [EXEC],
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "reasoning": {"summary": "auto"},
    "store": False,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "s1",
    "client_metadata": {"x": "y"},
}


def parse(body: Json) -> Any:
    return OpenAIResponsesAdapter(SIGNER).parse_request(orjson.dumps(body))


def sdk(handler: Callable[[httpx.Request], httpx.Response]) -> openai.OpenAI:
    http_client: Any = httpx.Client(transport=httpx.MockTransport(handler))
    return openai.OpenAI(
        api_key="k", base_url="http://proxy.test/v1", max_retries=0, http_client=http_client
    )


def streamed(events: list[OutputEvent], *, error: LegoError | None = None) -> list[bytes]:
    adapter = OpenAIResponsesAdapter(SIGNER)
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


def finished(reason: FinishReason) -> TurnFinished:
    return TurnFinished("turn1", reason, Usage(12, 7, 3))


# -- request ------------------------------------------------------------------------------------


def test_codex_request_becomes_canonical() -> None:
    request = parse(CODEX_BODY)
    assert [m.role for m in request.messages] == ["system", "user", "assistant", "tool"]
    assistant = request.messages[2]
    assert assistant.reasoning == "Use exec."
    assert assistant.tool_calls == (ToolCall("call_1", "exec_command", '{"cmd": "echo hi"}'),)
    assert request.messages[3] == Message(
        "tool", "Process exited with code 0", tool_call_id="call_1"
    )
    assert request.store is False
    assert request.instructions is None
    for field in (
        "parallel_tool_calls",
        "include",
        "prompt_cache_key",
        "client_metadata",
        "reasoning.summary",
        "input[].id",
    ):
        assert field in request.ignored_fields
    assert "tools[].strict" not in request.ignored_fields  # strict: false asks for nothing


def test_items_fold_into_assistant_messages() -> None:
    request = parse(
        {
            "model": "m",
            "instructions": "Be brief.",
            "input": [
                {"role": "user", "content": "go"},
                {
                    "type": "reasoning",
                    "summary": [],
                    "content": [{"type": "reasoning_text", "text": "A"}],
                },
                {"role": "assistant", "content": [{"type": "output_text", "text": "first"}]},
                {"type": "reasoning", "summary": [{"type": "summary_text", "text": "sum"}]},
                {"role": "assistant", "content": "second"},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"},
                {"role": "assistant", "content": "after calls"},
            ],
        }
    )
    system, user, one, two, three = request.messages
    assert system == Message("system", "Be brief.")
    assert user == Message("user", "go")
    assert one == Message("assistant", "first", "A")
    assert two.content == "second"
    assert two.reasoning is None  # a summary is not what the model sampled
    assert [c.id for c in two.tool_calls] == ["c1", "c2"]
    assert three == Message("assistant", "after calls")
    assert request.instructions == "Be brief."


def test_sampling_and_tool_choice_mapping() -> None:
    request = parse(
        {
            "model": "m",
            "input": "hi",
            "tools": [EXEC],
            "tool_choice": {"type": "function", "name": "exec_command"},
            "max_output_tokens": 99,
            "temperature": 0.3,
            "top_p": 0.8,
            "reasoning": {"effort": "none"},
        }
    )
    assert request.messages == (Message("user", "hi"),)
    assert request.tool_choice.mode is ToolChoiceMode.NAMED
    assert request.tool_choice.name == "exec_command"
    assert (request.sampling.max_tokens, request.sampling.temperature) == (99, 0.3)
    assert request.sampling.top_p == 0.8
    assert request.enable_thinking is False
    assert (
        parse(
            {"model": "m", "input": "x", "tools": [EXEC], "tool_choice": "required"}
        ).tool_choice.mode
        is ToolChoiceMode.REQUIRED
    )


def test_continue_from_replaces_instructions() -> None:
    prior = parse({"model": "m", "instructions": "Old.", "input": "q1"})
    answer = Message("assistant", "a1", "thought")
    new = parse(
        {"model": "m", "instructions": "New.", "input": "q2", "previous_response_id": "resp_x"}
    )
    merged = continue_from(prior, answer, new)
    assert merged.messages == (
        Message("system", "New."),
        Message("user", "q1"),
        answer,
        Message("user", "q2"),
    )
    bare = parse({"model": "m", "input": "q2", "previous_response_id": "resp_x"})
    assert continue_from(prior, answer, bare).messages[0] == Message("user", "q1")


@pytest.mark.parametrize(
    ("body", "error", "param"),
    [
        ({"model": "m"}, InvalidRequest, "input"),
        ({"model": "m", "input": 5}, InvalidRequest, "input"),
        ({"model": "m", "input": []}, InvalidRequest, "input"),
        ({"model": "m", "input": "x", "max_output_tokens": 0}, InvalidRequest, "max_output_tokens"),
        ({"model": "m", "input": "x", "tools": [EXEC, EXEC]}, InvalidRequest, "tools[1].name"),
        (
            {"model": "m", "input": "x", "tool_choice": {"type": "web_search"}, "tools": [EXEC]},
            Unsupported,
            "tool_choice.type",
        ),
        (
            {
                "model": "m",
                "input": "x",
                "tool_choice": {"type": "function", "name": "nope"},
                "tools": [EXEC],
            },
            InvalidRequest,
            "tool_choice.name",
        ),
        (
            {"model": "m", "input": "x", "text": {"format": {"type": "json_schema"}}},
            Unsupported,
            "text.format.type",
        ),
        ({"model": "m", "input": "x", "conversation": "conv_1"}, Unsupported, "conversation"),
        ({"model": "m", "input": "x", "background": True}, Unsupported, "background"),
        ({"model": "m", "input": [{"type": "item_reference", "id": "x"}]}, Unsupported, "input[0]"),
        ({"model": "m", "input": [{"type": "web_search_call"}]}, Unsupported, "input[0].type"),
        ({"model": "m", "input": [{"content": "x"}]}, InvalidRequest, "input[0].role"),
        (
            {"model": "m", "input": [{"role": "user", "content": [{"type": "input_image"}]}]},
            Unsupported,
            "input[0].content[0]",
        ),
        (
            {"model": "m", "input": [{"type": "function_call", "call_id": "c", "name": "f"}]},
            InvalidRequest,
            "input[0].arguments",
        ),
        (
            {"model": "m", "input": [{"type": "function_call_output", "output": "o"}]},
            InvalidRequest,
            "input[0].call_id",
        ),
        (
            {
                "model": "m",
                "input": [{"type": "reasoning", "summary": [], "encrypted_content": "gAAAA"}],
            },
            InvalidRequest,
            "input[0].encrypted_content",
        ),
    ],
)
def test_bad_input_names_the_field(body: Json, error: type[LegoError], param: str) -> None:
    with pytest.raises(error) as raised:
        parse(body)
    assert type(raised.value) is error
    assert raised.value.param == param


def test_tampered_sealed_reasoning_is_refused() -> None:
    sealed = SIGNER.seal("mine")
    other = ReasoningSigner(b"another-secret").seal("mine")
    item = {"type": "reasoning", "summary": [], "encrypted_content": sealed}
    assert parse({"model": "m", "input": [item]}).messages[0].reasoning == "mine"
    with pytest.raises(InvalidRequest):
        parse({"model": "m", "input": [item | {"encrypted_content": other}]})


# -- non-streaming response ---------------------------------------------------------------------


def test_sdk_reads_a_whole_answer_and_it_round_trips() -> None:
    call = ToolCall("call_9", "exec_command", '{"cmd":  "ls"}')
    turn = AssistantTurn(
        "turn9",
        Message("assistant", "Listing.", "Need ls.", (call,)),
        FinishReason.TOOL_CALLS,
        Usage(40, 9, 4),
    )
    body = OpenAIResponsesAdapter(SIGNER).render_response(turn, model="some-model", created=1)
    reply = sdk(lambda _: httpx.Response(200, content=body)).responses.create(
        model="some-model", input="x"
    )
    assert reply.id == "resp_turn9"
    assert reply.status == "completed"
    assert reply.output_text == "Listing."
    assert [item.type for item in reply.output] == ["reasoning", "message", "function_call"]
    function_call = reply.output[2]
    assert function_call.type == "function_call"
    assert function_call.arguments == call.arguments
    assert reply.usage is not None
    assert reply.usage.output_tokens_details.reasoning_tokens == 4
    echoed = [item.model_dump(exclude_none=True) for item in reply.output]
    request = parse({"model": "m", "input": echoed})
    assert request.messages == (turn.message,)


def test_length_cut_answer_is_incomplete() -> None:
    turn = AssistantTurn("t", Message("assistant", "cut"), FinishReason.LENGTH, Usage(1, 1))
    body = orjson.loads(OpenAIResponsesAdapter(SIGNER).render_response(turn, model="m", created=1))
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}


# -- streaming response -------------------------------------------------------------------------


def test_sdk_accumulates_a_stream() -> None:
    call = ToolCall("call_2", "exec_command", '{"cmd": "pwd"}')
    events: list[OutputEvent] = [
        ReasoningDelta("Think"),
        ReasoningDelta("ing."),
        TextDelta("Run"),
        TextDelta("ning."),
        ToolCallDelta(0, call),
        finished(FinishReason.TOOL_CALLS),
    ]
    with sdk(sse(streamed(events))).responses.stream(model="m", input="x") as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    reasoning, message, function_call = final.output
    assert reasoning.type == "reasoning"
    assert reasoning.encrypted_content is not None
    assert SIGNER.unseal(reasoning.encrypted_content, param="x") == "Thinking."
    assert message.type == "message"
    assert final.output_text == "Running."
    assert function_call.type == "function_call"
    assert function_call.arguments == call.arguments
    assert final.usage is not None
    assert final.usage.input_tokens == 12


def test_stream_golden_frames() -> None:
    frames = streamed([TextDelta("Hi"), TextDelta("!"), finished(FinishReason.STOP)])
    data = [orjson.loads(f.split(b"data: ", 1)[1]) for f in frames if b"data: " in f]
    assert [d["type"] for d in data] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [d["sequence_number"] for d in data] == list(range(len(data)))
    assert b": ping\n\n" in frames
    assert data[6]["text"] == "Hi!"
    assert data[-1]["response"]["id"] == "resp_turn1"


def test_in_band_error_makes_the_sdk_raise() -> None:
    frames = streamed([TextDelta("partial")], error=BackendError("backend broke"))
    seen: list[str] = []
    with (
        pytest.raises(openai.APIError) as raised,
        sdk(sse(frames)).responses.stream(model="m", input="x") as stream,
    ):
        seen.extend(event.type for event in stream)
    assert seen[-1] == "response.failed"
    assert raised.value.message == "backend broke"


# -- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "status", "kind", "sdk_error"),
    [
        (
            InvalidRequest("bad", param="input"),
            400,
            "invalid_request_error",
            openai.BadRequestError,
        ),
        (AuthenticationFailed("who"), 401, "authentication_error", openai.AuthenticationError),
        (
            NotFound("gone", param="previous_response_id"),
            404,
            "not_found_error",
            openai.NotFoundError,
        ),
        (BackendError("boom"), 502, "server_error", openai.InternalServerError),
        (BackendUnavailable("down"), 503, "server_error", openai.InternalServerError),
    ],
)
def test_error_envelope(
    error: LegoError, status: int, kind: str, sdk_error: type[openai.APIStatusError]
) -> None:
    got_status, body = OpenAIResponsesAdapter(SIGNER).error_response(error)
    assert got_status == status
    assert orjson.loads(body) == {
        "error": {"message": error.message, "type": kind, "param": error.param, "code": error.code}
    }
    with pytest.raises(sdk_error) as raised:
        sdk(lambda _: httpx.Response(status, content=body)).responses.create(model="m", input="x")
    assert raised.value.code == error.code
