"""Replicas are interchangeable: several proxies on one Postgres serve one session's turns.

Three proxy apps (each its own uvicorn server, ledger cache, session cache, spool and
writer, sharing nothing but the database and the engine) serve a multi-turn tool loop
whose turns rotate over the replicas, one replica restarted mid-session. Every turn after
the first must be an exact continuation (``extend``) and the exported trajectory must equal
that of the same loop served by a single replica. ``/readyz`` is checked here too, since it
is what a load balancer uses to route around a replica.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from engine.config import EngineConfig
from engine.loopback import running_engine
from kernel.threaded import free_port, serve
from proxy.app import create_app
from proxy.settings import Settings
from recorder.conversations import Conversation
from recorder.records import TurnRecord
from recorder.scratch_postgres import PostgresServer
from recorder.store import Store

pytestmark = pytest.mark.postgres

ADMIN_KEY = "replica-admin-key"
STEPS = 5  # tool calls before the final answer

SHELL_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}


def _call(step: int) -> str:
    call = json.dumps({"name": "bash", "arguments": {"command": f"step {step}"}})
    return f"<think>\nStep {step}.\n</think>\n\n<tool_call>\n{call}\n</tool_call>"


# The tail of each prompt (what follows the last assistant turn) holds the latest tool
# result, so each result picks the next call; the last one gets the final answer.
LOOP_SCRIPT: dict[str, Any] = {
    "rules": [{"match": f"RESULT_{STEPS}", "reply": "<think>\nDone.\n</think>\n\nAll done."}]
    + [{"match": f"RESULT_{n}", "reply": _call(n + 1)} for n in range(STEPS - 1, 0, -1)]
    + [{"match": "BEGIN_LOOP", "reply": _call(1)}],
    "default": "I do not know what to do.",
}


@pytest.fixture(scope="module")
def loop_engine_url(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    script = tmp_path_factory.mktemp("loop") / "policy.json"
    script.write_text(json.dumps(LOOP_SCRIPT))
    with running_engine(
        EngineConfig(model_path=model_dir, script_path=script, enable_return_routed_experts=True)
    ) as url:
        yield url


@pytest.fixture(scope="module")
async def shared_database(postgres_server: PostgresServer) -> AsyncIterator[str]:
    url = await postgres_server.create_database("lego_replicas")
    yield url
    await postgres_server.drop_database(url)


class Replicas:
    """Proxy apps on one database, each on its own port; any of them can be restarted."""

    def __init__(self, make: Callable[[int, int], Settings], count: int) -> None:
        self._make = make
        self.ports = [free_port() for _ in range(count)]
        self._running: dict[int, ExitStack] = {}

    def url(self, index: int) -> str:
        return f"http://127.0.0.1:{self.ports[index]}"

    def start(self, index: int) -> None:
        inner = ExitStack()
        settings = self._make(index, self.ports[index])
        inner.enter_context(serve(create_app(settings), port=self.ports[index]))
        self._running[index] = inner

    def restart(self, index: int) -> None:
        self._running.pop(index).close()
        self.start(index)

    def close(self) -> None:
        for inner in self._running.values():
            inner.close()
        self._running.clear()


@contextmanager
def replicas(
    count: int,
    *,
    database_url: str,
    backend_url: str,
    model_dir: Path,
    root: Path,
    **overrides: Any,
) -> Iterator[Replicas]:
    def make(index: int, port: int) -> Settings:
        return Settings(
            **overrides,
            port=port,
            data_dir=root / f"replica-{index}",  # a spool of its own, as on separate hosts
            database_url=database_url,
            backend_url=backend_url,
            tokenizer_path=model_dir,
            admin_key=ADMIN_KEY,
            context_length=8192,
        )

    group = Replicas(make, count)
    try:
        for index in range(count):
            group.start(index)
        yield group
    finally:
        group.close()


def admin(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=60)


def new_session(url: str) -> tuple[str, str]:
    with admin(url) as client:
        run = client.post("/api/v1/runs", json={"name": f"replicas-{uuid.uuid4().hex[:8]}"})
        run_id = run.raise_for_status().json()["id"]
        body = {"task_id": "loop", "group_id": "g", "sample_index": 0, "harness": "pytest"}
        session = client.post(f"/api/v1/runs/{run_id}/sessions", json=body)
        data = session.raise_for_status().json()
        return str(data["id"]), str(data["key"])


def tool_loop(key: str, turn_url: Any, between: Any = None) -> None:
    """The harness side: send the conversation, run each tool call, send the result."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "BEGIN_LOOP: run the steps."},
    ]
    for turn in range(STEPS + 1):
        if between is not None:
            between(turn)
        url = turn_url(turn)
        body = {"model": "any", "messages": messages, "tools": [SHELL_TOOL], "stream": True}
        reply = _stream_chat(f"{url}/s/{key}/v1/chat/completions", body)
        messages.append(reply)
        calls = reply.get("tool_calls") or []
        if turn < STEPS:
            assert len(calls) == 1, reply
            messages.append(
                {"role": "tool", "tool_call_id": calls[0]["id"], "content": f"RESULT_{turn + 1}"}
            )
        else:
            assert not calls, reply
            assert "All done." in reply["content"], reply


