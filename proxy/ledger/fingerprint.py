"""Fingerprints of canonical conversations, normalised the way the ledger compares them.

Owns the one definition of "the same message" for history alignment:

- ``user``/``system``/``tool`` messages: role and content, exactly. ``tool_call_id`` and
  ``name`` are left out: ChatML templates do not render them and harnesses rewrite them.
- ``assistant`` messages: content with surrounding whitespace stripped, reasoning left out
  (harnesses drop it or echo it), tool calls as ``(name, canonical JSON arguments)`` so
  key order, spacing, integral floats and call ids do not matter.
- the context: the *set* of effective tools (a re-ordered tool list is the same context);
  the system prompt is the leading ``system`` message and so part of the conversation.

Contract: ``Fingerprinter.of(request)`` returns ``Fingerprints`` whose ``prefixes[i]`` is
the fingerprint of (tool set, messages[:i + 1]) and ``free[i]`` that of the messages up to
``i`` without the tool set and without a leading system message; equal fingerprints mean
equal normalised sequences (128-bit digests; collisions are not a practical concern).
Fingerprints with ``offset > 0`` list only messages from ``offset`` on (``prefixes[i]`` is
that of messages[:offset + i + 1]): the ledger's fast path, which knows the earlier
prefixes already, computes no more than that.
``extend(fingerprint, message)`` continues a chain. Message digests are memoised per
fingerprinter (the harness re-sends the same messages every turn), bounded in size.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass

import orjson

from proxy.canonical import ChatRequest, JsonValue, Message, ToolChoiceMode, ToolSpec

DIGEST_SIZE = 16
FREE_SEED = b"\x00" * DIGEST_SIZE


@dataclass(frozen=True, slots=True)
class Fingerprints:
    seed: bytes  # the context alone: the effective tool set
    digests: tuple[bytes, ...]  # one per message, normalised
    prefixes: tuple[bytes, ...]
    free: tuple[bytes, ...]
    offset: int = 0  # the message index of digests[0], prefixes[0] and free[0]

    @property
    def request(self) -> bytes:
        return self.prefixes[-1] if self.prefixes else self.seed


def effective_tools(request: ChatRequest) -> tuple[ToolSpec, ...]:
    """The tools the template sees: none when the harness forbids calling them."""
    if request.tool_choice.mode is ToolChoiceMode.NONE:
        return ()
    return request.tools


def tools_key(tools: tuple[ToolSpec, ...]) -> bytes:
    encoded = sorted(
        orjson.dumps([t.name, t.description, t.parameters], option=orjson.OPT_SORT_KEYS)
        for t in tools
    )
    return _digest(b"tools\x00" + b"\x00".join(encoded))


def system_text(request: ChatRequest) -> str | None:
    messages = request.messages
    return messages[0].content if messages and messages[0].role == "system" else None


def chain(previous: bytes, digest: bytes) -> bytes:
    return _digest(previous + digest)


def canonical_arguments(arguments: str) -> str:
    """The arguments as sorted compact JSON, or the stripped text when they are not JSON."""
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments.strip()
    value = _integral(parsed)
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except orjson.JSONEncodeError:  # integers past 64 bits: the slow encoder takes them
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def normalised_content(message: Message) -> str:
    return message.content.strip() if message.role == "assistant" else message.content


def same_tool_calls(a: Message, b: Message) -> bool:
    return [(c.name, canonical_arguments(c.arguments)) for c in a.tool_calls] == [
        (c.name, canonical_arguments(c.arguments)) for c in b.tool_calls
    ]


class Fingerprinter:
    def __init__(self, memo_size: int = 8192) -> None:
        self._memo: OrderedDict[Message, bytes] = OrderedDict()
        self._memo_size = memo_size

    def of(self, request: ChatRequest) -> Fingerprints:
        seed = tools_key(effective_tools(request))
        digests: list[bytes] = []
        prefixes: list[bytes] = []
        free: list[bytes] = []
        current, current_free = seed, FREE_SEED
        for index, message in enumerate(request.messages):
            digest = self.message(message)
            digests.append(digest)
            current = chain(current, digest)
            if not (index == 0 and message.role == "system"):
                current_free = chain(current_free, digest)
            prefixes.append(current)
            free.append(current_free)
        return Fingerprints(seed, tuple(digests), tuple(prefixes), tuple(free))

    def message(self, message: Message) -> bytes:
        memo = self._memo
        digest = memo.get(message)
        if digest is not None:
            return digest
        digest = _digest(_payload(message))
        memo[message] = digest
        if len(memo) > self._memo_size:
            memo.popitem(last=False)
        return digest


def _payload(message: Message) -> bytes:
    if message.role != "assistant":
        return orjson.dumps([message.role, message.content])
    calls = [[c.name, canonical_arguments(c.arguments)] for c in message.tool_calls]
    return orjson.dumps(["assistant", message.content.strip(), calls])


def _integral(value: JsonValue) -> JsonValue:
    # JSON.stringify writes 1.0 as 1, Python's json.dumps keeps 1.0: both mean the same.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_integral(v) for v in value]
    if isinstance(value, dict):
        return {k: _integral(v) for k, v in value.items()}
    return value


def _digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()[:DIGEST_SIZE]
