"""Linear request storage, recorder side: the two stored forms and the rebuild through parents."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import orjson
import pytest

from kernel.errors import RecorderError
from recorder.answers import Answer
from recorder.conversations import StoredRequest, rebuild
from recorder.records import SessionSpec, TurnRecord, TurnStatus
from recorder.store import Store
from tests.recorder.builders import make_turn

SYSTEM = {"role": "system", "content": "You are a coding agent."}
USER = {"role": "user", "content": "Fix the bug."}
CALL = {"id": "call_1", "name": "bash", "arguments": '{"command":"ls"}'}
ANSWER = {"reasoning": "Look first.", "content": "", "tool_calls": [CALL]}
RESULT = {"role": "tool", "content": "main.py", "tool_call_id": "call_1"}
TOOLS = [{"name": "bash", "description": "Run a shell command.", "parameters": {}}]


def whole(*messages: dict[str, Any], **fields: Any) -> bytes:
    return orjson.dumps({"adapter": "openai_chat", "messages": list(messages), **fields})


def row(
    turn_id: str,
    request: bytes,
    *,
    parent: str | None = None,
    inherited: int | None = None,
    answer: dict[str, Any] = ANSWER,
) -> StoredRequest:
    return StoredRequest(turn_id, parent, inherited, request, orjson.dumps(answer))


def loads(data: bytes) -> Any:
    return orjson.loads(data)


def test_a_child_inherits_its_parents_messages_its_answer_and_its_fields() -> None:
    rows = [
        row("root", whole(SYSTEM, USER, tools=TOOLS, stream=True)),
        # The harness echoed the answer exactly: four messages inherited, one added.
        row("child", orjson.dumps({"messages": [RESULT]}), parent="root", inherited=3),
        # A grandchild that inherits only the system prompt and changes one field.
        row(
            "fork",
            orjson.dumps({"messages": [{"role": "user", "content": "Summary."}], "stream": False}),
            parent="child",
            inherited=1,
        ),
    ]
    got = rebuild("s", rows)
    echoed = loads(Answer.decode(orjson.dumps(ANSWER)).as_message())
    assert echoed == {
        "role": "assistant",
        "content": "",
        "reasoning": "Look first.",
        "tool_calls": [CALL],
        "tool_call_id": None,
        "name": None,
    }
    assert loads(got["child"].request_json()) == {
        "adapter": "openai_chat",
        "messages": [SYSTEM, USER, echoed, RESULT],
        "tools": TOOLS,
        "stream": True,
    }
    assert loads(got["fork"].request_json()) == {
        "adapter": "openai_chat",
        "messages": [SYSTEM, {"role": "user", "content": "Summary."}],
        "tools": TOOLS,
        "stream": False,
    }
    # Rebuilt tuples share the parent's message objects instead of copying them.
    assert got["child"].messages[0] is got["root"].messages[0]
    assert got["child"].fields is got["root"].fields


def test_rebuild_resolves_only_what_is_wanted_in_any_row_order() -> None:
    rows = [
        row("c", orjson.dumps({"messages": [RESULT]}), parent="b", inherited=5),
        row("b", orjson.dumps({"messages": [RESULT]}), parent="a", inherited=3),
        row("a", whole(SYSTEM, USER)),
        row("unrelated", b"not json"),  # never read: nobody wants it
    ]
    got = rebuild("s", rows, ["c", "missing"])
    assert list(got) == ["c"]
    assert len(got["c"].messages) == 6


def test_broken_chains_are_errors() -> None:
    orphan = row("x", orjson.dumps({"messages": []}), parent="gone", inherited=1)
    with pytest.raises(RecorderError, match="not recorded"):
        rebuild("s", [orphan])
    too_far = row("y", orjson.dumps({"messages": []}), parent="a", inherited=4)
    with pytest.raises(RecorderError, match="inherits 4 messages of a conversation that has 3"):
        rebuild("s", [row("a", whole(SYSTEM, USER)), too_far])
    cycle = [
        row("p", orjson.dumps({"messages": []}), parent="q", inherited=1),
        row("q", orjson.dumps({"messages": []}), parent="p", inherited=1),
    ]
    with pytest.raises(RecorderError, match="not recorded"):
        rebuild("s", cycle)
    with pytest.raises(RecorderError, match="not a JSON object"):
        rebuild("s", [row("z", b"[1, 2]")])


def test_an_empty_request_from_an_old_record_rebuilds_as_empty() -> None:
    (got,) = rebuild("s", [row("old", b"")]).values()
    assert got.messages == ()
    assert loads(got.request_json()) == {"messages": []}


def turn(
    session_id: str,
    seq: int,
    request: bytes,
    *,
    parent: TurnRecord | None = None,
    inherited: int | None = None,
    status: TurnStatus = TurnStatus.COMPLETED,
) -> TurnRecord:
    return dataclasses.replace(
        make_turn(session_id, seq, status=status),
        request_messages=request,
        messages_inherited=inherited,
        response_message=orjson.dumps(ANSWER),
        parent_turn_id=parent.id if parent is not None else None,
    )


async def test_the_store_rebuilds_a_sessions_requests_in_one_query(store: Store) -> None:
    run = await store.create_run(f"run-{uuid.uuid4().hex[:8]}")
    spec = SessionSpec(run_id=run.id, task_id="t", group_id="g", sample_index=0, harness="h")
    session = (await store.create_session(spec)).id
    root = turn(session, 0, whole(SYSTEM, USER))
    child = turn(session, 1, orjson.dumps({"messages": [RESULT]}), parent=root, inherited=3)
    failed = turn(
        session,
        2,
        orjson.dumps({"messages": [RESULT, USER]}),
        parent=root,
        inherited=3,
        status=TurnStatus.FAILED,
    )
    await store.write_turns([failed, child, root])

    stored = await store.list_turns(session)
    assert [(t.messages_inherited, t.request_messages) for t in stored] == [
        (t.messages_inherited, t.request_messages) for t in (root, child, failed)
    ]
    everything = await store.conversations(session)
    assert set(everything) == {root.id, child.id, failed.id}
    assert loads(everything[failed.id].request_json())["messages"][-2:] == [RESULT, USER]
    completed = await store.conversations(session, [failed.id, child.id], completed_only=True)
    assert list(completed) == [child.id]
    assert loads(completed[child.id].request_json())["messages"] == [
        SYSTEM,
        USER,
        loads(Answer.decode(orjson.dumps(ANSWER)).as_message()),
        RESULT,
    ]
    assert await store.conversations("other-session") == {}