def _stream_chat(url: str, body: dict[str, Any]) -> dict[str, Any]:
    """Read a streamed chat completion back into the assistant message a harness keeps."""
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    with httpx.stream("POST", url, json=body, timeout=120) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            assert "error" not in chunk, chunk
            for choice in chunk.get("choices", []):
                delta = choice.get("delta", {})
                content.append(delta.get("content") or "")
                for call in delta.get("tool_calls") or []:
                    slot = calls.setdefault(
                        call["index"], {"type": "function", "function": {"arguments": ""}}
                    )
                    if call.get("id"):
                        slot["id"] = call["id"]
                    function = call.get("function") or {}
                    if function.get("name"):
                        slot["function"]["name"] = function["name"]
                    slot["function"]["arguments"] += function.get("arguments") or ""
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content)}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


def trajectory(url: str, session_id: str) -> dict[str, Any]:
    with admin(url) as client:
        response = client.get(f"/api/v1/sessions/{session_id}/trajectory")
        return dict(response.raise_for_status().json())


def comparable(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Segments without the per-run turn ids: what a trainer trains on."""
    return [{k: v for k, v in seg.items() if k != "turn_ids"} for seg in data["segments"]]


def test_turns_rotating_over_replicas_stay_token_exact(
    shared_database: str, loop_engine_url: str, model_dir: Path, tmp_path: Path
) -> None:
    with replicas(
        1,
        database_url=shared_database,
        backend_url=loop_engine_url,
        model_dir=model_dir,
        root=tmp_path / "single",
    ) as single:
        alone_id, alone_key = new_session(single.url(0))
        tool_loop(alone_key, lambda turn: single.url(0))
        alone = trajectory(single.url(0), alone_id)

    with replicas(
        3,
        database_url=shared_database,
        backend_url=loop_engine_url,
        model_dir=model_dir,
        root=tmp_path / "three",
    ) as group:
        session_id, key = new_session(group.url(0))

        def between(turn: int) -> None:
            if turn == 3:
                group.restart(0)  # it served turn 0: its caches and writer start over

        tool_loop(key, lambda turn: group.url(turn % 3), between)
        # Each replica writes its own turns off the hot path: across replicas the export
        # is eventually complete (within a write-queue flush), not read-your-writes.
        deadline = time.monotonic() + 10
        rotated = trajectory(group.url(1), session_id)
        while len(rotated["turns"]) < STEPS + 1 and time.monotonic() < deadline:
            time.sleep(0.1)
            rotated = trajectory(group.url(1), session_id)

    turns = rotated["turns"]
    assert len(turns) == STEPS + 1
    assert all(t["status"] == "completed" for t in turns)
    assert [t["classification"] for t in turns] == ["root"] + ["extend"] * STEPS
    seqs = [t["seq"] for t in turns]  # arrival times stamped by three different processes
    assert seqs == sorted(seqs)
    assert len(set(seqs)) == len(seqs)
    assert rotated["events"] == []
    assert len(rotated["segments"]) == 1
    assert [t["classification"] for t in alone["turns"]] == ["root"] + ["extend"] * STEPS
    assert comparable(rotated) == comparable(alone)
    # Each replica stored only what its turn added, relative to a turn another one served.
    stored, conversations = asyncio.run(recorded(shared_database, session_id))
    assert [t.messages_inherited for t in stored] == [None] + [2 + 2 * n for n in range(STEPS)]
    last = json.loads(conversations[stored[-1].id].request_json())
    assert [m["role"] for m in last["messages"]] == ["system", "user"] + [
        "assistant",
        "tool",
    ] * STEPS
    assert last["messages"][-1]["content"] == f"RESULT_{STEPS}"


async def recorded(url: str, session_id: str) -> tuple[list[TurnRecord], dict[str, Conversation]]:
    store = await Store.open(url)
    try:
        return await store.list_turns(session_id), await store.conversations(session_id)
    finally:
        await store.close()


def test_previous_response_id_resolves_on_any_replica(
    shared_database: str, loop_engine_url: str, model_dir: Path, tmp_path: Path
) -> None:
    tool: Any = {"type": "function", "name": "bash", **SHELL_TOOL["function"]}
    with replicas(
        3,
        database_url=shared_database,
        backend_url=loop_engine_url,
        model_dir=model_dir,
        root=tmp_path,
    ) as group:
        session_id, key = new_session(group.url(0))

        def client(index: int) -> openai.OpenAI:
            return openai.OpenAI(
                base_url=f"{group.url(index)}/s/{key}/v1", api_key="x", max_retries=0
            )

        response = client(0).responses.create(
            model="m", instructions="Be brief.", input="BEGIN_LOOP: run the steps.", tools=[tool]
        )
        for step in (1, 2):
            # The replica that answered has written the turn (its trajectory flushes it);
            # the next one knows nothing of it but what the database holds.
            trajectory(group.url(step - 1), session_id)
            call = next(item for item in response.output if item.type == "function_call")
            output: Any = {
                "type": "function_call_output",
                "call_id": call.call_id,
                "output": f"RESULT_{step}",
            }
            response = client(step).responses.create(
                model="m",
                instructions="Be brief.",
                previous_response_id=response.id,
                input=[output],
                tools=[tool],
            )
        final = trajectory(group.url(2), session_id)
    assert [t["classification"] for t in final["turns"]] == ["root", "extend", "extend"]
    stored, conversations = asyncio.run(recorded(shared_database, session_id))
    assert [t.messages_inherited for t in stored] == [None, 3, 5]
    last = json.loads(conversations[stored[-1].id].request_json())
    assert [m["role"] for m in last["messages"]] == ["system", "user"] + ["assistant", "tool"] * 2
    assert last["instructions"] == "Be brief."
    assert last["previous_response_id"] == f"resp_{stored[1].id}"


def test_readyz_reports_the_database_and_each_backend(
    shared_database: str, loop_engine_url: str, model_dir: Path, tmp_path: Path
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    keyed = {"authorization": f"Bearer {ADMIN_KEY}"}
    with replicas(
        1,
        database_url=shared_database,
        backend_url=f"{dead},{loop_engine_url}",
        model_dir=model_dir,
        root=tmp_path,
    ) as group:
        ready = httpx.get(f"{group.url(0)}/readyz", headers=keyed, timeout=5)
        assert ready.status_code == 200
        body = ready.json()
        assert body["database"] == {"ok": True, "error": None}
        assert body["backends"] == [
            {"url": dead, "ok": False},
            {"url": loop_engine_url, "ok": True},
        ]
        # Without the admin key: the verdict, never a URL or an error text.
        anonymous = httpx.get(f"{group.url(0)}/readyz", timeout=5)
        assert anonymous.status_code == 200
        assert anonymous.json()["backends"] == {"ok": 1, "total": 2}
        assert "127.0.0.1" not in anonymous.text
        assert httpx.get(f"{group.url(0)}/healthz", timeout=5).status_code == 200

    with replicas(
        1, database_url=shared_database, backend_url=dead, model_dir=model_dir, root=tmp_path
    ) as group:
        not_ready = httpx.get(f"{group.url(0)}/readyz", headers=keyed, timeout=5)
        assert not_ready.status_code == 503
        assert not_ready.json()["backends"] == [{"url": dead, "ok": False}]
        assert not_ready.json()["database"]["ok"] is True


def test_readyz_stays_ready_while_the_database_is_down(
    stoppable_postgres: PostgresServer,
    loop_engine_url: str,
    model_dir: Path,
    tmp_path: Path,
) -> None:
    """Turns are spooled during an outage, so the replica keeps serving: readiness must
    not take it (and every other replica) out of the load balancer (issue 16, item 8)."""
    database_url = asyncio.run(stoppable_postgres.create_database("lego_outage"))
    keyed = {"authorization": f"Bearer {ADMIN_KEY}"}
    with replicas(
        1,
        database_url=database_url,
        backend_url=loop_engine_url,
        model_dir=model_dir,
        root=tmp_path,
    ) as group:
        stoppable_postgres.stop()
        try:
            response = httpx.get(f"{group.url(0)}/readyz", headers=keyed, timeout=5)
            anonymous = httpx.get(f"{group.url(0)}/readyz", timeout=5)
        finally:
            stoppable_postgres.start()
        assert response.status_code == 200
        body = response.json()
        assert body["status"] == "ready"
        assert body["database"]["ok"] is False
        assert body["database"]["error"]
        assert body["recorder"]["durable"] is True
        assert body["backends"] == [{"url": loop_engine_url, "ok": True}]
        assert response.elapsed.total_seconds() < 3
        assert anonymous.json()["database"] == {"ok": False}  # no raw error without a key
        assert httpx.get(f"{group.url(0)}/readyz", timeout=5).status_code == 200


def test_a_pause_sent_to_one_replica_holds_turns_on_every_replica(
    shared_database: str, loop_engine_url: str, model_dir: Path, tmp_path: Path
) -> None:
    with replicas(
        2,
        database_url=shared_database,
        backend_url=loop_engine_url,
        model_dir=model_dir,
        root=tmp_path,
        pause_max_wait_s=0.3,
        pause_sync_s=0.1,
    ) as group:
        with admin(group.url(0)) as client:
            run_id = client.post("/api/v1/runs", json={"name": f"pause-{uuid.uuid4().hex[:8]}"})
            run_id = run_id.raise_for_status().json()["id"]
            body = {"task_id": "t", "group_id": "g"}
            key = client.post(f"/api/v1/runs/{run_id}/sessions", json=body).json()["key"]
            client.post(f"/api/v1/runs/{run_id}/pause").raise_for_status()
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        deadline = time.monotonic() + 5
        while True:  # the other replica learns of the pause within a poll interval
            held = httpx.post(f"{group.url(1)}/s/{key}/v1/chat/completions", json=chat, timeout=30)
            if held.status_code == 429 or time.monotonic() > deadline:
                break
        assert held.status_code == 429
        assert "retry-after" in held.headers
        with admin(group.url(1)) as client:
            client.post(f"/api/v1/runs/{run_id}/resume").raise_for_status()
        time.sleep(0.3)
        for index in (0, 1):
            answered = httpx.post(
                f"{group.url(index)}/s/{key}/v1/chat/completions", json=chat, timeout=60
            )
            assert answered.status_code == 200, answered.text


def test_finish_is_a_barrier_on_every_replica(
    shared_database: str, loop_engine_url: str, model_dir: Path, tmp_path: Path
) -> None:
    """Issue 16, item 6: a turn served by one replica is in the export of a finish and a
    claim sent at once to another, and a finished session takes no turn anywhere."""
    with replicas(
        2,
        database_url=shared_database,
        backend_url=loop_engine_url,
        model_dir=model_dir,
        root=tmp_path,
    ) as group:
        serving, finishing = group.url(1), group.url(0)
        with admin(finishing) as client:
            run = client.post("/api/v1/runs", json={"name": f"barrier-{uuid.uuid4().hex[:8]}"})
            run_id = run.raise_for_status().json()["id"]
            chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
            sessions = []
            for index in range(8):
                body = {"task_id": "t", "group_id": f"g{index}"}
                session = client.post(f"/api/v1/runs/{run_id}/sessions", json=body).json()
                served = httpx.post(
                    f"{serving}/s/{session['key']}/v1/chat/completions", json=chat, timeout=60
                )
                assert served.status_code == 200, served.text
                # At once, on the other replica: the turn is already in the database.
                assert len(trajectory(finishing, session["id"])["turns"]) == 1
                client.post(
                    f"/api/v1/sessions/{session['id']}/finish",
                    json={"termination": "completed", "reward": 1.0},
                ).raise_for_status()
                sessions.append(session)
            claim = client.post(f"/api/v1/runs/{run_id}/claims", json={"groups": 100})
            groups = claim.raise_for_status().json()["groups"]
        assert len(groups) == len(sessions)
        for claimed in groups:
            (sample,) = claimed["samples"]
            (segment,) = sample["segments"]
            assert len(segment["turn_ids"]) == 1
        # The replica that served them learns of the finish on the very next turn.
        late = httpx.post(
            f"{serving}/s/{sessions[0]['key']}/v1/chat/completions", json=chat, timeout=60
        )
        assert late.status_code == 409, late.text
        assert late.json()["error"]["code"] == "conflict"
