"""OpenAI Responses wire adapter (``POST /v1/responses``).

Owns the translation between OpenAI's Responses JSON and the canonical form, and nothing
else: no IO, no database, no backend. ``OpenAIResponsesAdapter`` implements
``proxy.adapters.base.Adapter``; ``continue_from`` is the pure half of
``previous_response_id`` (the route looks the earlier turn up in the recorder).

Contract:
- Requests are validated strictly by type but accept unknown fields; every unknown or
  deliberately unused field (``parallel_tool_calls``, ``include``, ``prompt_cache_key``,
  ``client_metadata``, ``input[].id``, ...) is named in ``ChatRequest.ignored_fields``.
- ``instructions`` becomes ``messages[0]`` (a system message) and is also kept in
  ``ChatRequest.instructions``; ``developer`` and ``system`` items become system messages.
  ``input`` items become messages in order: consecutive ``reasoning``, assistant ``message``
  and ``function_call`` items fold into one assistant message (a new one starts at a
  reasoning item after text or calls, or at text after calls); ``function_call_output``
  becomes a ``tool`` message.
- Only function tools are served. Other tool types offered in ``tools`` (hosted tools such
  as ``web_search``, ``namespace`` groups) are left out of the prompt and named in
  ``ignored_fields`` as ``tools[type=...]``; a ``tool_choice`` forcing one, and non-text
  input, raise ``Unsupported``. ``arguments`` cross verbatim in both directions.
- Reasoning items the proxy emits carry the text in ``content`` and, sealed with the
  proxy's secret, in ``encrypted_content``; an echoed item is read from
  ``encrypted_content`` when present (refused when not the proxy's own), else from
  ``content``.
- Response ids are ``"resp_" + turn_id``. A stream is ``response.created``,
  ``response.in_progress``, per output item ``output_item.added``, its content part and
  deltas, ``output_item.done``, then ``response.completed`` (``response.incomplete`` when
  cut by the token limit); every event has a ``sequence_number``. An error after the start
  is ``response.failed`` then an ``error`` event, which makes the official SDK raise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Literal

import orjson
from pydantic import Field, JsonValue, Tag, ValidationError

from kernel.errors import InvalidRequest, LegoError, Unsupported
from proxy.adapters.base import StreamState
from proxy.adapters.openai_errors import error_object
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
from proxy.sampling_rules import TopK

# -- wire models: request --------------------------------------------------------------------


class _Part(Wire):
    type: str
    text: str | None = None


_Content = Annotated[
    Annotated[str, Tag("~str")] | Annotated[list[_Part], Tag("~list")],
    one_of("Input should be a string or an array of content parts"),
]


class _Item(Wire):
    type: str | None = None  # omitted: a message
    role: Literal["user", "assistant", "system", "developer"] | None = None
    content: _Content | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: _Content | None = None
    summary: list[_Part] | None = None
    encrypted_content: str | None = None


_Input = Annotated[
    Annotated[str, Tag("~str")] | Annotated[list[_Item], Tag("~list")],
    one_of("Input should be a string or an array of input items"),
]


class _Tool(Wire):
    type: str
    name: str | None = Field(default=None, min_length=1)
    description: str | None = None
    parameters: dict[str, JsonValue] | None = None
    strict: bool | None = None


class _NamedToolChoice(Wire):
    type: str
    name: str | None = None


_ToolChoiceWire = Annotated[
    Annotated[Literal["auto", "none", "required"], Tag("~str")]
    | Annotated[_NamedToolChoice, Tag("~object")],
    one_of("Input should be 'auto', 'none', 'required' or a named function choice"),
]


class _Reasoning(Wire):
    effort: str | None = None
    summary: str | None = None


class _Format(Wire):
    type: str


class _Text(Wire):
    format: _Format | None = None
    verbosity: str | None = None


class _Body(Wire):
    model: Name
    input: _Input
    instructions: str | None = None
    tools: list[_Tool] | None = None
    tool_choice: _ToolChoiceWire | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: TopK | None = None  # vLLM/SGLang extension, with SGLang's rule
    parallel_tool_calls: bool | None = None
    previous_response_id: Name | None = None
    store: bool | None = None
    stream: bool | None = None
    reasoning: _Reasoning | None = None
    text: _Text | None = None
    background: bool | None = None
    # Accepted and recorded as ignored: the proxy serves one policy and keeps every turn.
    include: list[str] | None = None
    metadata: JsonValue = None
    user: str | None = None
    prompt_cache_key: str | None = None
    service_tier: str | None = None
    truncation: str | None = None
    # Server-side conversation objects and prompt templates, refused rather than dropped.
    conversation: JsonValue = None
    prompt: JsonValue = None


_UNUSED_FIELDS = (
    "parallel_tool_calls",
    "include",
    "metadata",
    "user",
    "prompt_cache_key",
    "service_tier",
    "truncation",
)

# -- request: translation ----------------------------------------------------------------------

_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "reasoning_text", "summary_text"})
_NON_TEXT_PARTS = frozenset({"input_image", "input_file", "input_audio"})


def _text(content: str | list[_Part] | None, param: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    texts: list[str] = []
    for j, part in enumerate(content):
        if part.type in _NON_TEXT_PARTS:
            raise Unsupported("this model accepts text only", param=f"{param}[{j}]")
        if part.type not in _TEXT_PARTS:
            raise InvalidRequest(
                f"invalid value for '{param}[{j}].type': expected a text part, got '{part.type}'",
                param=f"{param}[{j}].type",
            )
        if part.text is None:
            raise missing(f"{param}[{j}].text")
        texts.append(part.text)
    return "".join(texts)


class _Conversation:
    """Folds input items into canonical messages (one pending assistant message at a time)."""

    def __init__(self, signer: ReasoningSigner) -> None:
        self._signer = signer
        self.messages: list[Message] = []
        self._reasoning: list[str] = []
        self._content: list[str] = []
        self._calls: list[ToolCall] = []
        self._open = False

    def _flush(self) -> None:
        if self._open:
            reasoning = "".join(self._reasoning) if self._reasoning else None
            calls = tuple(self._calls)
            self.messages.append(Message("assistant", "".join(self._content), reasoning, calls))
        self._reasoning, self._content, self._calls, self._open = [], [], [], False

    def add(self, item: _Item, param: str) -> None:
        kind = item.type or "message"
        if kind == "message":
            self._message(item, param)
        elif kind == "reasoning":
            if self._content or self._calls:
                self._flush()
            self._open = True
            text = self._reasoning_text(item, param)
            if text is not None:
                self._reasoning.append(text)
        elif kind == "function_call":
            for field in ("call_id", "name", "arguments"):
                if getattr(item, field) is None:
                    raise missing(f"{param}.{field}")
            self._open = True
            self._calls.append(ToolCall(str(item.call_id), str(item.name), str(item.arguments)))
        elif kind == "function_call_output":
            if item.call_id is None:
                raise missing(f"{param}.call_id")
            if item.output is None:
                raise missing(f"{param}.output")
            self._flush()
            output = _text(item.output, f"{param}.output")
            self.messages.append(Message("tool", output, tool_call_id=item.call_id))
        elif kind == "item_reference":
            raise Unsupported("item references are not supported; send the items", param=param)
        else:
            raise Unsupported(
                f"input item type '{kind}' is not supported; only messages, reasoning and "
                "function calls",
                param=f"{param}.type",
            )

    def _message(self, item: _Item, param: str) -> None:
        if item.role is None:
            raise missing(f"{param}.role")
        if item.content is None:
            raise missing(f"{param}.content")
        text = _text(item.content, f"{param}.content")
        if item.role == "assistant":
            if self._calls:
                self._flush()
            self._open = True
            self._content.append(text)
            return
        self._flush()
        self.messages.append(Message("user" if item.role == "user" else "system", text))

    def _reasoning_text(self, item: _Item, param: str) -> str | None:
        if item.encrypted_content is not None:
            return self._signer.unseal(item.encrypted_content, param=f"{param}.encrypted_content")
        if item.content:
            return _text(item.content, f"{param}.content")
        return None  # a summary alone is not what the model sampled

    def finish(self) -> tuple[Message, ...]:
        self._flush()
        return tuple(self.messages)


def _tools(tools: list[_Tool], ignored: set[str]) -> tuple[ToolSpec, ...]:
    specs: list[ToolSpec] = []
    for i, tool in enumerate(tools):
        if tool.type != "function":
            # Offered, not required: Codex sends the hosted web_search and a namespace group
            # of sub-agent tools by default. The local policy can call neither (a namespaced
            # call needs a wire field the canonical form lacks), so the model is not shown
            # them; refusing the request would make the harness unusable.
            ignored.add(f"tools[type={tool.type}]")
            continue
        if tool.name is None:
            raise missing(f"tools[{i}].name")
        if any(spec.name == tool.name for spec in specs):
            raise InvalidRequest(f"duplicate tool name '{tool.name}'", param=f"tools[{i}].name")
        specs.append(ToolSpec(tool.name, tool.description or "", dict(tool.parameters or {})))
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
        raise Unsupported(
            f"tool_choice type '{choice.type}' is not supported; only 'function'",
            param="tool_choice.type",
        )
    if choice.name is None:
        raise missing("tool_choice.name")
    if all(spec.name != choice.name for spec in tools):
        raise InvalidRequest(
            f"tool_choice names '{choice.name}', which is not among 'tools'",
            param="tool_choice.name",
        )
    return ToolChoice(ToolChoiceMode.NAMED, choice.name)


def _check_unsupported(body: _Body) -> None:
    for name in ("conversation", "prompt"):
        if getattr(body, name) is not None:
            raise Unsupported(f"'{name}' is not supported; send 'input'", param=name)
    if body.background:
        raise Unsupported("background responses are not supported", param="background")
    if body.text is not None and body.text.format is not None:
        kind = body.text.format.type
        if kind != "text":
            raise Unsupported(
                f"text format '{kind}' is not supported; only 'text'", param="text.format.type"
            )


def _canonical(body: _Body, source: bytes, signer: ReasoningSigner) -> ChatRequest:
    _check_unsupported(body)
    ignored: set[str] = set()
    refuse_unstorable(body, source=source)
    ignored_extras(body, "", ignored)
    ignored |= {name for name in _UNUSED_FIELDS if getattr(body, name) is not None}
    if body.reasoning is not None:
        ignored |= {f"reasoning.{k}" for k in ("effort", "summary") if getattr(body.reasoning, k)}
    if any(tool.strict for tool in body.tools or ()):
        ignored.add("tools[].strict")
    conversation = _Conversation(signer)
    if body.instructions is not None:
        conversation.messages.append(Message("system", body.instructions))
    items = [_Item(role="user", content=body.input)] if isinstance(body.input, str) else body.input
    for i, item in enumerate(items):
        conversation.add(item, f"input[{i}]")
    messages = conversation.finish()
    if not messages:
        raise InvalidRequest("'input' must contain at least one item", param="input")
    tools = _tools(body.tools or [], ignored)
    sampling = SamplingRequest(
        max_tokens=body.max_output_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
    )
    effort = body.reasoning.effort if body.reasoning is not None else None
    return ChatRequest(
        adapter=OpenAIResponsesAdapter.name,
        model=body.model,
        messages=messages,
        tools=tools,
        tool_choice=_tool_choice(body.tool_choice, tools),
        sampling=sampling,
        stream=bool(body.stream),
        include_usage=True,
        enable_thinking=False if effort == "none" else None,
        ignored_fields=tuple(sorted(ignored)),
        instructions=body.instructions,
        previous_response_id=body.previous_response_id,
        store=body.store,
    )


def continue_from(prior: ChatRequest, answer: Message, request: ChatRequest) -> ChatRequest:
    """``request`` continuing ``prior`` (answered by ``answer``), as one whole conversation.

    As with OpenAI, the earlier request's ``instructions`` are not carried over: only the
    new request's ``instructions`` (if any) lead the conversation.
    """
    history = prior.messages[1:] if prior.instructions is not None else prior.messages
    new = request.messages[1:] if request.instructions is not None else request.messages
    lead = request.messages[:1] if request.instructions is not None else ()
    return ChatRequest(
        adapter=request.adapter,
        model=request.model,
        messages=(*lead, *history, answer, *new),
        tools=request.tools,
        tool_choice=request.tool_choice,
        sampling=request.sampling,
        stream=request.stream,
        include_usage=request.include_usage,
        enable_thinking=request.enable_thinking,
        ignored_fields=request.ignored_fields,
        instructions=request.instructions,
        previous_response_id=request.previous_response_id,
        store=request.store,
    )


# -- response: shared pieces -------------------------------------------------------------------


def response_id(turn_id: str) -> str:
    return turn_id if turn_id.startswith("resp_") else f"resp_{turn_id}"


def turn_id_of(response: str) -> str:
    return response.removeprefix("resp_")


def _reasoning_item(turn_id: str, text: str, signer: ReasoningSigner | None) -> dict[str, object]:
    item: dict[str, object] = {"type": "reasoning", "id": f"rs_{turn_id}", "summary": []}
    if signer is None:
        return item | {"content": [], "status": "in_progress"}
    content = [{"type": "reasoning_text", "text": text}]
    return item | {
        "content": content,
        "encrypted_content": signer.seal(text),
        "status": "completed",
    }


def _output_text(text: str) -> dict[str, object]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message_item(turn_id: str, text: str | None) -> dict[str, object]:
    status = "in_progress" if text is None else "completed"
    item = {"type": "message", "id": f"msg_{turn_id}", "role": "assistant", "status": status}
    return item | {"content": [] if text is None else [_output_text(text)]}


def _call_item(turn_id: str, index: int, call: ToolCall, *, done: bool) -> dict[str, object]:
    return {
        "type": "function_call",
        "id": f"fc_{turn_id}_{index}",
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments if done else "",
        "status": "completed" if done else "in_progress",
    }


def _wire_usage(usage: Usage) -> dict[str, object]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.total_tokens,
    }


def _response(
    turn_id: str,
    *,
    model: str,
    created: int,
    output: list[dict[str, object]],
    finish: FinishReason | None = None,
    usage: Usage | None = None,
    error: LegoError | None = None,
) -> dict[str, object]:
    status = "in_progress" if finish is None else "completed"
    if finish is FinishReason.LENGTH:
        status = "incomplete"
    if error is not None:
        status = "failed"
    return {
        "id": response_id(turn_id),
        "object": "response",
        "created_at": created,
        "status": status,
        "error": None if error is None else {"code": error.code, "message": error.message},
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": None if usage is None else _wire_usage(usage),
    }


def _stream(state: StreamState) -> _StreamOutput:
    output = state.extra.get("responses")
    if not isinstance(output, _StreamOutput):
        output = state.extra["responses"] = _StreamOutput()
    return output


@dataclass(slots=True)
class _StreamOutput:
    """The items streamed so far and the one still open (per response, in ``StreamState``)."""

    sequence: int = 0
    items: list[dict[str, object]] = field(default_factory=list)
    open: str | None = None  # "reasoning" or "message"
    text: list[str] = field(default_factory=list)

    def event(self, kind: str, payload: Mapping[str, object]) -> bytes:
        frame = sse_frame({"type": kind, "sequence_number": self.sequence, **payload}, event=kind)
        self.sequence += 1
        return frame

    def item_event(self, kind: str, item: dict[str, object]) -> bytes:
        """``output_item.added``/``.done`` for the last item, which ``item`` becomes."""
        self.items[-1] = item
        return self.event(
            f"response.output_item.{kind}", {"output_index": len(self.items) - 1, "item": item}
        )

    def part_event(self, kind: str, payload: Mapping[str, object]) -> bytes:
        """An event about the last item's only content part."""
        where = {"item_id": self.items[-1]["id"], "output_index": len(self.items) - 1}
        return self.event(f"response.{kind}", where | {"content_index": 0, **payload})


