"""The output parser: sampled token ids in, canonical output events out, incrementally.

Owns ``OutputParser``, the one object the pipeline drives per turn: ``feed`` it the newly
sampled ids as they arrive, then call ``finish`` once. It chains four stages, each owned by
its own module:

    ids -> IncrementalDetokenizer -> StopTrimmer -> ReasoningSplitter -> ToolCallSplitter
           (text, no partial chars)  (stop tail)   (reasoning/content)   (text/tool calls)

Contract:
- Events come out in output order: ``ReasoningDelta``, ``TextDelta``, ``ToolCallDelta``
  (never ``TurnFinished``: the pipeline owns that). Adjacent deltas of one kind produced by
  one call are merged, so the folded result does not depend on how the ids were chunked.
- Nothing the model produced is lost or duplicated: reasoning, text and the raw text of
  malformed calls, plus the markup (tags, the whitespace the stages document as markup,
  well-formed call blocks, a trimmed stop string) make up the decoded output exactly.
- Tool calls are parsed only when ``tools_enabled`` and ``tools`` is not empty; otherwise
  all non-reasoning text is content.
- ``reasoning_tokens`` counts the fed tokens from the start of the output up to and
  including the one that completed ``</think>`` (or up to, not including, the
  ``<tool_call>`` that closed the reasoning); an unclosed reasoning counts every fed token,
  no reasoning counts 0. Mid-stream it counts the tokens fed so far while reasoning is open.
- Nothing is ever re-tokenized; the parser only decodes. The tags in ``MARKUP`` are read
  from the sampled ids whether or not the tokenizer flags their tokens special.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kernel.errors import LegoError
from proxy.canonical import OutputEvent, ReasoningDelta, TextDelta, ToolSpec
from proxy.parsing.detokenize import IncrementalDetokenizer, special_token_ids
from proxy.parsing.holdback import StopTrimmer
from proxy.parsing.reasoning import THINK_CLOSE, THINK_OPEN, ReasoningSplitter, Split
from proxy.parsing.tool_calls import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, ToolCallSplitter
from proxy.settings import ToolParser

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# The tags the stages read: their text is decoded even where a tokenizer flags them special.
MARKUP = (THINK_OPEN, THINK_CLOSE, TOOL_CALL_OPEN, TOOL_CALL_CLOSE)


def parser_special_ids(tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """The ids an ``OutputParser`` decodes to no text (0.1 ms a call on Qwen3.5's tokenizer)."""
    return special_token_ids(tokenizer, MARKUP)


class OutputParser:
    def __init__(
        self,
        *,
        tokenizer: PreTrainedTokenizerBase,
        tool_parser: ToolParser,
        tools: tuple[ToolSpec, ...],
        stop: tuple[str, ...] = (),
        call_id_prefix: str = "call_",
        starts_in_reasoning: bool = False,
        tools_enabled: bool = True,
        special_ids: frozenset[int] | None = None,
    ) -> None:
        """``special_ids``: ``parser_special_ids(tokenizer)``, for a caller that makes a
        parser per turn (computed here when not given)."""
        parse_tools = tools_enabled and bool(tools)
        self._detokenizer = IncrementalDetokenizer(tokenizer, keep=MARKUP, special=special_ids)
        self._stops = StopTrimmer(stop)
        self._reasoning = ReasoningSplitter(
            starts_in_reasoning=starts_in_reasoning, closes_on_tool_call=parse_tools
        )
        self._tool_calls: ToolCallSplitter | None = None
        if parse_tools:
            self._tool_calls = ToolCallSplitter(
                parser=tool_parser,
                tools={tool.name: tool for tool in tools},
                call_id_prefix=call_id_prefix,
            )
        self._reasoning_tokens: int | None = None  # set once the reasoning's end is known
        self._finished = False

    @property
    def malformed_tool_calls(self) -> int:
        return self._tool_calls.malformed if self._tool_calls else 0

    @property
    def has_tool_calls(self) -> bool:
        return self._tool_calls is not None and self._tool_calls.calls > 0

    @property
    def reasoning_tokens(self) -> int:
        if self._reasoning_tokens is not None:
            return self._reasoning_tokens
        return self._detokenizer.token_count if self._reasoning.in_reasoning else 0

    def feed(self, token_ids: Sequence[int]) -> list[OutputEvent]:
        """Events for the newly sampled ids (possibly none while text is held back)."""
        if self._finished:
            raise LegoError("OutputParser.feed called after finish")
        text = self._stops.push(self._detokenizer.feed(token_ids))
        split = self._reasoning.push(text)
        self._settle_reasoning_tokens()
        return self._events(split, final=False)

    def finish(self, matched_stop: str | None = None) -> list[OutputEvent]:
        """Flush everything held back; ``matched_stop`` is trimmed if the output ends with it."""
        if self._finished:
            raise LegoError("OutputParser.finish called twice")
        self._finished = True
        text = self._stops.push(self._detokenizer.finish()) + self._stops.finish(matched_stop)
        first = self._reasoning.push(text)
        self._settle_reasoning_tokens()
        last = self._reasoning.finish()
        if self._reasoning_tokens is None:
            self._reasoning_tokens = self.reasoning_tokens
        split = Split(first.reasoning + last.reasoning, first.content + last.content)
        return self._events(split, final=True)

    def _settle_reasoning_tokens(self) -> None:
        if self._reasoning_tokens is not None or not self._reasoning.decided:
            return
        end = self._reasoning.reasoning_end
        self._reasoning_tokens = 0 if end is None else self._detokenizer.tokens_for_chars(end)
        self._detokenizer.stop_tracking()

    def _events(self, split: Split, *, final: bool) -> list[OutputEvent]:
        events: list[OutputEvent] = []
        if split.reasoning:
            events.append(ReasoningDelta(split.reasoning))
        if self._tool_calls is None:
            if split.content:
                events.append(TextDelta(split.content))
            return events
        content = self._tool_calls.push(split.content)
        if final:
            content += self._tool_calls.finish()
        for event in content:
            previous = events[-1] if events else None
            if isinstance(event, TextDelta) and isinstance(previous, TextDelta):
                events[-1] = TextDelta(previous.text + event.text)
            else:
                events.append(event)
        return events
