"""Incremental rendering: the tokens of only the new messages, joined exactly to sampled ids.

Owns the one place where the chat template renders a continuation. A continuing turn's
prompt is ``earlier prompt + sampled ids (ending with the end-of-turn token) + suffix``;
``suffix_ids(messages)`` is what the template writes after that end-of-turn token for the
new messages plus the generation prompt. It renders them behind a two-message probe (a user
query and an assistant answer holding a marker) and keeps the text after the end-of-turn
token that closes the probe answer, so the cost is O(new messages) whatever the
conversation's length.

How the template writes the probe answer itself does not matter, and it need not be the
same from one render to the next: real templates render an assistant message by what
follows it (Qwen3 writes an empty ``<think>`` block only into the last message, Qwen3.5
only into answers after the last user query). What is pinned is the text before the
answer: every render must begin with the probe query as the template renders it alone, so
a template that moves later messages in front of earlier ones (hoisting a system message)
is refused instead of being cut short silently.

The junction is exact because the end-of-turn token is special: tokenizers never merge
across it, so the suffix tokenizes the same alone or in context.
``proxy.ledger.template_check`` proves this and the rest of the contract for the served
template at start-up.

``closing_ids`` is what the template writes between an assistant's text and its
end-of-turn token (for ChatML: just that token); an answer that stopped without it (length
limit, stop string) gets these ids inserted as prompt tokens before the suffix.

Errors: ``InvalidRequest`` when the template cannot render the new messages (with the
template's own words, e.g. Qwen3.5's "System message must be at the beginning."), or
renders them in front of the earlier ones; ``LegoError`` at construction when the template
cannot render a query and its answer, or does not end the answer with the eos token.
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

from kernel.errors import InvalidRequest, LegoError
from proxy.canonical import ChatRequest, Message, ToolSpec
from proxy.render import Renderer

_MARK = "lego-ledger-probe-answer"
_PROBE: tuple[Message, ...] = (
    Message(role="user", content="lego-ledger-probe-query"),
    Message(role="assistant", content=_MARK),
)


class IncrementalRenderer:
    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        eos = tokenizer.eos_token_id
        if eos is None:
            raise LegoError("the tokenizer has no eos token; the ledger cannot join turns")
        self._tokenizer = tokenizer
        self._renderer = Renderer(tokenizer)
        self.eos_id = eos
        self.eos_text = decoded(tokenizer, [eos])
        try:
            self._head = self._renderer.render_text(
                ledger_request(_PROBE[:1], None), generation_prompt=False
            )
            probe = self._renderer.render_text(ledger_request(_PROBE, None))
        except InvalidRequest as exc:
            raise LegoError(
                f"the chat template cannot render a user query and its answer: {exc.message}"
            ) from exc
        if not probe.startswith(self._head):
            raise LegoError(
                "the chat template renders a user query differently once an answer follows "
                "it; the ledger cannot append to a rendered conversation"
            )
        found = self._cut(probe)
        if found is None:
            raise LegoError(
                f"the chat template does not end an assistant message with the eos token "
                f"{self.eos_text!r}; the ledger cannot join turns"
            )
        mark, cut = found
        self.closing_text = probe[mark + len(_MARK) : cut]
        self.closing_ids: tuple[int, ...] = tuple(
            tokenizer.encode(self.closing_text, add_special_tokens=False)
        )

    def _cut(self, text: str) -> tuple[int, int] | None:
        """(where the probe answer's marker starts, just after its end-of-turn token)."""
        if not text.startswith(self._head):
            return None
        mark = text.find(_MARK, len(self._head))
        end = text.find(self.eos_text, mark + len(_MARK)) if mark >= 0 else -1
        return None if end < 0 else (mark, end + len(self.eos_text))

    def suffix_text(self, messages: Sequence[Message], enable_thinking: bool | None) -> str:
        text = self._renderer.render_text(ledger_request((*_PROBE, *messages), enable_thinking))
        found = self._cut(text)
        if found is None:
            raise InvalidRequest(
                "the chat template rendered the new messages in front of the conversation's "
                "earlier messages, so they cannot be appended to it"
            )
        return text[found[1] :]

    def suffix_ids(
        self, messages: Sequence[Message], enable_thinking: bool | None
    ) -> tuple[int, ...]:
        text = self.suffix_text(messages, enable_thinking)
        return tuple(self._renderer.encode(text))


def decoded(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> str:
    text = tokenizer.decode(ids, skip_special_tokens=False)
    # decode() is typed for batches too; one id list always gives one string.
    return text if isinstance(text, str) else "".join(text)


def ledger_request(
    messages: Sequence[Message], enable_thinking: bool | None, tools: tuple[ToolSpec, ...] = ()
) -> ChatRequest:
    return ChatRequest(
        adapter="ledger",
        model="",
        messages=tuple(messages),
        tools=tools,
        enable_thinking=enable_thinking,
    )