# -- the adapter -------------------------------------------------------------------------------


class OpenAIResponsesAdapter:
    """OpenAI Responses <-> canonical; holds only the signer, so one instance serves all."""

    name = "openai_responses"
    request_model: type[Wire] = _Body  # what the OpenAPI document describes

    def __init__(self, signer: ReasoningSigner) -> None:
        self._signer = signer

    # -- request --------------------------------------------------------------
    def parse_request(self, body: bytes) -> ChatRequest:
        try:
            wire = _Body.model_validate_json(body)
        except ValidationError as error:
            raise invalid(error) from None
        return _canonical(wire, body, self._signer)

    # -- non-streaming response ----------------------------------------------
    def render_response(self, turn: AssistantTurn, *, model: str, created: int) -> bytes:
        msg = turn.message
        output: list[dict[str, object]] = []
        if msg.reasoning is not None:
            output.append(_reasoning_item(turn.turn_id, msg.reasoning, self._signer))
        if msg.content or not msg.tool_calls:
            output.append(_message_item(turn.turn_id, msg.content))
        output.extend(
            _call_item(turn.turn_id, i, call, done=True) for i, call in enumerate(msg.tool_calls)
        )
        body = _response(
            turn.turn_id,
            model=model,
            created=created,
            output=output,
            finish=turn.finish_reason,
            usage=turn.usage,
        )
        return orjson.dumps(body)

    # -- streaming response ---------------------------------------------------
    def stream_start(self, state: StreamState) -> list[bytes]:
        out = _stream(state)
        response = _response(state.response_id, model=state.model, created=state.created, output=[])
        return [
            out.event("response.created", {"response": response}),
            out.event("response.in_progress", {"response": response}),
        ]

    def stream_ping(self, state: StreamState) -> list[bytes]:
        # An SSE comment: clients skip it, proxies and load balancers see a live connection.
        return [b": ping\n\n"]

    def stream_event(self, state: StreamState, event: OutputEvent) -> list[bytes]:
        out = _stream(state)
        if isinstance(event, TurnFinished):
            frames = self._close(state, out)
            response = _response(
                state.response_id,
                model=state.model,
                created=state.created,
                output=out.items,
                finish=event.finish_reason,
                usage=event.usage,
            )
            kind = f"response.{response['status']}"  # completed or incomplete
            return [*frames, out.event(kind, {"response": response})]
        if isinstance(event, ToolCallDelta):
            frames = self._close(state, out)
            item = _call_item(state.response_id, event.index, event.call, done=False)
            out.items.append(item)
            where = {"item_id": item["id"], "output_index": len(out.items) - 1}
            arguments = event.call.arguments
            done = _call_item(state.response_id, event.index, event.call, done=True)
            return [
                *frames,
                out.item_event("added", item),
                out.event("response.function_call_arguments.delta", where | {"delta": arguments}),
                out.event(
                    "response.function_call_arguments.done", where | {"arguments": arguments}
                ),
                out.item_event("done", done),
            ]
        if not event.text:
            return []
        kind = "message" if isinstance(event, TextDelta) else "reasoning"
        frames = self._open(state, out, kind)
        out.text.append(event.text)
        if kind == "message":
            return [
                *frames,
                out.part_event("output_text.delta", {"delta": event.text, "logprobs": []}),
            ]
        return [*frames, out.part_event("reasoning_text.delta", {"delta": event.text})]

    def _open(self, state: StreamState, out: _StreamOutput, kind: str) -> list[bytes]:
        if out.open == kind:
            return []
        frames = self._close(state, out)
        if kind == "message":
            item, part = _message_item(state.response_id, None), _output_text("")
        else:
            item = _reasoning_item(state.response_id, "", None)
            part = {"type": "reasoning_text", "text": ""}
        out.items.append(item)
        out.open, out.text = kind, []
        frames.append(out.item_event("added", item))
        frames.append(out.part_event("content_part.added", {"part": part}))
        return frames

    def _close(self, state: StreamState, out: _StreamOutput) -> list[bytes]:
        if out.open is None:
            return []
        text = "".join(out.text)
        if out.open == "message":
            done = _message_item(state.response_id, text)
            part: dict[str, object] = _output_text(text)
            frames = [out.part_event("output_text.done", {"text": text, "logprobs": []})]
        else:
            done = _reasoning_item(state.response_id, text, self._signer)
            part = {"type": "reasoning_text", "text": text}
            frames = [out.part_event("reasoning_text.done", {"text": text})]
        frames.append(out.part_event("content_part.done", {"part": part}))
        frames.append(out.item_event("done", done))
        out.open, out.text = None, []
        return frames

    def stream_end(self, state: StreamState) -> list[bytes]:
        return []  # response.completed ended the stream; Responses has no [DONE]

    # -- errors ---------------------------------------------------------------
    def error_response(self, error: LegoError) -> tuple[int, bytes]:
        return error.status, orjson.dumps({"error": error_object(error)})

    def stream_error(self, state: StreamState, error: LegoError) -> list[bytes]:
        out = _stream(state)
        response = _response(
            state.response_id,
            model=state.model,
            created=state.created,
            output=out.items,
            error=error,
        )
        body = error_object(error)
        # The nested "error" object is what makes the official SDK raise on this event.
        payload = {
            "code": error.code,
            "message": error.message,
            "param": error.param,
            "error": body,
        }
        return [out.event("response.failed", {"response": response}), out.event("error", payload)]
