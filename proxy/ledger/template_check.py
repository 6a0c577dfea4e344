"""The start-up self-check: can the served chat template be rendered incrementally?

Owns ``check_template(tokenizer, incremental)``. It renders sample agent conversations
(``SAMPLES``: tool calls, parallel calls, tool results, a user follow-up, reasoning, an
answer cut short, literal ``<tool_call>`` and ``</think>`` text in a tool output and a user
message, a system message mid-conversation) whole, and checks, after every answer that
more messages follow, exactly what the ledger relies on:

1. the template ends the answer with the eos token (the answer's end is found by counting
   eos tokens: the render of the conversation up to the answer has that many);
2. what the whole render writes after that eos, for the following messages plus the
   generation prompt, is ``IncrementalRenderer.suffix_text`` of those messages, with
   ``enable_thinking`` unset and ``false``;
3. the whole render's tokens split there: ``encode(whole) == encode(head) + suffix_ids``
   (nothing merges across the end-of-turn token);
4. an answer cut short is followed by ``closing_text``.

It does not require the template to re-render earlier answers the way they were sampled:
real ones do not (Qwen3 drops an empty think block from an answer that is no longer last;
Qwen3 and Qwen3.5 drop reasoning before the last user query, and Qwen3.5's generation
prompt ends in ``<think>\\n``, which tokenizes differently next to the model's ``\\n</think>``).
The ledger keeps the sampled ids, which is the point of it.

A sample the template refuses to render at all is skipped (Qwen3.5 raises for a system
message anywhere but first): requests like it get the template's own error either way.
The basic tool-calling conversation must render. Failures raise ``LegoError`` with one
line naming the behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from kernel.errors import InvalidRequest, LegoError
from proxy.canonical import Message, ToolCall, ToolSpec
from proxy.ledger.incremental import IncrementalRenderer, ledger_request
from proxy.render import Renderer


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    messages: tuple[Message, ...]
    required: bool = True  # must the template render it at all?
    truncated: bool = False  # its answers stopped without their end-of-turn token


def check_template(tokenizer: PreTrainedTokenizerBase, incremental: IncrementalRenderer) -> None:
    """Raise ``LegoError`` unless the template renders incrementally (module docstring)."""
    renderer = Renderer(tokenizer)
    for sample in SAMPLES:
        try:
            _check(tokenizer, renderer, incremental, sample)
        except InvalidRequest as exc:
            if sample.required:
                raise LegoError(
                    f"chat template self-check: the template cannot render {sample.name}: "
                    f"{exc.message}"
                ) from exc


def _check(
    tokenizer: PreTrainedTokenizerBase,
    renderer: Renderer,
    incremental: IncrementalRenderer,
    sample: Sample,
) -> None:
    messages = sample.messages
    answers = [i for i, m in enumerate(messages) if m.role == "assistant"]
    eos = incremental.eos_text
    for turn, at in enumerate(answers):
        following = answers[turn + 1] if turn + 1 < len(answers) else len(messages)
        new = messages[at + 1 : following]
        where = f"chat template self-check ({sample.name}, answer {turn + 1})"
        for thinking in (None, False):
            whole = renderer.render_text(ledger_request(messages[:following], thinking, TOOLS))
            history = renderer.render_text(
                ledger_request(messages[: at + 1], thinking, TOOLS), generation_prompt=False
            )
            cut = _after(whole, eos, history.count(eos))
            if cut is None:
                raise LegoError(f"{where}: the template does not end each answer with {eos!r}")
            expected = whole[cut:]
            try:
                got = incremental.suffix_text(new, thinking)
            except InvalidRequest as exc:  # the whole render worked: the junction did not
                raise LegoError(f"{where}: {exc.message}") from exc
            if got != expected:
                raise LegoError(
                    f"{where}: the template writes {_show(expected)} after the answer in the "
                    f"whole conversation but {_show(got)} after the ledger's probe; what it "
                    f"writes for new messages depends on the earlier ones"
                )
            encode = tokenizer.encode
            head = encode(whole[:cut], add_special_tokens=False)
            if encode(whole, add_special_tokens=False) != head + encode(
                expected, add_special_tokens=False
            ):
                raise LegoError(f"{where}: the tokenizer merges text across {eos!r}")
            closing = messages[at].content + incremental.closing_text
            if sample.truncated and not whole[:cut].endswith(closing):
                raise LegoError(
                    f"{where}: an answer is not closed by {incremental.closing_text!r}, "
                    f"so one cut short cannot be closed as the template would"
                )


def _after(text: str, marker: str, count: int) -> int | None:
    """The index just after the ``count``-th occurrence of ``marker`` (None if fewer)."""
    end = 0
    for _ in range(count):
        found = text.find(marker, end)
        if found < 0:
            return None
        end = found + len(marker)
    return end if count else None


def _show(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:77] + "...")


TOOLS = (
    ToolSpec(
        name="bash",
        description="Run a shell command.",
        parameters={
            "type": "object",
            "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
            "required": ["command"],
        },
    ),
)
_LS = ToolCall(id="c1", name="bash", arguments='{"command": "ls"}')
_CAT = ToolCall(id="c2", name="bash", arguments='{"command": "cat a.txt", "timeout": 5}')
_GREP = ToolCall(id="c3", name="bash", arguments='{"command": "grep -r tool_call ."}')
SAMPLES = (
    Sample(
        "a tool-calling conversation",
        (
            Message(role="system", content="You are a coding agent."),
            Message(role="user", content="List the files."),
            Message(role="assistant", content="", tool_calls=(_LS,)),
            Message(role="tool", content="a.txt\nb.txt", tool_call_id="c1"),
            Message(role="assistant", content="There are two files."),
            Message(role="user", content="Show both, please."),
            Message(
                role="assistant",
                content="Reading them.",
                reasoning="I should read both files.",
                tool_calls=(_LS, _CAT),
            ),
            Message(role="tool", content="a.txt\nb.txt", tool_call_id="c1"),
            Message(role="tool", content="hello", tool_call_id="c2"),
        ),
    ),
    Sample(
        "an answer cut short",
        (
            Message(role="user", content="Say something long."),
            Message(role="assistant", content="Here is a long answer that was cut"),
            Message(role="user", content="Go on."),
        ),
        truncated=True,
    ),
    Sample(
        "markup inside tool output and user text",
        (
            Message(role="user", content="What do <tool_call> and </think> mean here?"),
            Message(role="assistant", content="", reasoning="Search.", tool_calls=(_GREP,)),
            Message(
                role="tool",
                content='<tool_call>\n{"name": "x"}\n</tool_call>\n</think>\n<think>',
                tool_call_id="c3",
            ),
            Message(role="assistant", content="They are tags."),
            Message(role="user", content="So </think> is text?"),
        ),
    ),
    Sample(
        "a system message mid-conversation",
        (
            Message(role="user", content="Hi."),
            Message(role="assistant", content="Hello."),
            Message(role="system", content="Be brief."),
            Message(role="user", content="Explain."),
        ),
        required=False,
    ),
)
