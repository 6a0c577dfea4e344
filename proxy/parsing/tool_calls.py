"""Finds tool-call blocks in the content stream and turns them into canonical events.

Owns ``ToolCallSplitter``. Contract (content text in, in order; events out):

- Text outside ``<tool_call>...</tool_call>`` blocks becomes ``TextDelta`` as soon as it is
  known not to be the start of ``<tool_call>`` (``<tool_call>\n`` for the JSON format, which
  SGLang's detector needs: a bare tag there is text); a block is buffered until it closes and then
  parsed (``tool_formats.parse_block``), as is a block still open at ``finish``.
- Each call in a well-formed block becomes one ``ToolCallDelta(index,
  ToolCall(id=f"{prefix}{index}", ...))``, indices counting calls from 0. Whitespace
  adjacent to a well-formed block (before it, between blocks, after it) is separator markup
  and is not emitted; to know that, trailing whitespace of the text is held back until the
  next non-whitespace.
- A block that holds no call (bad JSON, only unknown tools, no ``<function=``) is emitted
  verbatim as ``TextDelta``, tags and neighbouring whitespace included, and counted in
  ``malformed``. Text after tool calls is emitted too: nothing is dropped except the
  separator whitespace above.
- An open block is kept in pieces and only its tail is searched again, so a long call (a
  whole file as an argument) costs time proportional to its length.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum, auto

from proxy.canonical import TextDelta, ToolCall, ToolCallDelta, ToolSpec
from proxy.parsing.holdback import partial_suffix_len
from proxy.parsing.tool_formats import parse_block
from proxy.settings import ToolParser

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"

ContentEvent = TextDelta | ToolCallDelta


class _Phase(Enum):
    TEXT = auto()
    BLOCK = auto()


class ToolCallSplitter:
    def __init__(
        self, *, parser: ToolParser, tools: Mapping[str, ToolSpec], call_id_prefix: str
    ) -> None:
        self._parser = parser
        # SGLang's qwen25 detector starts a JSON call at "<tool_call>\n" only; an XML one
        # starts at the bare tag.
        self._open = TOOL_CALL_OPEN + ("\n" if parser is ToolParser.QWEN3 else "")
        self._tools = tools
        self._call_id_prefix = call_id_prefix
        self._phase = _Phase.TEXT
        self._held = ""  # text that may be the start of <tool_call>
        self._pending_space = ""  # trailing whitespace of the text, not yet emitted
        self._after_call = False  # the last thing emitted was a well-formed call
        self._block: list[str] = []  # the open block's body so far, in pieces
        self._block_tail = ""  # its last characters, where </tool_call> may have begun
        self._block_lead = ""  # whitespace before the open block (emitted if it is malformed)
        self.calls = 0
        self.malformed = 0

    def push(self, text: str) -> list[ContentEvent]:
        events: list[ContentEvent] = []
        while text:
            if self._phase is _Phase.TEXT:
                text = self._push_text(text, events)
            else:
                text = self._push_block(text, events)
        return events

    def finish(self) -> list[ContentEvent]:
        events: list[ContentEvent] = []
        if self._phase is _Phase.BLOCK:
            body = "".join(self._block)
            self._phase = _Phase.TEXT
            self._close_block(body, "", events, closed=False)
        else:
            held, self._held = self._held, ""
            self._emit_text(held, events)
        if self._pending_space and not self._after_call:
            events.append(TextDelta(self._pending_space))
        self._pending_space = ""
        return events

    def _push_text(self, text: str, events: list[ContentEvent]) -> str:
        """Emit text up to the next <tool_call>; return what follows the tag, if any."""
        buffer, self._held = self._held + text, ""
        start = buffer.find(self._open)
        if start < 0:
            safe = len(buffer) - partial_suffix_len(buffer, (self._open,))
            self._emit_text(buffer[:safe], events)
            self._held = buffer[safe:]
            return ""
        self._emit_text(buffer[:start], events)
        self._block_lead = "" if self._after_call else self._pending_space
        self._pending_space = ""
        self._block.clear()
        self._block_tail = ""
        self._phase = _Phase.BLOCK
        return buffer[start + len(self._open) :]

    def _push_block(self, text: str, events: list[ContentEvent]) -> str:
        """Add text to the open block; at </tool_call>, parse it and return what follows.

        Only the block's last few characters are searched again, so a long call (a whole
        file as an argument) costs time proportional to its length."""
        window = self._block_tail + text
        close = window.find(TOOL_CALL_CLOSE)
        if close < 0:
            self._block.append(text)
            self._block_tail = window[-(len(TOOL_CALL_CLOSE) - 1) :]
            return ""
        cut = close - len(self._block_tail)  # negative: the tag began in an earlier piece
        body = "".join(self._block)
        body = body + text[:cut] if cut >= 0 else body[: len(body) + cut]
        self._block.clear()
        self._phase = _Phase.TEXT
        self._close_block(body, TOOL_CALL_CLOSE, events, closed=True)
        return text[cut + len(TOOL_CALL_CLOSE) :]

    def _close_block(
        self, body: str, close: str, events: list[ContentEvent], *, closed: bool
    ) -> None:
        parsed = parse_block(self._parser, body, self._tools, closed=closed)
        if not parsed:
            self.malformed += 1
            self._emit_raw(self._block_lead + self._open + body + close, events)
        for call in parsed:
            call_id = f"{self._call_id_prefix}{self.calls}"
            events.append(ToolCallDelta(self.calls, ToolCall(call_id, call.name, call.arguments)))
            self.calls += 1
            self._after_call = True
        self._block_lead = ""

    def _emit_raw(self, raw: str, events: list[ContentEvent]) -> None:
        events.append(TextDelta(raw))
        self._after_call = False

    def _emit_text(self, text: str, events: list[ContentEvent]) -> None:
        """Emit text, holding its trailing whitespace and dropping whitespace after a call."""
        if not text:
            return
        combined = self._pending_space + text
        body = combined.rstrip()
        if not body:
            self._pending_space = combined
            return
        self._pending_space = combined[len(body) :]
        if self._after_call:
            body = body.lstrip()
            self._after_call = False
        events.append(TextDelta(body))
