"""Renders a canonical conversation into prompt token ids with the served model's template.

Owns the one conversion from ``proxy.canonical`` messages to the dicts a Hugging Face chat
template expects (OpenAI-shaped: ``tool_calls[].function``, ``reasoning_content``) and the
tokenization of the rendered text. The prompt is tokenized with ``add_special_tokens=False``
because the template already writes every special token it wants.

This renders the whole conversation; the history ledger builds on it to render only the
new messages of a continuing session.

``Renderer.encode`` is ``tokenizer.encode(text, add_special_tokens=False)``. On a fast
tokenizer it makes the wrapper's own call to the Rust tokenizer, ``encode_batch`` of the one
text, without the wrapper's Python around it (argument checks, resetting truncation and
padding to none, setting whether special-token text is split, a ``BatchEncoding``): 23-31
us of a root turn's render on the development machine, paid by every root's render and
every continuation's suffix. ``encode_batch``, not ``encode``: it lets go of the GIL while
it tokenizes, as the ledger's renders in a worker thread need (``Tokenizer.encode`` holds
it, and a large prompt would stall the event loop for the whole of its tokenizing). Where
the Rust tokenizer's state is not what the wrapper would set (truncating, padding, or
splitting special tokens otherwise) the wrapper's own path runs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import orjson
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerBase

from kernel.errors import InvalidRequest, LegoError
from proxy.canonical import ChatRequest, JsonObject, Message, ToolChoiceMode, ToolSpec


def load_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer  # heavy import, only at start-up

    try:
        tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError) as exc:  # what transformers raises for a bad directory
        raise LegoError(f"no tokenizer can be loaded from {path}: {exc}") from exc
    if getattr(tokenizer, "chat_template", None) is None:
        raise LegoError(f"the tokenizer at {path} has no chat template")
    return tokenizer


def template_message(message: Message) -> JsonObject:
    out: JsonObject = {"role": message.role, "content": message.content}
    if message.reasoning is not None:
        out["reasoning_content"] = message.reasoning
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": _arguments(call.arguments)},
            }
            for call in message.tool_calls
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        out["name"] = message.name
    return out


def template_tool(tool: ToolSpec) -> JsonObject:
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        },
    }


def _arguments(arguments: str) -> str | JsonObject:
    """Templates render a dict with ``tojson``; pass dicts so key spacing is the template's."""
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments
    return parsed if isinstance(parsed, dict) else arguments


def rust_tokenizer(tokenizer: PreTrainedTokenizerBase) -> Tokenizer | None:
    """A fast tokenizer's own Rust tokenizer (what its Python wrapper calls); None for a
    slow one."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return backend if isinstance(backend, Tokenizer) else None


class Renderer:
    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self._tokenizer = tokenizer
        self._backend = rust_tokenizer(tokenizer)

    def render_text(self, request: ChatRequest, *, generation_prompt: bool = True) -> str:
        tools = (
            [template_tool(t) for t in request.tools]
            if request.tools and request.tool_choice.mode is not ToolChoiceMode.NONE
            else None
        )
        kwargs: dict[str, object] = {}
        if request.enable_thinking is not None:
            kwargs["enable_thinking"] = request.enable_thinking
        # transformers annotates messages as dict[str, str]; templates take nested JSON.
        apply_template: Callable[..., object] = self._tokenizer.apply_chat_template
        try:
            text = apply_template(
                [template_message(m) for m in request.messages],
                tools=tools,
                add_generation_prompt=generation_prompt,
                tokenize=False,
                **kwargs,
            )
        except Exception as exc:  # jinja raises many types; all mean "cannot render this"
            raise InvalidRequest(f"the conversation cannot be rendered: {exc}") from exc
        if not isinstance(text, str):
            raise InvalidRequest("the chat template did not render text")
        return text

    def render(self, request: ChatRequest) -> list[int]:
        return self.encode(self.render_text(request))

    def encode(self, text: str) -> list[int]:
        """``tokenizer.encode(text, add_special_tokens=False)`` (module docstring)."""
        backend = self._backend
        if (
            backend is not None
            and backend.truncation is None
            and backend.padding is None
            and backend.encode_special_tokens
            == bool(getattr(self._tokenizer, "split_special_tokens", False))
        ):
            ids: list[int] = backend.encode_batch([text], add_special_tokens=False)[0].ids
            return ids
        encoded: list[int] = self._tokenizer.encode(text, add_special_tokens=False)
        return encoded
