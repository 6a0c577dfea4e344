"""Which turn is a session's root when a side request arrives before the main conversation.

Modelled on OpenCode without ``--title``: its title request (a title-generator system
prompt, no tools, the task quoted as a second user message) is sent first and answered
before the agent loop's first request arrives.
"""

from __future__ import annotations

import uuid

from transformers import PreTrainedTokenizerBase

from proxy.canonical import ChatRequest, Message
from proxy.ledger import Classification, ForkReason, LedgerBook, PromptPlan
from tests.proxy.ledger.conftest import READ, SYSTEM, Driver, call, request, sampled

TASK = Message(role="user", content='"LEGO-TASK-opencode-basic: create out.txt."')
TITLE = request(
    Message(role="system", content="You are a title generator. You output ONLY a thread title."),
    Message(role="user", content="Generate a title for this conversation:"),
    TASK,
    tools=(),
)
TITLE_ANSWER = Message(role="assistant", content="Write the greeting file")
MAIN = request(SYSTEM, TASK)
A1 = Message(
    role="assistant",
    content="",
    reasoning="I will use the shell.",
    tool_calls=(call("bash", '{"command":"echo hi > out.txt"}'),),
)
T1 = Message(role="tool", content="(no output)", tool_call_id="call_1")
A2 = Message(role="assistant", content="Done: out.txt is written.")


def kind(plan: PromptPlan) -> str:
    return plan.classification + (f":{plan.fork_reason}" if plan.fork_reason else "")


def test_a_title_request_before_the_main_conversation_is_re_labelled_a_side_request(
    book: LedgerBook, tokenizer: PreTrainedTokenizerBase
) -> None:
    d = Driver(book, tokenizer)
    title = d.turn(TITLE, TITLE_ANSWER, turn_id="title")
    main = d.turn(MAIN, A1, turn_id="main")
    follow = d.turn(request(SYSTEM, TASK, A1, T1), A2)
    assert [kind(p) for p in (title, main, follow)] == ["root", "root", "extend"]
    assert (main.side_requests, main.parent_turn_id, main.reused_prefix_len) == (
        ("title",),
        None,
        0,
    )
    assert follow.parent_turn_id == "main"
    # The ledger holds the re-label: a retry of the title request gets the new label.
    retried = book.plan(d.session_id, TITLE)
    assert retried.prompt_ids == title.prompt_ids
    assert kind(retried) == "fork:side_request"
    # Later requests see one root, so the rule does not fire twice.
    assert book.plan(d.session_id, request(SYSTEM, TASK, A1, T1)).side_requests == ()
    assert book.plan(d.session_id, MAIN).side_requests == ()


def test_side_requests_already_classified_stay_and_every_earlier_root_is_named(
    book: LedgerBook, tokenizer: PreTrainedTokenizerBase
) -> None:
    d = Driver(book, tokenizer)
    d.turn(TITLE, TITLE_ANSWER, turn_id="title")
    summary_system = Message(role="system", content="Summarise the request in five words.")
    second = d.turn(request(summary_system, TASK, tools=()), TITLE_ANSWER, turn_id="second")
    main = d.turn(MAIN, A1, turn_id="main")
    assert kind(second) == "fork:side_request"
    assert main.classification == "root"
    assert main.side_requests == ("title",)


def commit(
    book: LedgerBook,
    session: str,
    plan: PromptPlan,
    work: tuple[ChatRequest, Message],
    turn_id: str,
    tokenizer: PreTrainedTokenizerBase,
) -> PromptPlan:
    req, answer = work
    return book.commit(session, plan, req, sampled(tokenizer, answer), answer, turn_id)


def test_first_turns_in_flight_together_settle_the_same_in_either_commit_order(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    """Both arrive at an empty session, so both are planned as roots."""
    outcomes = []
    for order in (("title", "main"), ("main", "title")):
        book, session = LedgerBook(tokenizer), uuid.uuid4().hex
        plans = {"title": book.plan(session, TITLE), "main": book.plan(session, MAIN)}
        assert {kind(p) for p in plans.values()} == {"root"}
        work = {"title": (TITLE, TITLE_ANSWER), "main": (MAIN, A1)}
        committed = {
            name: commit(book, session, plans[name], work[name], name, tokenizer) for name in order
        }
        labels = {
            name: "fork:side_request"
            if name in committed["main"].side_requests
            else kind(committed[name])
            for name in committed
        }
        outcomes.append(labels)
        assert kind(book.plan(session, TITLE)) == "fork:side_request"
        assert committed[order[1]].prompt_ids == plans[order[1]].prompt_ids
    assert outcomes == [{"title": "fork:side_request", "main": "root"}] * 2


def test_what_does_not_make_a_new_root(
    book: LedgerBook, tokenizer: PreTrainedTokenizerBase
) -> None:
    other = Message(role="system", content="You are a search sub-agent.")
    query = Message(role="user", content="Find every txt file.")
    # An agent loop first: a later fresh request with tools is a sub-agent.
    d = Driver(book, tokenizer)
    d.turn(MAIN, A1)
    assert kind(d.turn(request(other, query, tools=(READ,)), A2)) == "fork:subagent"
    # A tool-less chat that went on for a turn is a conversation, not a side request.
    d = Driver(book, tokenizer)
    d.turn(request(other, query, tools=()), A2)
    d.turn(request(other, query, A2, Message(role="user", content="More."), tools=()), A2)
    assert d.turn(MAIN, A1).classification == "fork"
    # A tool-less first request followed by another tool-less one: no main loop yet.
    d = Driver(book, tokenizer)
    d.turn(TITLE, TITLE_ANSWER)
    assert kind(d.turn(request(other, query, tools=()), A2)) == "fork:side_request"
    # Under the same system prompt, the tool-less turn was the conversation itself.
    d = Driver(book, tokenizer)
    d.turn(request(SYSTEM, TASK, tools=()), A2)
    plan = d.turn(MAIN, A1)
    assert (plan.classification, plan.side_requests) == (Classification.FORK, ())
    assert plan.fork_reason is not ForkReason.SIDE_REQUEST


def test_a_re_label_is_made_once_when_the_main_request_is_sent_twice_at_once(
    book: LedgerBook, tokenizer: PreTrainedTokenizerBase
) -> None:
    d = Driver(book, tokenizer)
    d.turn(TITLE, TITLE_ANSWER, turn_id="title")
    first, again = book.plan(d.session_id, MAIN), book.plan(d.session_id, MAIN)
    assert first.side_requests == again.side_requests == ("title",)
    committed = [
        commit(book, d.session_id, plan, (MAIN, A1), name, tokenizer)
        for plan, name in ((first, "main"), (again, "main-again"))
    ]
    assert [c.side_requests for c in committed] == [("title",), ()]
