"""Anthropic Messages wire adapter (``POST /v1/messages``, ``POST /v1/messages/count_tokens``).

Owns the translation between Anthropic's Messages JSON and the canonical form, and nothing
else: no IO, no database, no backend. ``AnthropicMessagesAdapter`` implements
``proxy.adapters.base.Adapter``.

Contract:
- Requests are validated strictly by type but accept unknown fields; every unknown or
  deliberately unused field (``cache_control`` anywhere, ``metadata``, ``context_management``,
  ``output_config``, ...) is named in ``ChatRequest.ignored_fields``.
- ``system`` (a string or text blocks) and in-array ``role: "system"`` messages become system
  messages (a ``system`` text block that is Claude Code's ``x-anthropic-billing-header:``
  line is dropped and named as ignored); a user message's ``tool_result`` blocks become
  ``tool`` messages, in block order.
  Text blocks of one user or system turn are joined with a blank line; an assistant's text
  blocks are joined as they are, since they split one sampled text.
- ``tool_use.input`` crosses as compact JSON text (``ToolCall.arguments``), keys in the order
  the client sent them; answers carry ``input`` as the object the arguments parse to.
- Every ``thinking`` block the proxy emits is signed (``ReasoningSigner.sign``); a thinking
  block sent back must carry a signature that verifies, or the request is refused, so the
  reasoning in a canonical request is always the proxy's own. ``redacted_thinking`` is
  accepted and dropped (counted as ignored). Images and documents raise ``Unsupported``.
- Message ids are ``"msg_" + turn_id``. A stream is ``message_start``, then per block
  ``content_block_start``/``_delta``/``_stop`` (a thinking block ends with a
  ``signature_delta``), ``message_delta`` with ``stop_reason`` and usage, ``message_stop``;
  ``ping`` while waiting for the first output; an error after the start is one
  ``event: error`` frame in Anthropic's envelope, which makes the official SDK raise.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Literal

import orjson
from pydantic import Field, JsonValue, Tag, ValidationError

from kernel.errors import (
    BackendError,
    ContextLengthExceeded,
    InvalidRequest,
    LegoError,
    Unsupported,
)
from proxy.adapters.base import StreamState
from proxy.adapters.signing import ReasoningSigner
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
    FinishReason,
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

# -- wire models: request --------------------------------------------------------------------


class _InnerBlock(Wire):
    type: str
    text: str | None = None


_ToolResultContent = Annotated[
    Annotated[str, Tag("~str")] | Annotated[list[_InnerBlock], Tag("~list")],
    one_of("Input should be a string or an array of content blocks"),
]


class _Block(Wire):
    type: str
    text: str | None = None
    thinking: str | None = None
    signature: str | None = None
    data: str | None = None
    id: str | None = None
    name: str | None = None
    input: dict[str, JsonValue] | None = None
    tool_use_id: str | None = None
    content: _ToolResultContent | None = None
    is_error: bool | None = None


_Content = Annotated[
    Annotated[str, Tag("~str")] | Annotated[list[_Block], Tag("~list")],
    one_of("Input should be a string or an array of content blocks"),
]


class _Message(Wire):
    role: Literal["user", "assistant", "system"]
    content: _Content


_System = Annotated[
    Annotated[str, Tag("~str")] | Annotated[list[_InnerBlock], Tag("~list")],
    one_of("Input should be a string or an array of text blocks"),
]


class _Tool(Wire):
    type: str | None = None
    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, JsonValue] | None = None


class _ToolChoice(Wire):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class _Thinking(Wire):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None


class _Body(Wire):
    model: Name
    messages: list[_Message]
    max_tokens: int | None = Field(default=None, ge=1)  # required, except by count_tokens
    system: _System | None = None
    tools: list[_Tool] | None = None
    tool_choice: _ToolChoice | None = None
    thinking: _Thinking | None = None
    stop_sequences: list[Name] | None = None
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=1)
    stream: bool | None = None
    # Accepted and recorded as ignored: the proxy serves one policy.
    metadata: JsonValue = None
    service_tier: str | None = None


_UNUSED_FIELDS = ("metadata", "service_tier")

# -- request: translation ----------------------------------------------------------------------

_NON_TEXT_BLOCKS = frozenset({"image", "document", "search_result"})


def _block_text(kind: str, text: str | None, param: str) -> str:
    if kind in _NON_TEXT_BLOCKS:
        raise Unsupported("this model accepts text only", param=param)
    if kind != "text":
        raise InvalidRequest(
            f"invalid value for '{param}.type': expected 'text', got '{kind}'",
            param=f"{param}.type",
        )
    if text is None:
        raise missing(f"{param}.text")
    return text


# Claude Code's first system block is request metadata for Anthropic's billing, not text
# for the model: "x-anthropic-billing-header: cc_version=2.1.197.b53; cc_entrypoint=...;".
# Its version suffix is a hash of the first user message, so it changes exactly when the
# history is compacted; rendering it would also make every compaction look like a new
# system prompt.
_BILLING_HEADER = "x-anthropic-billing-header:"


def _texts(blocks: list[_InnerBlock], param: str) -> list[str]:
    return [_block_text(b.type, b.text, f"{param}[{j}]") for j, b in enumerate(blocks)]


def _tool_result(block: _Block, param: str, ignored: set[str]) -> Message:
    if block.tool_use_id is None:
        raise missing(f"{param}.tool_use_id")
    content = block.content if block.content is not None else ""
    if not isinstance(content, str):
        content = "\n\n".join(_texts(content, f"{param}.content"))
    if block.is_error:
        # The canonical form has no error flag; the template renders the text alone.
        ignored.add("messages[].content[].is_error")
    return Message("tool", content, tool_call_id=block.tool_use_id)


def _user_turn(blocks: list[_Block], param: str, ignored: set[str]) -> list[Message]:
    out: list[Message] = []
    texts: list[str] = []
    for j, block in enumerate(blocks):
        if block.type == "tool_result":
            if texts:
                out.append(Message("user", "\n\n".join(texts)))
                texts = []
            out.append(_tool_result(block, f"{param}[{j}]", ignored))
        else:
            texts.append(_block_text(block.type, block.text, f"{param}[{j}]"))
    if texts or not out:
        out.append(Message("user", "\n\n".join(texts)))
    return out


def _tool_use(block: _Block, param: str) -> ToolCall:
    if block.id is None:
        raise missing(f"{param}.id")
    if block.name is None:
        raise missing(f"{param}.name")
    if block.input is None:
        raise missing(f"{param}.input")
    return ToolCall(block.id, block.name, orjson.dumps(block.input).decode())


def _assistant_turn(
    blocks: list[_Block], param: str, signer: ReasoningSigner, ignored: set[str]
) -> Message:
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[ToolCall] = []
    for j, block in enumerate(blocks):
        where = f"{param}[{j}]"
        if block.type == "text":
            texts.append(_block_text("text", block.text, where))
        elif block.type == "thinking":
            if block.thinking is None:
                raise missing(f"{where}.thinking")
            if block.signature is None or not signer.verify(block.thinking, block.signature):
                raise InvalidRequest(
                    "invalid 'signature' in 'thinking' block: it was not produced by this proxy",
                    param=f"{where}.signature",
                )
            thoughts.append(block.thinking)
        elif block.type == "redacted_thinking":
            # Opaque by design: there is no text to put back into the prompt.
            ignored.add("messages[].content[].redacted_thinking")
        elif block.type == "tool_use":
            calls.append(_tool_use(block, where))
        else:
            _block_text(block.type, None, where)  # raises: no other block is an answer's
    reasoning = "".join(thoughts) if thoughts else None
    return Message("assistant", "".join(texts), reasoning, tuple(calls))


def _messages(body: _Body, signer: ReasoningSigner, ignored: set[str]) -> tuple[Message, ...]:
    out: list[Message] = []
    if body.system is not None:
        system = body.system
        if isinstance(system, str):
            text = system
        else:
            texts = _texts(system, "system")
            kept = [t for t in texts if not t.startswith(_BILLING_HEADER)]
            if len(kept) < len(texts):
                ignored.add("system[].x-anthropic-billing-header")
            text = "\n\n".join(kept)
        out.append(Message("system", text))
    for i, msg in enumerate(body.messages):
        param = f"messages[{i}].content"
        content = msg.content
        final_assistant = msg.role == "assistant" and i == len(body.messages) - 1
        if not content and not final_assistant:
            # As the Messages API: only a final assistant prefill may be empty.
            raise InvalidRequest(
                f"messages[{i}]: all messages must have non-empty content except for the "
                "optional final assistant message",
                param=param,
            )
        if msg.role == "assistant":
            blocks = [_Block(type="text", text=content)] if isinstance(content, str) else content
            out.append(_assistant_turn(blocks, param, signer, ignored))
        elif msg.role == "system":
            texts = (
                [content]
                if isinstance(content, str)
                else [_block_text(b.type, b.text, f"{param}[{j}]") for j, b in enumerate(content)]
            )
            out.append(Message("system", "\n\n".join(texts)))
        elif isinstance(content, str):
            out.append(Message("user", content))
        else:
            out.extend(_user_turn(content, param, ignored))
    return tuple(out)


def _tools(tools: list[_Tool]) -> tuple[ToolSpec, ...]:
    specs: list[ToolSpec] = []
    for i, tool in enumerate(tools):
        if tool.type not in (None, "custom"):
            raise Unsupported(
                f"server tool type '{tool.type}' is not supported; only custom tools",
                param=f"tools[{i}].type",
            )
        if tool.input_schema is None:
            raise missing(f"tools[{i}].input_schema")
        if any(spec.name == tool.name for spec in specs):
            raise InvalidRequest(f"duplicate tool name '{tool.name}'", param=f"tools[{i}].name")
        specs.append(ToolSpec(tool.name, tool.description or "", dict(tool.input_schema)))
    return tuple(specs)


def _tool_choice(choice: _ToolChoice | None, tools: tuple[ToolSpec, ...]) -> ToolChoice:
    if choice is None or choice.type == "auto":
        return ToolChoice()
    if choice.type == "none":
        return ToolChoice(ToolChoiceMode.NONE)
    if not tools:
        raise InvalidRequest(
            f"tool_choice '{choice.type}' requires 'tools'", param="tool_choice.type"
        )
    if choice.type == "any":
        return ToolChoice(ToolChoiceMode.REQUIRED)
    if choice.name is None:
        raise missing("tool_choice.name")
    if all(spec.name != choice.name for spec in tools):
        raise InvalidRequest(
            f"tool_choice names '{choice.name}', which is not among 'tools'",
            param="tool_choice.name",
        )
    return ToolChoice(ToolChoiceMode.NAMED, choice.name)


def _enable_thinking(thinking: _Thinking | None) -> bool | None:
    if thinking is None or thinking.type == "adaptive":
        return None  # the template's default: the model decides
    return thinking.type == "enabled"


def _canonical(body: _Body, source: bytes, signer: ReasoningSigner) -> ChatRequest:
    if not body.messages:
        raise InvalidRequest("'messages' must contain at least one message", param="messages")
    ignored: set[str] = set()
    refuse_unstorable(body, source=source)
    ignored_extras(body, "", ignored)
    ignored |= {name for name in _UNUSED_FIELDS if getattr(body, name) is not None}
    if body.tool_choice is not None and body.tool_choice.disable_parallel_tool_use is not None:
        ignored.add("tool_choice.disable_parallel_tool_use")
    if body.thinking is not None and body.thinking.budget_tokens is not None:
        ignored.add("thinking.budget_tokens")
    messages = _messages(body, signer, ignored)
    tools = _tools(body.tools or [])
    sampling = SamplingRequest(
        max_tokens=body.max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        stop=tuple(body.stop_sequences or ()),
    )
    return ChatRequest(
        adapter=AnthropicMessagesAdapter.name,
        model=body.model,
        messages=messages,
        tools=tools,
        tool_choice=_tool_choice(body.tool_choice, tools),
        sampling=sampling,
        stream=bool(body.stream),
        include_usage=True,
        enable_thinking=_enable_thinking(body.thinking),
        ignored_fields=tuple(sorted(ignored)),
    )


# -- response: shared pieces -------------------------------------------------------------------


def _message_id(raw: str) -> str:
    return raw if raw.startswith("msg_") else f"msg_{raw}"


def _input(arguments: str) -> dict[str, object]:
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        parsed = None
    # The parser emits only calls whose arguments are a JSON object; anything else is a bug.
    if not isinstance(parsed, dict):
        raise LegoError(f"tool call arguments are not a JSON object: {arguments[:80]!r}")
    return parsed


def _tool_use_block(call: ToolCall, *, streaming: bool) -> dict[str, object]:
    return {
        "type": "tool_use",
        "id": call.id,
        "name": call.name,
        "input": {} if streaming else _input(call.arguments),
    }


def _stop_reason(reason: FinishReason, matched_stop: str | None) -> str:
    if reason is FinishReason.LENGTH:
        return "max_tokens"
    if reason is FinishReason.TOOL_CALLS:
        return "tool_use"
    return "stop_sequence" if matched_stop is not None else "end_turn"


def _wire_usage(usage: Usage) -> dict[str, object]:
    return {
        "input_tokens": usage.prompt_tokens,
        "output_tokens": usage.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def _event(kind: str, payload: dict[str, object]) -> bytes:
    return sse_frame({"type": kind} | payload, event=kind)


def _open_block(
    state: StreamState, signer: ReasoningSigner, kind: str, block: dict[str, object]
) -> list[bytes]:
    """Make sure a block of ``kind`` is open, closing another open block first."""
    frames: list[bytes] = []
    if state.extra.get("open") == kind:
        return frames
    frames.extend(_close_block(state, signer))
    index = int(str(state.extra.get("blocks", 0)))
    state.extra.update(open=kind, index=index, blocks=index + 1, thinking="")
    frames.append(_event("content_block_start", {"index": index, "content_block": block}))
    return frames


def _close_block(state: StreamState, signer: ReasoningSigner) -> list[bytes]:
    kind = state.extra.pop("open", None)
    if kind is None:
        return []
    index = state.extra["index"]
    frames: list[bytes] = []
    if kind == "thinking":
        delta = {"type": "signature_delta", "signature": signer.sign(str(state.extra["thinking"]))}
        frames.append(_event("content_block_delta", {"index": index, "delta": delta}))
    frames.append(_event("content_block_stop", {"index": index}))
    return frames


def _delta(state: StreamState, delta: Mapping[str, object]) -> bytes:
    return _event("content_block_delta", {"index": state.extra["index"], "delta": delta})


_ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def _error_envelope(error: LegoError) -> dict[str, object]:
    kind = _ERROR_TYPES.get(error.status)
    if kind is None:
        kind = "invalid_request_error" if error.status < 500 else "api_error"
    if isinstance(error, BackendError) and not error.retryable:
        kind = "api_error"
    return {"type": "error", "error": {"type": kind, "message": _message(error)}}


def _message(error: LegoError) -> str:
    """Anthropic's own words where a client reads them: Claude Code compacts its history
    when a 400 says "prompt is too long"."""
    if not isinstance(error, ContextLengthExceeded):
        return error.message
    if error.prompt_tokens is not None and error.limit is not None:
        return f"prompt is too long: {error.prompt_tokens} tokens > {error.limit} maximum"
    return f"prompt is too long: {error.message}"


# -- the adapter -------------------------------------------------------------------------------


class AnthropicMessagesAdapter:
    """Anthropic Messages <-> canonical; holds only the signer, so one instance serves all."""

    name = "anthropic_messages"
    request_model: type[Wire] = _Body  # what the OpenAPI document describes

    def __init__(self, signer: ReasoningSigner) -> None:
        self._signer = signer

    # -- request --------------------------------------------------------------
    def parse_request(self, body: bytes) -> ChatRequest:
        request = self.parse_count_request(body)
        if request.sampling.max_tokens is None:
            raise missing("max_tokens")
        return request

    def parse_count_request(self, body: bytes) -> ChatRequest:
        """``count_tokens`` takes a Messages body without ``max_tokens``."""
        try:
            wire = _Body.model_validate_json(body)
        except ValidationError as error:
            raise invalid(error) from None
        return _canonical(wire, body, self._signer)

    # -- non-streaming response ----------------------------------------------
    def render_response(self, turn: AssistantTurn, *, model: str, created: int) -> bytes:
        msg = turn.message
        content: list[dict[str, object]] = []
        if msg.reasoning is not None:
            signature = self._signer.sign(msg.reasoning)
            content.append({"type": "thinking", "thinking": msg.reasoning, "signature": signature})
        if msg.content:
            content.append({"type": "text", "text": msg.content})
        content.extend(_tool_use_block(call, streaming=False) for call in msg.tool_calls)
        body = {
            "id": _message_id(turn.turn_id),
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": _stop_reason(turn.finish_reason, turn.matched_stop),
            "stop_sequence": turn.matched_stop,
            "usage": _wire_usage(turn.usage),
        }
        return orjson.dumps(body)

    # -- streaming response ---------------------------------------------------
    def stream_start(self, state: StreamState) -> list[bytes]:
        message: dict[str, object] = {
            "id": _message_id(state.response_id),
            "type": "message",
            "role": "assistant",
            "model": state.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": _wire_usage(Usage(state.prompt_tokens, 0)),
        }
        return [_event("message_start", {"message": message})]

    def stream_ping(self, state: StreamState) -> list[bytes]:
        return [_event("ping", {})]

    def stream_event(self, state: StreamState, event: OutputEvent) -> list[bytes]:
        if isinstance(event, TurnFinished):
            delta = {
                "stop_reason": _stop_reason(event.finish_reason, event.matched_stop),
                "stop_sequence": event.matched_stop,
            }
            usage = _wire_usage(event.usage)
            return [
                *_close_block(state, self._signer),
                _event("message_delta", {"delta": delta, "usage": usage}),
            ]
        if isinstance(event, ToolCallDelta):
            block = _tool_use_block(event.call, streaming=True)
            frames = _open_block(state, self._signer, f"tool_use:{event.index}", block)
            json_delta = {"type": "input_json_delta", "partial_json": event.call.arguments}
            return [*frames, _delta(state, json_delta), *_close_block(state, self._signer)]
        if not event.text:
            return []
        if isinstance(event, TextDelta):
            frames = _open_block(state, self._signer, "text", {"type": "text", "text": ""})
            return [*frames, _delta(state, {"type": "text_delta", "text": event.text})]
        block = {"type": "thinking", "thinking": "", "signature": ""}
        frames = _open_block(state, self._signer, "thinking", block)
        state.extra["thinking"] = str(state.extra["thinking"]) + event.text
        return [*frames, _delta(state, {"type": "thinking_delta", "thinking": event.text})]

    def stream_end(self, state: StreamState) -> list[bytes]:
        return [_event("message_stop", {})]

    # -- errors ---------------------------------------------------------------
    def error_response(self, error: LegoError) -> tuple[int, bytes]:
        return error.status, orjson.dumps(_error_envelope(error))

    def stream_error(self, state: StreamState, error: LegoError) -> list[bytes]:
        return [sse_frame(_error_envelope(error), event="error")]


def count_tokens_response(input_tokens: int) -> bytes:
    """The body of ``POST /v1/messages/count_tokens``."""
    return orjson.dumps({"input_tokens": input_tokens})
