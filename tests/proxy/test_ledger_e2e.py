"""History alignment through the whole stack: harness habits, forks, and a proxy restart.

Each test drives the real proxy with the official openai SDK and checks, on the engine
wire (the tap), that continuations start with the previous turn's exact prompt + sampled
ids, and in the recorded trajectory, that every departure is classified.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from kernel.threaded import free_port, serve
from proxy.app import create_app
from proxy.settings import Settings
from tests.proxy.conftest import ADMIN_KEY, SHELL_TOOL, Proxy
from tests.support.tap import BackendTap


def chat(base_url: str, messages: list[Any], **kwargs: Any) -> Any:
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    return client.chat.completions.create(model="m", messages=messages, **kwargs)


def echo(reply: Any, *, compact: bool) -> dict[str, Any]:
    """The assistant message as a harness sends it back (LiteLLM-style when compact)."""
    message = reply.choices[0].message
    calls = []
    for call in message.tool_calls or []:
        arguments = json.loads(call.function.arguments)
        text = json.dumps(arguments, separators=(",", ":")) if compact else json.dumps(arguments)
        calls.append({"id": call.id, "type": "function",
                      "function": {"name": call.function.name, "arguments": text}})  # fmt: skip
    out: dict[str, Any] = {"role": "assistant", "content": message.content or ""}
    if calls:
        out["tool_calls"] = calls
    return out


def extends(tap: BackendTap, earlier: int, later: int) -> bool:
    a, b = tap.generates[earlier], tap.generates[later]
    prefix = a.body["input_ids"] + a.final["output_ids"]
    return bool(b.body["input_ids"][: len(prefix)] == prefix)


def test_side_request_and_subagent_fork_without_ending_the_main_branch(
    proxy: Proxy, tap: BackendTap
) -> None:
    session = proxy.new_session()
    base = session["openai_base_url"]
    tap.reset()
    main: list[Any] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "CALL_TOOL to make the file"},
    ]
    first = chat(base, main, tools=[SHELL_TOOL])
    # A title request through the same key (OpenCode does this), then a sub-agent.
    chat(base, [{"role": "user", "content": "Write a 3-word title for: make the file"}])
    chat(
        base,
        [
            {"role": "system", "content": "You are a sub-agent that searches code."},
            {"role": "user", "content": "find the config loader"},
        ],
        tools=[SHELL_TOOL],
    )
    main.append(echo(first, compact=True))
    main.append({"role": "tool", "tool_call_id": first.choices[0].message.tool_calls[0].id,
                 "content": "ok"})  # fmt: skip
    chat(base, main, tools=[SHELL_TOOL])
    assert extends(tap, 0, 3)

    trajectory = proxy.trajectory(session["id"])
    kinds = [(t["classification"], t["fork_reason"]) for t in trajectory["turns"]]
    assert kinds == [
        ("root", None),
        ("fork", "side_request"),
        ("fork", "subagent"),
        ("extend", None),
    ]
    turns = trajectory["turns"]
    assert turns[3]["parent_turn_id"] == turns[0]["id"]
    main_segment, *others = trajectory["segments"]
    assert main_segment["turn_ids"] == [turns[0]["id"], turns[3]["id"]]
    assert sorted(s["turn_ids"][0] for s in others) == sorted([turns[1]["id"], turns[2]["id"]])
    events = trajectory["events"]
    assert [(e["turn_id"], e["classification"], e["fork_reason"]) for e in events] == [
        (turns[1]["id"], "fork", "side_request"),
        (turns[2]["id"], "fork", "subagent"),
    ]
    metrics = httpx.get(f"{proxy.url}/metrics").text
    assert 'lego_ledger_turns_total{classification="fork",reason="side_request"}' in metrics


def test_a_title_request_before_the_main_conversation_is_re_labelled(
    proxy: Proxy, tap: BackendTap
) -> None:
    """OpenCode without --title: the title request is the session's first request."""
    session = proxy.new_session()
    base = session["openai_base_url"]
    task = {"role": "user", "content": "CALL_TOOL to make the file"}
    chat(base, [{"role": "system", "content": "You are a title generator."}, task])
    main: list[Any] = [{"role": "system", "content": "You are a coding agent."}, task]
    first = chat(base, main, tools=[SHELL_TOOL])
    main.append(echo(first, compact=True))
    main.append({"role": "tool", "tool_call_id": first.choices[0].message.tool_calls[0].id,
                 "content": "ok"})  # fmt: skip
    chat(base, main, tools=[SHELL_TOOL])

    trajectory = proxy.trajectory(session["id"])
    turns = trajectory["turns"]
    assert [(t["classification"], t["fork_reason"]) for t in turns] == [
        ("fork", "side_request"),
        ("root", None),
        ("extend", None),
    ]
    title, root, extend = (t["id"] for t in turns)
    main_segment, side = trajectory["segments"]
    assert (main_segment["turn_ids"], side["turn_ids"]) == ([root, extend], [title])
    assert [(e["turn_id"], e["fork_reason"], e["relabelled_by"]) for e in trajectory["events"]] == [
        (title, "side_request", root)
    ]
    relabel = 'lego_ledger_relabels_total{classification="fork",reason="side_request",was="root"}'
    assert relabel in httpx.get(f"{proxy.url}/metrics").text


