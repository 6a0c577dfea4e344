"""Splits the decoded output stream into reasoning and content, with Qwen3 semantics.

Owns ``ReasoningSplitter``. Contract (text in, in order; ``Split`` pieces out):

- Reasoning exists only if the output begins, after optional whitespace, with ``<think>``,
  or if ``starts_in_reasoning`` (the chat template already put ``<think>`` in the prompt).
  Otherwise everything is content, byte for byte.
- Reasoning runs until ``</think>``. When ``closes_on_tool_call``, a ``<tool_call>`` inside
  reasoning also ends it (a Qwen3.5 quirk); the tag then stays in the content stream so the
  tool-call splitter sees it.
- Whitespace that belongs to the markup is dropped, precisely: the whitespace before an
  opening ``<think>``; the one ``\\n`` right after ``<think>`` (or at the very start when
  ``starts_in_reasoning``); the one ``\\n`` right before the closing tag; every ``\\n``
  right after ``</think>`` (the template writes ``</think>\\n\\n``). Nothing else is dropped.
- Text that may still become a tag (``</thi``) or the droppable newline is held back until
  the next chunk decides it; ``finish()`` releases what is held as what it turned out to be.
- ``reasoning_end`` is the offset (in characters of the stream) where reasoning ended: just
  after ``</think>``, or at the ``<tool_call>`` that closed it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, auto

from proxy.parsing.holdback import partial_suffix_len

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
TOOL_CALL_OPEN = "<tool_call>"


class _Phase(Enum):
    DECIDING = auto()  # no non-whitespace seen yet: is this a <think> block?
    OPENED = auto()  # right after <think>: one newline to drop
    REASONING = auto()
    CLOSED = auto()  # right after </think>: newlines to drop
    CONTENT = auto()


@dataclass(frozen=True, slots=True)
class Split:
    reasoning: str = ""
    content: str = ""


class ReasoningSplitter:
    def __init__(self, *, starts_in_reasoning: bool, closes_on_tool_call: bool) -> None:
        self._phase = _Phase.OPENED if starts_in_reasoning else _Phase.DECIDING
        self._close_tags = (THINK_CLOSE, TOOL_CALL_OPEN) if closes_on_tool_call else (THINK_CLOSE,)
        self._buffer = ""
        self._offset = 0  # stream offset of _buffer[0]
        self.reasoning_end: int | None = None

    @property
    def in_reasoning(self) -> bool:
        return self._phase in (_Phase.OPENED, _Phase.REASONING)

    @property
    def decided(self) -> bool:
        """True once it is known whether reasoning ends and where (or that there is none)."""
        return self._phase in (_Phase.CLOSED, _Phase.CONTENT)

    def push(self, text: str) -> Split:
        self._buffer += text
        reasoning: list[str] = []
        content: list[str] = []
        while self._buffer and self._step(reasoning, content):
            pass
        return Split("".join(reasoning), "".join(content))

    def finish(self) -> Split:
        split = self.push("")
        rest, self._buffer = self._buffer, ""
        self._offset += len(rest)
        if self._phase is _Phase.REASONING:
            return Split(split.reasoning + rest, split.content)
        if self._phase is _Phase.DECIDING:
            # Only whitespace or a partial "<think" arrived: that is content after all.
            return Split(split.reasoning, split.content + rest)
        return split

    def _consume(self, n: int) -> str:
        taken, self._buffer = self._buffer[:n], self._buffer[n:]
        self._offset += n
        return taken

    def _step(self, reasoning: list[str], content: list[str]) -> bool:
        """Process the buffer in the current phase; False when more text is needed."""
        buffer = self._buffer
        if self._phase is _Phase.DECIDING:
            stripped = buffer.lstrip()
            if not stripped or (THINK_OPEN.startswith(stripped) and stripped != THINK_OPEN):
                return False
            if stripped.startswith(THINK_OPEN):
                self._consume(len(buffer) - len(stripped) + len(THINK_OPEN))
                self._phase = _Phase.OPENED
            else:
                self._phase = _Phase.CONTENT
            return True
        if self._phase is _Phase.OPENED:
            if buffer.startswith("\n"):
                self._consume(1)
            self._phase = _Phase.REASONING
            return True
        if self._phase is _Phase.REASONING:
            return self._step_reasoning(reasoning)
        if self._phase is _Phase.CLOSED:
            newlines = len(buffer) - len(buffer.lstrip("\n"))
            self._consume(newlines)
            if self._buffer:
                self._phase = _Phase.CONTENT
            return bool(self._buffer)
        content.append(self._consume(len(buffer)))
        return False

    def _step_reasoning(self, reasoning: list[str]) -> bool:
        buffer = self._buffer
        found = [(i, tag) for tag in self._close_tags if (i := buffer.find(tag)) >= 0]
        if found:
            index, tag = min(found)
            body = self._consume(index)
            reasoning.append(body.removesuffix("\n"))
            if tag == THINK_CLOSE:
                self._consume(len(THINK_CLOSE))
                self._phase = _Phase.CLOSED
            else:
                self._phase = _Phase.CONTENT
            self.reasoning_end = self._offset
            return True
        held = partial_suffix_len(buffer, self._close_tags)
        safe = len(buffer) - held
        if buffer[:safe].endswith("\n"):
            safe -= 1  # it may be the newline before the closing tag
        reasoning.append(self._consume(safe))
        return False
