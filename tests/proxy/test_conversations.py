"""Linear request storage end to end: what the pipeline encodes per turn, what the recorder
stores, and the whole requests every reader rebuilds from it (SQLite and Postgres)."""

from __future__ import annotations

import dataclasses
import uuid

import orjson
from sqlalchemy import func, select

from proxy.canonical import ChatRequest, Message, SamplingRequest, ToolCall, ToolSpec
from proxy.conversations import ConversationBook, recorded_requests
from proxy.ledger.codec import RequestDecoder, answer_of
from recorder.records import SessionSpec, TurnRecord, TurnStatus
from recorder.schema import turns
from recorder.store import Store
from tests.recorder.builders import make_turn

BASH = ToolSpec("bash", "Run a shell command.", {"type": "object", "properties": {}})
READ = ToolSpec("read", "Read a file.", {"type": "object", "properties": {}})
SYSTEM = Message(role="system", content="You are a coding agent. " * 40)
SUB_SYSTEM = Message(role="system", content="You are a search sub-agent.")
USER = Message(role="user", content="Fix the failing test.")


def request(*messages: Message, **fields: object) -> ChatRequest:
    base = ChatRequest(adapter="openai_chat", model="some-model", messages=(), tools=(BASH,))
    return dataclasses.replace(base, messages=messages, **fields)  # type: ignore[arg-type]


def answer(step: int) -> Message:
    call = ToolCall(f"call_{step}", "bash", f'{{"command": "ls dir{step}"}}')
    return Message(role="assistant", content="", reasoning=f"Step {step}.", tool_calls=(call,))


def result(step: int, size: int = 200) -> Message:
    return Message(role="tool", content=f"[{step}]" + "x" * size, tool_call_id=f"call_{step}")