def test_compaction_is_a_classified_fork(proxy: Proxy, tap: BackendTap) -> None:
    session = proxy.new_session()
    base = session["openai_base_url"]
    system = {"role": "system", "content": "You are a coding agent."}
    history: list[Any] = [system, {"role": "user", "content": "CALL_TOOL first"}]
    for _ in range(2):
        reply = chat(base, history, tools=[SHELL_TOOL])
        history.append(echo(reply, compact=False))
        call_id = (reply.choices[0].message.tool_calls or [None])[0]
        if call_id is not None:
            history.append({"role": "tool", "tool_call_id": call_id.id, "content": "done"})
        else:
            history.append({"role": "user", "content": "CALL_TOOL again"})
    compacted = [
        system,
        {"role": "user", "content": "Summary of the work so far: the file was created."},
    ]
    chat(base, compacted, tools=[SHELL_TOOL])
    turns = proxy.trajectory(session["id"])["turns"]
    assert [t["classification"] for t in turns[:2]] == ["root", "extend"]
    assert (turns[2]["classification"], turns[2]["fork_reason"]) == ("fork", "compaction")


@pytest.mark.parametrize(
    "database", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_a_restarted_proxy_continues_token_exactly(
    database: str,
    request: pytest.FixtureRequest,
    tap: BackendTap,
    model_dir: Path,
    tmp_path: Path,
) -> None:
    """Invariant 3 across a restart: the second process rebuilds the ledger from the DB."""
    database_url = None
    if database == "postgres":
        server = request.getfixturevalue("postgres_server")
        database_url = asyncio.run(server.create_database())

    def settings() -> Settings:
        return Settings(
            port=free_port(), data_dir=tmp_path, database_url=database_url,
            backend_url=tap.url, tokenizer_path=model_dir, admin_key=ADMIN_KEY,
        )  # fmt: skip

    tap.reset()
    first_settings = settings()
    with serve(create_app(first_settings), port=first_settings.port) as url:
        admin = httpx.Client(base_url=url, headers={"authorization": f"Bearer {ADMIN_KEY}"})
        run = admin.post("/api/v1/runs", json={"name": f"restart-{database}"}).json()
        session = admin.post(
            f"/api/v1/runs/{run['id']}/sessions", json={"task_id": "t", "group_id": "g"}
        ).json()
        history: list[Any] = [{"role": "user", "content": "CALL_TOOL then stop"}]
        first = chat(f"{url}/s/{session['key']}/v1", history, tools=[SHELL_TOOL])
    history.append(echo(first, compact=True))
    history.append({"role": "tool", "tool_call_id": first.choices[0].message.tool_calls[0].id,
                    "content": "done"})  # fmt: skip

    second_settings = settings()
    with serve(create_app(second_settings), port=second_settings.port) as url:
        chat(f"{url}/s/{session['key']}/v1", history, tools=[SHELL_TOOL])
        admin = httpx.Client(base_url=url, headers={"authorization": f"Bearer {ADMIN_KEY}"})
        trajectory = admin.get(f"/api/v1/sessions/{session['id']}/trajectory").json()
    assert extends(tap, 0, 1)
    assert [t["classification"] for t in trajectory["turns"]] == ["root", "extend"]
    assert len(trajectory["segments"]) == 1


def test_sessions_beyond_the_memory_bound_reload_and_still_extend(
    tap: BackendTap, model_dir: Path, tmp_path: Path
) -> None:
    """With room for one session in memory, two interleaved sessions each lose their ledger
    to the other before every turn: it is rebuilt from the database, token-exactly."""
    settings = Settings(
        port=free_port(), data_dir=tmp_path, backend_url=tap.url, tokenizer_path=model_dir,
        admin_key=ADMIN_KEY, max_sessions_held=1,
    )  # fmt: skip
    tap.reset()
    with (
        serve(create_app(settings), port=settings.port) as url,
        httpx.Client(base_url=url, headers={"authorization": f"Bearer {ADMIN_KEY}"}) as admin,
    ):
        run = admin.post("/api/v1/runs", json={"name": "bounded"}).json()
        sessions = [
            admin.post(
                f"/api/v1/runs/{run['id']}/sessions", json={"task_id": "t", "group_id": "g"}
            ).json()
            for _ in range(2)
        ]
        histories: list[list[Any]] = [
            [{"role": "user", "content": "CALL_TOOL then stop"}] for _ in sessions
        ]
        for session, history in zip(sessions, histories, strict=True):
            reply = chat(f"{url}/s/{session['key']}/v1", history, tools=[SHELL_TOOL])
            history.append(echo(reply, compact=True))
            call_id = reply.choices[0].message.tool_calls[0].id
            history.append({"role": "tool", "tool_call_id": call_id, "content": "ok"})
        for session, history in zip(sessions, histories, strict=True):
            chat(f"{url}/s/{session['key']}/v1", history, tools=[SHELL_TOOL])
        trajectories = [
            admin.get(f"/api/v1/sessions/{s['id']}/trajectory").json() for s in sessions
        ]
        metrics = admin.get("/metrics").text
    # Engine calls in order: A1, B1, A2, B2.
    assert extends(tap, 0, 2)
    assert extends(tap, 1, 3)
    for trajectory in trajectories:
        assert [t["classification"] for t in trajectory["turns"]] == ["root", "extend"]
        assert len(trajectory["segments"]) == 1
    reloads = [
        line for line in metrics.splitlines()
        if line.startswith("lego_ledger_reloads_total") and 'outcome="reloaded"' in line
    ]  # fmt: skip
    assert reloads
    assert float(reloads[0].split()[-1]) >= 2


def test_a_dropped_session_s_side_request_is_classified_after_a_reload(
    tap: BackendTap, model_dir: Path, tmp_path: Path
) -> None:
    """A request that looks like a first turn (no answer in it) of a session the proxy let
    go is checked against the database, so it is classified as the session's turn."""
    settings = Settings(
        port=free_port(), data_dir=tmp_path, backend_url=tap.url, tokenizer_path=model_dir,
        admin_key=ADMIN_KEY, max_sessions_held=1,
    )  # fmt: skip
    with (
        serve(create_app(settings), port=settings.port) as url,
        httpx.Client(base_url=url, headers={"authorization": f"Bearer {ADMIN_KEY}"}) as admin,
    ):
        run = admin.post("/api/v1/runs", json={"name": "dropped"}).json()
        main, other = (
            admin.post(
                f"/api/v1/runs/{run['id']}/sessions", json={"task_id": "t", "group_id": "g"}
            ).json()
            for _ in range(2)
        )
        task = [{"role": "user", "content": "CALL_TOOL then stop"}]
        chat(f"{url}/s/{main['key']}/v1", task, tools=[SHELL_TOOL])
        chat(f"{url}/s/{other['key']}/v1", task, tools=[SHELL_TOOL])  # main is dropped
        title = [
            {"role": "system", "content": "Write a title for this conversation."},
            {"role": "user", "content": "CALL_TOOL then stop"},
        ]
        chat(f"{url}/s/{main['key']}/v1", title)
        trajectory = admin.get(f"/api/v1/sessions/{main['id']}/trajectory").json()
    kinds = [(t["classification"], t["fork_reason"]) for t in trajectory["turns"]]
    assert kinds == [("root", None), ("fork", "side_request")]
