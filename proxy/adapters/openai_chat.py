"""OpenAI Chat Completions wire adapter (``POST /v1/chat/completions``, ``GET /v1/models``).

Owns the translation between OpenAI's Chat Completions JSON and the canonical form, and
nothing else: no IO, no database, no backend. ``OpenAIChatAdapter`` implements
``proxy.adapters.base.Adapter``.

Contract:
- Requests are validated strictly by type (``"5"`` is not an integer) but accept unknown
  fields; every unknown or deliberately unused field is named in ``ChatRequest.ignored_fields``
  (``messages[].cache_control``, ``tools[].function.strict``, ``user``, ...).
- Every rejection is an ``InvalidRequest`` whose ``param`` is the JSON path of the offending
  field (``messages[0].content[1]``); options lego-proxy does not serve (images, ``n > 1``,
  structured output, non-function tools, the legacy ``function`` role) raise ``Unsupported``.
- Tool-call ``arguments`` cross the adapter verbatim in both directions.
- Response and chunk ids are ``"chatcmpl-" + turn_id`` (non-streaming) and
  ``"chatcmpl-" + StreamState.response_id`` (streaming; not prefixed twice).
- A stream is: a role chunk, one chunk per output event, a ``finish_reason`` chunk, a
  ``choices: []`` usage chunk when ``include_usage``, then ``data: [DONE]``. An error after the
  stream started is one ``data: {"error": ...}`` frame and nothing after it, which makes the
  official ``openai`` SDK raise ``APIError``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Literal

import orjson
from pydantic import Field, JsonValue, Tag, ValidationError

from kernel.errors import InvalidRequest, LegoError, Unsupported
from proxy.adapters.base import StreamState
from proxy.adapters.openai_errors import error_object
from proxy.adapters.sse import sse_frame
from proxy.adapters.wire import (
    Name,
    Wire,
    ignored_extras,
    invalid,
    missing,
    one_of,
    refuse_unstorable,
)
from proxy.canonical import (
    AssistantTurn,
    ChatRequest,
    Message,
    OutputEvent,
    SamplingRequest,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolChoice,
    ToolChoiceMode,
    ToolSpec,
    TurnFinished,
    Usage,
)
from proxy.sampling_rules import TopK

# -- wire models: request --------------------------------------------------------------------


class _ContentPart(Wire):
    type: str
    text: str | None = None


_Content = Annotated[
    Annotated[str, Tag("~str")] | Annotated[list[_ContentPart], Tag("~list")],
    one_of("Input should be a string or an array of content parts"),
]


class _FunctionCall(Wire):
    name: str
    arguments: str


class _ToolCall(Wire):
    id: str
    type: str = "function"
    function: _FunctionCall


class _Message(Wire):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: _Content | None = None
    name: str | None = None
    tool_calls: list[_ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    function_call: JsonValue = None


class _FunctionDef(Wire):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, JsonValue] | None = None
    strict: bool | None = None


class _Tool(Wire):
    type: str
    function: _FunctionDef | None = None


class _NamedFunction(Wire):
    name: str


class _NamedToolChoice(Wire):
    type: str
    function: _NamedFunction | None = None


_ToolChoiceWire = Annotated[
    Annotated[Literal["auto", "none", "required"], Tag("~str")]
    | Annotated[_NamedToolChoice, Tag("~object")],
    one_of("Input should be 'auto', 'none', 'required' or a named function choice"),
]

_Stop = Annotated[
    Annotated[Name, Tag("~str")] | Annotated[list[Name], Tag("~list"), Field(max_length=4)],
    one_of("Input should be a string or an array of up to 4 strings"),
]


class _StreamOptions(Wire):
    include_usage: bool | None = None


class _ChatTemplateKwargs(Wire):
    enable_thinking: bool | None = None


class _ResponseFormat(Wire):
    type: str


class _Body(Wire):
    model: Name
    messages: list[_Message]
    tools: list[_Tool] | None = None
    tool_choice: _ToolChoiceWire | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: TopK | None = None  # SGLang/vLLM extension, with SGLang's rule
    stop: _Stop | None = None
    seed: int | None = None
    n: int | None = Field(default=None, ge=1)
    stream: bool | None = None
    stream_options: _StreamOptions | None = None
    chat_template_kwargs: _ChatTemplateKwargs | None = None  # SGLang/vLLM extension
    response_format: _ResponseFormat | None = None
    # Accepted and recorded as ignored: the proxy serves one policy and returns no logprobs.
    user: str | None = None
    metadata: JsonValue = None
    store: bool | None = None
    prompt_cache_key: str | None = None
    reasoning_effort: str | None = None
    parallel_tool_calls: bool | None = None
    service_tier: str | None = None
    logit_bias: dict[str, float] | None = None
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    # Legacy function calling, refused rather than silently dropped.
    functions: JsonValue = None
    function_call: JsonValue = None


_UNUSED_FIELDS = (
    "user",
    "metadata",
    "store",
    "prompt_cache_key",
    "reasoning_effort",
    "parallel_tool_calls",
    "service_tier",
    "logit_bias",
    "top_logprobs",
)
_UNUSED_UNLESS_NEUTRAL = ("frequency_penalty", "presence_penalty", "logprobs")

# -- request: validation errors ---------------------------------------------------------------


def _only_function(what: str, kind: str, param: str) -> Unsupported:
    return Unsupported(f"{what} type '{kind}' is not supported; only 'function'", param=param)


def _ignored_known(body: _Body) -> set[str]:
    found = {name for name in _UNUSED_FIELDS if getattr(body, name) is not None}
    # Neutral values ask for nothing the proxy fails to do.
    found |= {name for name in _UNUSED_UNLESS_NEUTRAL if getattr(body, name)}
    if any(tool.function is not None and tool.function.strict for tool in body.tools or ()):
        found.add("tools[].function.strict")
    return found


# -- request: translation ----------------------------------------------------------------------

_NON_TEXT_PARTS = frozenset({"image_url", "input_audio", "file"})


def _text(content: str | list[_ContentPart] | None, param: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    texts: list[str] = []
    for j, part in enumerate(content):
        if part.type in _NON_TEXT_PARTS:
            raise Unsupported("this model accepts text only", param=f"{param}[{j}]")
        if part.type != "text":
            raise InvalidRequest(
                f"invalid value for '{param}[{j}].type': expected 'text', got '{part.type}'",
                param=f"{param}[{j}].type",
            )
        if part.text is None:
            raise missing(f"{param}[{j}].text")
        texts.append(part.text)
    return "".join(texts)


def _tool_call(call: _ToolCall, param: str) -> ToolCall:
    if call.type != "function":
        raise _only_function("tool call", call.type, f"{param}.type")
    return ToolCall(id=call.id, name=call.function.name, arguments=call.function.arguments)


def _message(msg: _Message, i: int, ignored: set[str]) -> Message:
    param = f"messages[{i}]"
    if msg.role == "function" or msg.function_call is not None:
        raise Unsupported(
            "legacy function calling is not supported; use 'tools' and the 'tool' role",
            param=f"{param}.role" if msg.role == "function" else f"{param}.function_call",
        )
    if msg.tool_calls and msg.role != "assistant":
        raise InvalidRequest(
            f"only assistant messages may carry 'tool_calls', not '{msg.role}'",
            param=f"{param}.tool_calls",
        )
    if msg.content is None and msg.role != "assistant":
        raise missing(f"{param}.content")
    content = _text(msg.content, f"{param}.content")
    if msg.role == "assistant":
        calls = tuple(
            _tool_call(call, f"{param}.tool_calls[{k}]")
            for k, call in enumerate(msg.tool_calls or ())
        )
        reasoning = msg.reasoning_content if msg.reasoning_content is not None else msg.reasoning
        return Message("assistant", content, reasoning, calls, name=msg.name)
    ignored.update(
        f"messages[].{field}"
        for field in ("reasoning_content", "reasoning")
        if getattr(msg, field) is not None
    )
    if msg.role == "tool":
        if msg.tool_call_id is None:
            raise missing(f"{param}.tool_call_id")
        return Message("tool", content, tool_call_id=msg.tool_call_id, name=msg.name)
    if msg.tool_call_id is not None:
        ignored.add("messages[].tool_call_id")
    role: Literal["system", "user"] = "user" if msg.role == "user" else "system"
    return Message(role, content, name=msg.name)


def _tools(tools: list[_Tool]) -> tuple[ToolSpec, ...]:
    specs: list[ToolSpec] = []
    for i, tool in enumerate(tools):
        if tool.type != "function":
            raise _only_function("tool", tool.type, f"tools[{i}].type")
        if tool.function is None:
            raise missing(f"tools[{i}].function")
        if any(spec.name == tool.function.name for spec in specs):
            raise InvalidRequest(
                f"duplicate tool name '{tool.function.name}'", param=f"tools[{i}].function.name"
            )
        fn = tool.function
        specs.append(ToolSpec(fn.name, fn.description or "", dict(fn.parameters or {})))
    return tuple(specs)


def _tool_choice(
    choice: Literal["auto", "none", "required"] | _NamedToolChoice | None,
    tools: tuple[ToolSpec, ...],
) -> ToolChoice:
    if choice is None or choice == "auto":
        return ToolChoice()
    if choice == "none":
        return ToolChoice(ToolChoiceMode.NONE)
    if not tools:
        raise InvalidRequest(
            "'tool_choice' other than 'auto' or 'none' requires 'tools'", param="tool_choice"
        )
    if isinstance(choice, str):
        return ToolChoice(ToolChoiceMode.REQUIRED)
    if choice.type != "function":
        raise _only_function("tool_choice", choice.type, "tool_choice.type")
    if choice.function is None:
        raise missing("tool_choice.function")
    if all(spec.name != choice.function.name for spec in tools):
        raise InvalidRequest(
            f"tool_choice names '{choice.function.name}', which is not among 'tools'",
            param="tool_choice.function.name",
        )
    return ToolChoice(ToolChoiceMode.NAMED, choice.function.name)


def _check_unsupported(body: _Body) -> None:
    if body.functions is not None or body.function_call is not None:
        raise Unsupported(
            "legacy function calling is not supported; use 'tools' and 'tool_choice'",
            param="functions" if body.functions is not None else "function_call",
        )
    if body.n is not None and body.n > 1:
        raise Unsupported("only one choice per request is supported (n = 1)", param="n")
    if body.response_format is not None and body.response_format.type != "text":
        kind = body.response_format.type
        if kind not in ("json_object", "json_schema"):
            raise InvalidRequest(
                f"invalid value for 'response_format.type': unknown type '{kind}'",
                param="response_format.type",
            )
        raise Unsupported(
            f"response_format '{kind}' is not supported; only 'text'",
            param="response_format.type",
        )


def _canonical(body: _Body, source: bytes) -> ChatRequest:
    _check_unsupported(body)
    if not body.messages:
        raise InvalidRequest("'messages' must contain at least one message", param="messages")
    ignored: set[str] = set()
    refuse_unstorable(body, source=source)
    ignored_extras(body, "", ignored)
    ignored |= _ignored_known(body)
    messages = tuple(_message(msg, i, ignored) for i, msg in enumerate(body.messages))
    tools = _tools(body.tools or [])
    stop = body.stop if body.stop is not None else ()
    sampling = SamplingRequest(
        max_tokens=body.max_completion_tokens or body.max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        stop=(stop,) if isinstance(stop, str) else tuple(stop),
        seed=body.seed,
    )
    stream = bool(body.stream)
    include_usage = bool(stream and body.stream_options and body.stream_options.include_usage)
    return ChatRequest(
        adapter=OpenAIChatAdapter.name,
        model=body.model,
        messages=messages,
        tools=tools,
        tool_choice=_tool_choice(body.tool_choice, tools),
        sampling=sampling,
        stream=stream,
        include_usage=include_usage,
        enable_thinking=body.chat_template_kwargs.enable_thinking
        if body.chat_template_kwargs
        else None,
        ignored_fields=tuple(sorted(ignored)),
    )


# -- response: shared pieces -------------------------------------------------------------------


def _completion_id(raw: str) -> str:
    return raw if raw.startswith("chatcmpl-") else f"chatcmpl-{raw}"


def _wire_tool_call(call: ToolCall) -> dict[str, object]:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


def _wire_usage(usage: Usage) -> dict[str, object]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
    }


def _chunk(state: StreamState, choices: list[dict[str, object]]) -> dict[str, object]:
    chunk: dict[str, object] = {
        "id": _completion_id(state.response_id),
        "object": "chat.completion.chunk",
        "created": state.created,
        "model": state.model,
        "system_fingerprint": None,
        "choices": choices,
    }
    if state.include_usage:
        # OpenAI sends "usage": null on every chunk but the last when usage was requested.
        chunk["usage"] = None
    return chunk


def _delta_frame(state: StreamState, delta: dict[str, object]) -> bytes:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
    return sse_frame(_chunk(state, [choice]))


def _finish_frames(state: StreamState, event: TurnFinished) -> list[bytes]:
    choice = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": str(event.finish_reason)}
    frames = [sse_frame(_chunk(state, [choice]))]
    if state.include_usage:
        frames.append(sse_frame(_chunk(state, []) | {"usage": _wire_usage(event.usage)}))
    return frames


def _error_envelope(error: LegoError) -> dict[str, object]:
    return {"error": error_object(error)}


# -- the adapter -------------------------------------------------------------------------------


class OpenAIChatAdapter:
    """OpenAI Chat Completions <-> canonical; stateless, so one instance serves every request."""

    name = "openai_chat"
    request_model: type[Wire] = _Body  # what the OpenAPI document describes

    # -- request --------------------------------------------------------------
    def parse_request(self, body: bytes) -> ChatRequest:
        try:
            wire = _Body.model_validate_json(body)
        except ValidationError as error:
            raise invalid(error) from None
        return _canonical(wire, body)

    # -- non-streaming response ----------------------------------------------
    def render_response(self, turn: AssistantTurn, *, model: str, created: int) -> bytes:
        msg = turn.message
        message: dict[str, object] = {
            "role": "assistant",
            "content": None if not msg.content and msg.tool_calls else msg.content,
            "refusal": None,
        }
        if msg.reasoning is not None:
            message["reasoning_content"] = msg.reasoning
        if msg.tool_calls:
            message["tool_calls"] = [_wire_tool_call(call) for call in msg.tool_calls]
        body = {
            "id": _completion_id(turn.turn_id),
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": str(turn.finish_reason),
                }
            ],
            "usage": _wire_usage(turn.usage),
            "system_fingerprint": None,
        }
        return orjson.dumps(body)

    # -- streaming response ---------------------------------------------------
    def stream_start(self, state: StreamState) -> list[bytes]:
        return [_delta_frame(state, {"role": "assistant", "content": ""})]

    def stream_ping(self, state: StreamState) -> list[bytes]:
        # An SSE comment: clients skip it, proxies and load balancers see a live connection.
        return [b": ping\n\n"]

    def stream_event(self, state: StreamState, event: OutputEvent) -> list[bytes]:
        if isinstance(event, TurnFinished):
            return _finish_frames(state, event)
        if isinstance(event, ToolCallDelta):
            call = {"index": event.index} | _wire_tool_call(event.call)
            return [_delta_frame(state, {"tool_calls": [call]})]
        if not event.text:
            return []
        if isinstance(event, TextDelta):
            return [_delta_frame(state, {"content": event.text})]
        return [_delta_frame(state, {"reasoning_content": event.text})]

    def stream_end(self, state: StreamState) -> list[bytes]:
        return [b"data: [DONE]\n\n"]

    # -- errors ---------------------------------------------------------------
    def error_response(self, error: LegoError) -> tuple[int, bytes]:
        return error.status, orjson.dumps(_error_envelope(error))

    def stream_error(self, state: StreamState, error: LegoError) -> list[bytes]:
        return [sse_frame(_error_envelope(error))]


# -- models list -------------------------------------------------------------------------------


def models_response(model_ids: Sequence[str], created: int) -> bytes:
    """The body of ``GET /v1/models``: every name the proxy answers to, all one policy."""
    data = [
        {"id": model_id, "object": "model", "created": created, "owned_by": "lego-proxy"}
        for model_id in model_ids
    ]
    return orjson.dumps({"object": "list", "data": data})