class Harness:
    """The pipeline's recording half: encode with the book, record, commit when done."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.book = ConversationBook()
        self.records: list[TurnRecord] = []
        self.requests: dict[str, ChatRequest] = {}

    def turn(
        self,
        req: ChatRequest,
        reply: Message,
        parent: TurnRecord | None = None,
        status: TurnStatus = TurnStatus.COMPLETED,
    ) -> TurnRecord:
        parent_id = parent.id if parent is not None else None
        encoded = self.book.encode(self.session_id, parent_id, req)
        record = dataclasses.replace(
            make_turn(self.session_id, len(self.records), status=status),
            request_messages=encoded.data,
            messages_inherited=encoded.inherited,
            response_message=answer_of(reply).encode(),  # as the pipeline records it
            parent_turn_id=parent_id,
        )
        if status is TurnStatus.COMPLETED:
            self.book.commit(self.session_id, record.id, parent_id, encoded.inherited, req, reply)
        self.records.append(record)
        self.requests[record.id] = req
        return record


async def new_session(store: Store) -> str:
    run = await store.create_run(f"run-{uuid.uuid4().hex[:8]}")
    spec = SessionSpec(run_id=run.id, task_id="t", group_id="g", sample_index=0, harness="h")
    return (await store.create_session(spec)).id


async def stored_request_bytes(store: Store, session_id: str) -> list[int]:
    async with store.engine.connect() as conn:
        result = await conn.execute(
            select(func.length(turns.c.request_messages))
            .where(turns.c.session_id == session_id)
            .order_by(turns.c.seq)
        )
        return [int(n) for n in result.scalars()]


async def test_every_kind_of_turn_rebuilds_exactly(store: Store) -> None:
    session = await new_session(store)
    h = Harness(session)
    a0, a1, a2, a3 = (answer(i) for i in range(4))
    root = h.turn(request(SYSTEM, USER), a0)
    # The harness echoes the answer exactly: it is inherited too.
    extend = h.turn(request(SYSTEM, USER, a0, result(0)), a1, root)
    # The harness re-serializes the answer (drops reasoning, reformats the arguments).
    resent = dataclasses.replace(
        a1, reasoning=None, tool_calls=(ToolCall("call_1", "bash", '{"command":"ls dir1"}'),)
    )
    reserialized = h.turn(request(SYSTEM, USER, a0, result(0), resent, result(1)), a2, extend)
    # New tools and sampling: the changed fields are stored, the others inherited.
    wider = request(
        SYSTEM,
        USER,
        a0,
        result(0),
        resent,
        result(1),
        a2,
        result(2),
        tools=(BASH, READ),
        sampling=SamplingRequest(temperature=0.3, stop=("</s>",)),
    )
    context_changed = h.turn(wider, a3, reserialized)
    # Edited history: it diverges inside the parent's conversation.
    edited = h.turn(
        request(SYSTEM, USER, a0, Message(role="tool", content="(edited)"), a1, result(1)),
        a2,
        reserialized,
    )
    # Compaction: only the system prompt is shared with the parent's conversation.
    summary = Message(role="user", content="Summary of the work so far: ...")
    compaction = h.turn(request(SYSTEM, summary), a0, context_changed)
    # A sub-agent shares nothing: its whole request is stored.
    subagent = h.turn(request(SUB_SYSTEM, USER, tools=()), a1, root)
    # A retry of an answered request, and a turn that failed.
    retry = h.turn(wider, a3, reserialized)
    failed = h.turn(dataclasses.replace(wider, stream=True), a3, reserialized, TurnStatus.FAILED)
    # Responses fields (instructions, store, previous_response_id) round-trip too.
    responses = h.turn(
        dataclasses.replace(
            wider,
            adapter="openai_responses",
            messages=(*wider.messages, a3, result(3)),
            instructions=SYSTEM.content,
            previous_response_id=f"resp_{retry.id}",
            store=True,
        ),
        a0,
        retry,
    )
    await store.write_turns(h.records[::-1])  # order does not matter

    assert [r.messages_inherited for r in h.records] == [None, 3, 4, 7, 3, 1, None, 7, 7, 9]
    assert [r.id for r in h.records] == [
        root.id,
        extend.id,
        reserialized.id,
        context_changed.id,
        edited.id,
        compaction.id,
        subagent.id,
        retry.id,
        failed.id,
        responses.id,
    ]
    stored = await store.list_turns(session)
    decoder = RequestDecoder()
    for rebuilt in (await store.conversations(session)).values():
        original = h.requests[rebuilt.turn_id]
        assert decoder.decode(rebuilt) == original
        assert orjson.loads(rebuilt.request_json()) == orjson.loads(orjson.dumps(original))
    completed = {r.id: h.requests[r.id] for r in h.records if r.status is TurnStatus.COMPLETED}
    assert recorded_requests(session, stored) == completed
    fresh = ConversationBook()
    fresh.load(session, stored, completed)
    for turn_id, original in completed.items():
        assert h.book.get(session, turn_id) == fresh.get(session, turn_id)
        held = fresh.get(session, turn_id)
        assert held is not None
        assert held[0] == original
    # After a reload the book encodes a continuation exactly as before.
    follow = dataclasses.replace(wider, messages=(*wider.messages, a3, result(3)))
    assert fresh.encode(session, retry.id, follow) == h.book.encode(session, retry.id, follow)


async def test_a_long_session_stores_request_bytes_linear_in_its_new_messages(
    store: Store,
) -> None:
    session = await new_session(store)
    h = Harness(session)
    messages: tuple[Message, ...] = (SYSTEM, USER)
    parent: TurnRecord | None = None
    added: list[bytes] = []  # JSON of the messages each turn adds
    for step in range(50):
        reply = answer(step)
        parent = h.turn(request(*messages), reply, parent)
        new = result(step, size=100 + 37 * (step % 11))
        added.append(orjson.dumps(new))
        messages = (*messages, reply, new)
    await store.write_turns(h.records)

    sizes = await stored_request_bytes(store, session)
    whole = [len(orjson.dumps(h.requests[r.id])) for r in h.records]
    # The root is whole; every later turn is {"messages":[<the tool result it added>]}.
    assert sizes[0] == whole[0]
    assert sizes[1:] == [len(b'{"messages":[]}') + len(m) for m in added[:-1]]
    assert sum(sizes) < sum(whole) / 10  # whole requests grow with turns x conversation
    decoder = RequestDecoder()
    rebuilt = await store.conversations(session, [h.records[-1].id])
    assert decoder.decode(rebuilt[h.records[-1].id]) == h.requests[h.records[-1].id]


def test_encoding_serializes_only_what_the_turn_adds() -> None:
    book = ConversationBook()
    messages: tuple[Message, ...] = (SYSTEM, USER)
    parent: str | None = None
    sizes = []
    for step in range(200):
        req = request(*messages)
        encoded = book.encode("s", parent, req)
        sizes.append(len(encoded.data))
        turn_id = f"t{step}"
        book.commit("s", turn_id, parent, encoded.inherited, req, answer(step))
        parent = turn_id
        messages = (*messages, answer(step), result(step))
    # Constant per turn although the conversation grows to 400 messages.
    assert max(sizes[1:]) - min(sizes[1:]) <= 4  # the step number's digits
    assert max(sizes[1:]) < 400  # one tool result of ~200 characters
    assert book.get("s", "t199") is not None
    assert book.encode("s", "unknown", request(SYSTEM)).inherited is None
