"""Restart safety: a ledger rebuilt from stored turns plans exactly what the live one does.

Turns go through the real recorder (migrated database, ``Store.write_turns`` and
``list_turns``), which also proves the ledger columns round-trip.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import replace

import orjson
import pytest
from transformers import PreTrainedTokenizerBase

from proxy.canonical import ChatRequest, Message
from proxy.conversations import ConversationBook, recorded_requests
from proxy.ledger import LedgerBook, PromptPlan, decode_message, decode_request
from proxy.ledger.codec import answer_of
from recorder.records import SessionSpec, TurnRecord, TurnStatus
from recorder.store import Store
from tests.proxy.ledger.conftest import SYSTEM, call, request, sampled

USER = Message(role="user", content="Fix the bug.")
A1 = Message(
    role="assistant",
    content="",
    reasoning="Look first.",
    tool_calls=(call("bash", '{"command":"ls"}'),),
)
T1 = Message(role="tool", content="main.py", tool_call_id="call_1")
A2 = Message(role="assistant", content="Found main.py, which is cut")
SUB = Message(role="system", content="You are a sub-agent.")


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    store = await Store.open(database_url)
    yield store
    await store.close()


def record(
    session_id: str,
    seq: int,
    plan: PromptPlan,
    req: ChatRequest,
    output: tuple[int, ...],
    answer: Message,
    status: TurnStatus = TurnStatus.COMPLETED,
    conversations: ConversationBook | None = None,
) -> TurnRecord:
    """The turn as the pipeline records it (the request stored linearly when
    ``conversations`` holds the session's earlier turns)."""
    encoded = (conversations or ConversationBook()).encode(session_id, plan.parent_turn_id, req)
    return TurnRecord(
        id=uuid.uuid4().hex,
        session_id=session_id,
        seq=seq,
        adapter=req.adapter,
        requested_model=req.model,
        status=status,
        prompt_ids=plan.prompt_ids,
        output_ids=output,
        logprobs=tuple(-0.5 for _ in output),
        routed_experts=None,
        finish_reason="stop",
        weight_version="w0",
        request_messages=encoded.data,
        messages_inherited=encoded.inherited,
        response_message=answer_of(answer).encode(),
        parent_turn_id=plan.parent_turn_id,
        classification=plan.classification,
        fork_reason=plan.fork_reason,
        reused_prefix_len=plan.reused_prefix_len,
    )


def test_recorded_requests_and_answers_decode_to_the_canonical_form(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    req = request(SYSTEM, USER, A1, T1, enable_thinking=False)
    assert decode_request(orjson.dumps(req)) == req
    plan = LedgerBook(tokenizer).plan("s", req)
    assert decode_message(record("s", 0, plan, req, (1,), A1).response_message) == A1


async def test_a_rebuilt_ledger_extends_with_the_same_ids(
    store: Store, tokenizer: PreTrainedTokenizerBase
) -> None:
    run = await store.create_run(f"run-{uuid.uuid4().hex[:8]}")
    session = await store.create_session(
        SessionSpec(run_id=run.id, task_id="t", group_id="g", sample_index=0, harness="h")
    )
    live = LedgerBook(tokenizer)
    conversations = ConversationBook()
    records: list[TurnRecord] = []
    script = [
        (request(SYSTEM, USER), A1, True),
        (request(SUB, Message(role="user", content="Search."), tools=()), A2, True),
        (request(SYSTEM, USER, A1, T1), A2, False),  # cut by the length limit
    ]
    for seq, (req, answer, eos) in enumerate(script):
        plan = live.plan(session.id, req)
        output = sampled(tokenizer, answer, eos=eos)
        rec = record(session.id, seq, plan, req, output, answer, conversations=conversations)
        live.commit(session.id, plan, req, output, answer, rec.id)
        conversations.commit(
            session.id, rec.id, plan.parent_turn_id, rec.messages_inherited, req, answer
        )
        records.append(rec)
    failed_req = request(SYSTEM, USER, A1, T1, A2, Message(role="user", content="Oops"))
    records.append(
        record(
            session.id,
            3,
            live.plan(session.id, failed_req),
            failed_req,
            (),
            A2,
            TurnStatus.FAILED,
            conversations,
        )
    )
    await store.write_turns(records)

    stored = await store.list_turns(session.id)
    # Continuations store only what they add: the third turn and the failed one inherit.
    assert [r.messages_inherited for r in stored] == [None, None, 3, 5]
    assert [
        (r.parent_turn_id, r.classification, r.fork_reason, r.reused_prefix_len) for r in stored
    ] == [(r.parent_turn_id, r.classification, r.fork_reason, r.reused_prefix_len) for r in records]
    rebuilt = LedgerBook(tokenizer)
    assert not rebuilt.has(session.id)
    rebuilt.load(session.id, stored, recorded_requests(session.id, stored))
    assert rebuilt.has(session.id)

    follow = request(SYSTEM, USER, A1, T1, A2, Message(role="user", content="Continue."))
    expected = live.plan(session.id, follow)
    got = rebuilt.plan(session.id, follow)
    assert got.classification == expected.classification == "realign"
    assert got.prompt_ids == expected.prompt_ids
    assert got.parent_turn_id == expected.parent_turn_id == records[2].id
    assert got.prompt_ids[: len(records[2].prompt_ids) + len(records[2].output_ids)] == (
        tuple(records[2].prompt_ids) + records[2].output_ids
    )
    retry = request(SUB, Message(role="user", content="Search."), tools=())
    assert rebuilt.plan(session.id, retry).prompt_ids == records[1].prompt_ids


async def test_a_re_labelled_side_request_survives_a_reload(
    store: Store, tokenizer: PreTrainedTokenizerBase
) -> None:
    """The title request came first (a root), the main conversation re-labelled it."""
    run = await store.create_run(f"run-{uuid.uuid4().hex[:8]}")
    session = await store.create_session(
        SessionSpec(run_id=run.id, task_id="t", group_id="g", sample_index=0, harness="h")
    )
    title = request(Message(role="system", content="You are a title generator."), USER, tools=())
    live = LedgerBook(tokenizer)
    records = []
    for seq, (req, answer) in enumerate([(title, A2), (request(SYSTEM, USER), A1)]):
        plan = live.plan(session.id, req)
        output = sampled(tokenizer, answer)
        rec = record(session.id, seq, plan, req, output, answer)
        committed = live.commit(session.id, plan, req, output, answer, rec.id)
        records.append(replace(rec, side_requests=committed.side_requests))
    assert records[1].side_requests == (records[0].id,)
    for rec in records:  # one write each, as the turn writer would
        await store.write_turns([rec])

    stored = await store.list_turns(session.id)
    assert [(r.classification, r.fork_reason) for r in stored] == [
        ("fork", "side_request"),
        ("root", None),
    ]
    rebuilt = LedgerBook(tokenizer)
    rebuilt.load(session.id, stored, recorded_requests(session.id, stored))
    for book in (live, rebuilt):
        retried = book.plan(session.id, title)
        assert (retried.classification, retried.fork_reason) == ("fork", "side_request")
        follow = book.plan(session.id, request(SYSTEM, USER, A1, T1))
        assert (follow.classification, follow.parent_turn_id) == ("extend", records[1].id)
    assert rebuilt.plan(session.id, request(SYSTEM, USER, A1, T1)).prompt_ids == (
        live.plan(session.id, request(SYSTEM, USER, A1, T1)).prompt_ids
    )
