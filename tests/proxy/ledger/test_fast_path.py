"""The ledger's fast path (a recent request re-sent unchanged) answers exactly as the full
match does, and is what a plain harness loop takes."""

from __future__ import annotations

import uuid
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import PreTrainedTokenizerBase

from proxy.canonical import ChatRequest, Message
from proxy.ledger import LedgerBook
from proxy.ledger.fingerprint import Fingerprinter
from proxy.ledger.tree import SessionTree
from tests.proxy.ledger.conftest import SYSTEM, Driver, call, request
from tests.proxy.ledger.test_properties import TEXT, answers, echo


def fresh(messages: list[Message]) -> tuple[Message, ...]:
    """New but equal objects, as decoding the harness's JSON gives every turn."""
    return tuple(replace(m, tool_calls=tuple(replace(c) for c in m.tool_calls)) for m in messages)


def assert_same_as_full_match(tree: SessionTree, req: ChatRequest) -> bool:
    """Checks the fast path against ``match``; says whether the fast path answered."""
    fingerprinter = Fingerprinter()
    fast = tree.continuation(req, fingerprinter)
    if fast is None:
        return False
    match, fingerprints = fast
    full = fingerprinter.of(req)
    slow = tree.match(req.messages, full)
    assert match.turn is slow.turn
    assert match.covered == slow.covered
    offset = fingerprints.offset
    assert offset == slow.covered - 1
    assert fingerprints.seed == full.seed
    assert fingerprints.prefixes == slow.prefixes[offset:]
    assert fingerprints.digests == full.digests[offset:]
    assert fingerprints.free == full.free[offset:]
    assert fingerprints.request == slow.prefixes[-1]
    return True


@settings(max_examples=40, deadline=None)
@given(
    turns=st.lists(
        st.tuples(answers(), st.integers(0, 3), TEXT, st.booleans()), min_size=2, max_size=5
    ),
    edit=st.integers(0, 4),
)
def test_fast_path_equals_full_match(
    tokenizer: PreTrainedTokenizerBase, turns: list[tuple[Message, int, str, bool]], edit: int
) -> None:
    d = Driver(LedgerBook(tokenizer), tokenizer, session_id=uuid.uuid4().hex)
    history: list[Message] = [SYSTEM, Message(role="user", content="Start.")]
    for answer, style, followup, as_tool in turns:
        req = request(*fresh(history))
        tree = d.book.tree(d.session_id)
        if tree is not None:
            # A harness re-sending the history unchanged: the fast path must answer.
            assert assert_same_as_full_match(tree, req)
        plan = d.turn(req, answer)
        assert plan.classification in ("root", "extend")
        history.append(echo(answer, style))
        history.append(Message(role="tool" if as_tool else "user", content=followup))
    tree = d.book.tree(d.session_id)
    assert tree is not None
    # Departures the fast path must leave to the full match (or answer identically).
    variants = [
        request(SYSTEM, Message(role="user", content="Started."), *history[2:]),
        request(*history[:-2], Message(role="user", content="instead")),
        request(*history, tools=()),
        request(*history[:-3], history[-2], history[-1]),  # an answer dropped
        request(*history[:4], Message(role="user", content="retry from turn 1")),
    ]
    assert_same_as_full_match(tree, variants[edit])


def test_plain_tool_loop_takes_the_fast_path(
    book: LedgerBook, tokenizer: PreTrainedTokenizerBase
) -> None:
    d = Driver(book, tokenizer)
    history: list[Message] = [SYSTEM, Message(role="user", content="List the files.")]
    for turn in range(6):
        answer = Message(
            role="assistant", tool_calls=(call("bash", f'{{"command":"ls {turn}"}}', f"c{turn}"),)
        )
        plan = d.turn(request(*history), answer)
        if turn:
            assert plan.classification == "extend"
            # Only the answer and the new tool result were fingerprinted.
            assert plan.fingerprints.offset == len(history) - 2
            assert len(plan.fingerprints.prefixes) == 2
        history += [answer, Message(role="tool", content=f"out {turn}", tool_call_id=f"c{turn}")]


def test_an_edited_earlier_message_is_not_taken_for_a_continuation(
    book: LedgerBook, tokenizer: PreTrainedTokenizerBase
) -> None:
    d = Driver(book, tokenizer)
    first = Message(role="assistant", content="Looking.", tool_calls=(call("bash", "{}", "a"),))
    history = [SYSTEM, Message(role="user", content="Go.")]
    d.turn(request(*history), first)
    history += [first, Message(role="tool", content="x", tool_call_id="a")]
    second = Message(role="assistant", content="Done.")
    d.turn(request(*history), second)
    edited = [SYSTEM, Message(role="user", content="Go!"), *history[2:], second]
    plan = book.plan(d.session_id, request(*edited, Message(role="user", content="More.")))
    assert plan.classification == "fork"
    assert plan.fork_reason == "edited_history"
    assert plan.fingerprints.offset == 0


def test_interleaved_branches_beyond_the_recent_window_still_extend(
    book: LedgerBook, tokenizer: PreTrainedTokenizerBase
) -> None:
    """Six sub-agent-like branches in one session, served round-robin: the oldest fall out
    of the fast path's window of recent requests and are matched in full, still extend."""
    d = Driver(book, tokenizer)
    histories = [
        [Message(role="system", content=f"Agent {i}."), Message(role="user", content=f"Task {i}")]
        for i in range(6)
    ]
    for step in range(3):
        for i, history in enumerate(histories):
            answer = Message(role="assistant", content=f"step {step} of {i}")
            plan = d.turn(request(*history), answer)
            if step:
                assert plan.classification == "extend"
            history += [answer, Message(role="user", content=f"next {step}")]
