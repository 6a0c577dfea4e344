"""Property: whatever a harness does to the echo, extend never changes a sampled token,
and every departure from the branch is a classified fork."""

from __future__ import annotations

import json
import uuid

from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import PreTrainedTokenizerBase

from proxy.canonical import Message, ToolCall
from proxy.ledger import LedgerBook
from proxy.tokens import TokenIds
from tests.proxy.ledger.conftest import SYSTEM, Driver, request

WORDS = st.sampled_from(["ls", "cat", "file", "über", "  ", "\n", "{", '"x"', "done", "42"])
TEXT = st.lists(WORDS, min_size=1, max_size=6).map(" ".join)
ARGS = st.dictionaries(st.sampled_from(["command", "path", "n"]), st.one_of(TEXT, st.integers()))


@st.composite
def answers(draw: st.DrawFn) -> Message:
    calls = tuple(
        ToolCall(
            id=f"c{i}",
            name=draw(st.sampled_from(["bash", "read"])),
            arguments=json.dumps(args, separators=(",", ":")),
        )
        for i, args in enumerate(draw(st.lists(ARGS, max_size=2)))
    )
    return Message(
        role="assistant",
        content=draw(TEXT).strip() if draw(st.booleans()) or not calls else "",
        reasoning=draw(st.one_of(st.none(), TEXT.map(str.strip).filter(bool))),
        tool_calls=calls,
    )


def echo(answer: Message, style: int) -> Message:
    """A harness's re-serialization of the proxy's answer."""
    calls = answer.tool_calls
    if style in (1, 3):  # Python json.dumps with reversed key order, new ids
        calls = tuple(
            ToolCall(
                id=f"other_{c.id}",
                name=c.name,
                arguments=json.dumps(dict(reversed(json.loads(c.arguments).items()))),
            )
            for c in calls
        )
    return Message(
        role="assistant",
        content=f" {answer.content}\n" if style >= 2 else answer.content,
        reasoning=None if style in (1, 2) else answer.reasoning,
        tool_calls=calls,
    )


@settings(max_examples=40, deadline=None)
@given(
    turns=st.lists(
        st.tuples(answers(), st.integers(0, 3), TEXT, st.booleans()), min_size=1, max_size=5
    ),
    mutation=st.integers(0, 3),
)
def test_extends_keep_sampled_tokens_and_departures_are_classified(
    tokenizer: PreTrainedTokenizerBase, turns: list[tuple[Message, int, str, bool]], mutation: int
) -> None:
    d = Driver(LedgerBook(tokenizer), tokenizer, session_id=uuid.uuid4().hex)
    history: list[Message] = [SYSTEM, Message(role="user", content="Start.")]
    for answer, style, followup, as_tool in turns:
        plan = d.turn(request(*history), answer)  # Driver asserts the token prefix
        assert plan.classification in ("root", "extend")
        history.append(echo(answer, style))
        history.append(Message(role="tool" if as_tool else "user", content=followup))
    # A departure: an edited first message, another system prompt, other tools, or a
    # fresh single-query conversation.
    if mutation == 0:
        changed = request(SYSTEM, Message(role="user", content="Started."), *history[2:])
    elif mutation == 1:
        changed = request(Message(role="system", content="Other."), *history[1:])
    elif mutation == 2:
        changed = request(*history, tools=())
    else:
        changed = request(
            Message(role="system", content="Sub."), Message(role="user", content="Go")
        )
    plan = d.book.plan(d.session_id, changed)
    assert plan.classification == "fork"
    assert plan.fork_reason is not None
    assert plan.fork_reason != "unknown"
    assert plan.reused_prefix_len > 0
    assert plan.parent_turn_id in d.tokens


@settings(max_examples=300, deadline=None)
@given(
    output=st.lists(st.sampled_from(["think", "eos", "x"]), max_size=300),
    prompt=st.lists(st.sampled_from(["think", "eos", "x"]), min_size=1, max_size=80),
)
def test_a_turn_thinks_when_its_answer_or_generation_prompt_opens_a_think_block(
    tokenizer: PreTrainedTokenizerBase, output: list[str], prompt: list[str]
) -> None:
    """The list search (short answers) and numpy's (long ones) agree with the rule: a
    ``<think>`` in the answer, or after the prompt's last eos within its last 32 ids."""
    book = LedgerBook(tokenizer)
    think = int(tokenizer.convert_tokens_to_ids("<think>"))  # type: ignore[arg-type]
    eos = int(tokenizer.convert_tokens_to_ids("<|im_end|>"))  # type: ignore[arg-type]
    assert (book._think_id, book._incremental.eos_id) == (think, eos)  # the ids it searches
    ids = {"think": think, "eos": eos, "x": 11}
    out = [ids[k] for k in output]
    window = [ids[k] for k in prompt][-32:]
    last_eos = max((i for i, t in enumerate(window) if t == eos), default=-1)
    after_eos = window[last_eos + 1 :]
    expected = think in out or think in after_eos
    assert book._thinks(TokenIds([ids[k] for k in prompt]), TokenIds(out)) is expected
