"""Incremental rendering: the tokens of only the new messages, joined exactly to sampled ids.

Owns the one place where the chat template renders a continuation. A continuing turn's
prompt is ``earlier prompt + sampled ids (ending with the end-of-turn token) + suffix``;
``suffix_ids(messages)`` is what the template writes after that end-of-turn token for the
new messages plus the generation prompt. It renders them behind a two-message probe (a user
query and an assistant answer holding a marker), cuts the text after the probe answer's
end-of-turn token and tokenizes the rest, so the cost is O(new messages) whatever the
conversation's length. The junction is exact because the end-of-turn token is special:
tokenizers never merge across it, so the suffix tokenizes the same alone or in context.

``closing_ids`` is what the template writes between an assistant's text and its
end-of-turn token (for ChatML: just that token); an answer that stopped without it (length
limit, stop string) gets these ids inserted as prompt tokens before the suffix.

The markers are derived from the template's own output, not hard-coded. The contract
needs a template where an assistant message ends with the tokenizer's eos token and what
follows depends only on the later messages (ChatML/Qwen style); ``self_check`` proves it
for a served template by comparing incremental against whole renders, and raises
``LegoError`` when they differ. Template errors on new messages raise ``InvalidRequest``.
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

from kernel.errors import InvalidRequest, LegoError
from proxy.canonical import ChatRequest, Message, ToolCall, ToolSpec
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
        eos_text = self._eos_text = _text(tokenizer.decode([eos], skip_special_tokens=False))
        probe = self._renderer.render_text(_request(_PROBE, None))
        mark = probe.rfind(_MARK)
        end = probe.find(eos_text, mark + len(_MARK)) if mark >= 0 else -1
        if end < 0:
            raise LegoError("the chat template does not end assistant messages with eos")
        self._cut = end + len(eos_text)
        self._prefix = probe[: self._cut]
        self.closing_ids: tuple[int, ...] = tuple(
            tokenizer.encode(probe[mark + len(_MARK) : self._cut], add_special_tokens=False)
        )

    def suffix_ids(
        self, messages: Sequence[Message], enable_thinking: bool | None
    ) -> tuple[int, ...]:
        text = self._renderer.render_text(_request((*_PROBE, *messages), enable_thinking))
        if not text.startswith(self._prefix):
            raise InvalidRequest("the chat template rendered the new messages out of order")
        return tuple(self._tokenizer.encode(text[self._cut :], add_special_tokens=False))

    def self_check(self) -> None:
        """Render sample conversations whole and incrementally; raise if they disagree."""
        for messages, truncate in _SELF_CHECK:
            self._check(messages, truncate)

    def _check(self, messages: tuple[Message, ...], truncate: bool) -> None:
        tools = _SELF_CHECK_TOOLS
        answers = [i for i, m in enumerate(messages) if m.role == "assistant"]
        first = answers[0]
        ids = list(self._renderer.render(_request(messages[:first], None, tools)))
        text = self._renderer.render_text(_request(messages[:first], None, tools))
        eos_text = self._eos_text
        for turn, index in enumerate(answers):
            following = answers[turn + 1] if turn + 1 < len(answers) else len(messages)
            answer = messages[index]
            if truncate:
                answer = Message(
                    role="assistant", content=answer.content[: len(answer.content) // 2]
                )
            whole_text = self._renderer.render_text(
                _request((*messages[:index], answer, *messages[index + 1 : following]), None, tools)
            )
            if not whole_text.startswith(text):
                raise LegoError("chat template self-check: history re-renders differently")
            body = whole_text[len(text) : whole_text.index(eos_text, len(text))]
            # What a model sampling the template's own text would have produced.
            sampled = self._tokenizer.encode(body, add_special_tokens=False)
            sampled += [self.eos_id] if not truncate else list(self.closing_ids)
            ids += sampled
            ids += self.suffix_ids(messages[index + 1 : following], None)
            whole = self._tokenizer.encode(whole_text, add_special_tokens=False)
            if ids != whole:
                raise LegoError(
                    f"chat template self-check: incremental rendering differs from a whole "
                    f"render at turn {turn + 1} (truncated={truncate})"
                )
            text = whole_text


def _text(decoded: str | list[str]) -> str:
    # decode() is typed for batches too; one id list always gives one string.
    return decoded if isinstance(decoded, str) else "".join(decoded)


def _request(
    messages: Sequence[Message], enable_thinking: bool | None, tools: tuple[ToolSpec, ...] = ()
) -> ChatRequest:
    return ChatRequest(
        adapter="ledger",
        model="",
        messages=tuple(messages),
        tools=tools,
        enable_thinking=enable_thinking,
    )


_SELF_CHECK_TOOLS = (
    ToolSpec(
        name="bash",
        description="Run a shell command.",
        parameters={"type": "object", "properties": {"command": {"type": "string"}}},
    ),
)
_CALL_LS = ToolCall(id="c1", name="bash", arguments='{"command": "ls"}')
_CALL_CAT = ToolCall(id="c2", name="bash", arguments='{"command": "cat a.txt"}')
_SELF_CHECK: tuple[tuple[tuple[Message, ...], bool], ...] = (
    (
        (
            Message(role="system", content="You are a coding agent."),
            Message(role="user", content="List the files."),
            Message(role="assistant", content="", tool_calls=(_CALL_LS,)),
            Message(role="tool", content="a.txt\nb.txt", tool_call_id="c1"),
            Message(role="assistant", content="There are two files."),
            Message(role="user", content="Show both, please."),
            Message(role="system", content="Be brief."),
            Message(
                role="assistant",
                content="Reading them.",
                reasoning="I should read both files.",
                tool_calls=(_CALL_LS, _CALL_CAT),
            ),
            Message(role="tool", content="a.txt\nb.txt", tool_call_id="c1"),
            Message(role="tool", content="hello", tool_call_id="c2"),
        ),
        False,
    ),
    (
        (
            Message(role="user", content="Say something long."),
            Message(role="assistant", content="Here is a long answer that was cut short"),
            Message(role="user", content="Go on."),
        ),
        True,
    ),
)
