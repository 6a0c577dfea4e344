"""Hostile input through the real proxy (issue 16, items 1, 2, 5, 7 and 9), on SQLite and
Postgres: what no upstream API takes is a 400 in the caller's own shape, nothing after it
is blocked, and a prompt group is exported only once it is complete.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

import httpx
import pytest

from recorder.export_wire import decode_claim
from recorder.store import Store
from tests.proxy.conftest import Proxy
from tests.recorder.builders import make_turn

HUGE = 2**64


def new_run(proxy: Proxy) -> str:
    run = proxy.admin.post("/api/v1/runs", json={"name": f"hostile-{time.time_ns()}"})
    return str(run.raise_for_status().json()["id"])


def new_session(proxy: Proxy, run: str, group: str = "g", **extra: Any) -> dict[str, Any]:
    body = {"task_id": "t", "group_id": group, **extra}
    response = proxy.admin.post(f"/api/v1/runs/{run}/sessions", json=body)
    return dict(response.raise_for_status().json())


def chat(proxy: Proxy, key: str, **body: Any) -> httpx.Response:
    payload = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    payload.update(body)
    return httpx.post(
        f"{proxy.url}/s/{key}/v1/chat/completions",
        content=json.dumps(payload),
        headers={"content-type": "application/json"},
        timeout=60,
    )


def post(proxy: Proxy, key: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{proxy.url}/s/{key}/v1/{path}", json=body, timeout=60)


def openai_error(response: httpx.Response, param: str | None = None) -> dict[str, Any]:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param
    return dict(error)


def finish(proxy: Proxy, session_id: str, **body: Any) -> httpx.Response:
    payload = {"termination": "completed", "reward": 1.0, **body}
    return proxy.admin.post(
        f"/api/v1/sessions/{session_id}/finish",
        content=json.dumps(payload),
        headers={"content-type": "application/json"},
    )


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m\x00"}, "model"),
        ({"stop": ["\x00"]}, "stop"),
        ({"stop": "a\x00"}, "stop"),
        ({"unknown\x00field": 1}, None),
        ({"max_tokens": HUGE}, "max_tokens"),
        ({"seed": HUGE}, "seed"),
        ({"metadata": {"n": -HUGE}}, "metadata.n"),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"maximum": HUGE}},
                    }
                ]
            },
            "tools[0].function.parameters.maximum",
        ),
    ],
)
def test_values_no_column_holds_are_refused_and_nothing_is_blocked(
    proxy: Proxy, body: dict[str, Any], param: str | None
) -> None:
    run = new_run(proxy)
    session = new_session(proxy, run)
    for stream in (False, True):
        error = openai_error(chat(proxy, session["key"], stream=stream, **body))
        if param is not None:
            assert error["param"].startswith(param), error
    # The session, its neighbours and the run's export carry on as if nothing happened.
    assert chat(proxy, session["key"]).status_code == 200
    began = time.monotonic()
    trajectory = proxy.trajectory(session["id"])
    assert time.monotonic() - began < 5
    assert [t["status"] for t in trajectory["turns"]] == ["completed"]
    assert finish(proxy, session["id"]).status_code == 200
    claim = proxy.admin.post(f"/api/v1/runs/{run}/claims", json={"groups": 1})
    assert claim.status_code == 200, claim.text
    (group,) = claim.json()["groups"]
    (sample,) = group["samples"]
    assert len(sample["segments"]) == 1


def test_anthropic_and_responses_refuse_them_in_their_own_shape(proxy: Proxy) -> None:
    session = new_session(proxy, new_run(proxy))
    key = session["key"]
    message = {"role": "user", "content": "hi"}
    for body in (
        {"model": "m\x00", "max_tokens": 8, "messages": [message]},
        {"model": "m", "max_tokens": HUGE, "messages": [message]},
        {"model": "m", "max_tokens": 8, "stop_sequences": ["\x00"], "messages": [message]},
    ):
        response = post(proxy, key, "messages", body)
        assert response.status_code == 400, response.text
        assert response.json()["type"] == "error"
        assert response.json()["error"]["type"] == "invalid_request_error"
    responses: list[dict[str, Any]] = [
        {"model": "m", "input": "hi", "max_output_tokens": HUGE},
        {"model": "m", "input": "hi", "previous_response_id": "resp_\x00"},
    ]
    for request in responses:
        openai_error(post(proxy, key, "responses", request))
    assert chat(proxy, key).status_code == 200


@pytest.mark.parametrize(
    "body",
    [
        {"reward_details": {"score": 2e19}},
        {"reward_details": {"note": "a\x00b"}},
        {"reward_details": {"n": HUGE}},
        {"reward": float("nan")},
        {"reward": 10**400},
        {"reward": [1.0, float("inf")]},
    ],
)
def test_rewards_no_reader_takes_back_are_refused(proxy: Proxy, body: dict[str, Any]) -> None:
    run = new_run(proxy)
    session = new_session(proxy, run)
    assert chat(proxy, session["key"]).status_code == 200
    # json.dumps writes NaN and Infinity as the bare words Python's parser takes back.
    refused = finish(proxy, session["id"], **body)
    openai_error(refused)
    assert finish(proxy, session["id"], reward_details={"score": 1e15}).status_code == 200
    assert proxy.admin.get(f"/api/v1/sessions/{session['id']}").status_code == 200
    claim = proxy.admin.post(f"/api/v1/runs/{run}/claims", json={"groups": 1})
    assert claim.status_code == 200, claim.text
    assert claim.json()["groups"][0]["samples"][0]["reward_details"] == {"score": 1e15}


@pytest.mark.parametrize(
    "body",
    [
        {"step": 2**31, "weight_version": "v", "metrics": {}},
        {"step": 1, "weight_version": "v", "metrics": {"pearson_r": 2e19}},
        {"step": 1, "weight_version": "v", "metrics": {"pearson_r": float("nan")}},
        {"step": 1, "weight_version": "v\x00", "metrics": {}},
    ],
)
def test_alignment_reports_no_reader_takes_back_are_refused(
    proxy: Proxy, body: dict[str, Any]
) -> None:
    run = new_run(proxy)
    response = proxy.admin.post(
        f"/api/v1/runs/{run}/alignment",
        content=json.dumps(body),
        headers={"content-type": "application/json"},
    )
    openai_error(response)
    assert proxy.admin.get(f"/api/v1/runs/{run}/alignment").json() == {"reports": []}


def test_caller_named_metric_labels_are_bounded(proxy: Proxy) -> None:
    session = new_session(proxy, new_run(proxy))
    for batch in range(3):
        extras = {f"field_{batch}_{n}": 1 for n in range(100)}
        assert chat(proxy, session["key"], **extras).status_code == 200
    page = httpx.get(f"{proxy.url}/metrics", timeout=30).text
    series = [line for line in page.splitlines() if line.startswith("lego_ignored_request_fields")]
    assert 128 <= len(series) <= 3 * (128 + 1)  # _total and _created per label, bounded
    assert any('field="_other"' in line for line in series)


def test_a_group_of_declared_size_is_exported_only_when_complete(proxy: Proxy) -> None:
    run = new_run(proxy)
    first = new_session(proxy, run, "sized", group_size=2)
    assert chat(proxy, first["key"]).status_code == 200
    assert finish(proxy, first["id"]).status_code == 200
    early = proxy.admin.post(f"/api/v1/runs/{run}/claims", json={"groups": 1})
    assert early.json()["groups"] == []  # one sample of two: not complete
    second = new_session(proxy, run, "sized")  # the size was declared already
    assert chat(proxy, second["key"]).status_code == 200
    assert finish(proxy, second["id"], reward=0.0).status_code == 200
    claim = proxy.admin.post(f"/api/v1/runs/{run}/claims", json={"groups": 1}).json()
    (group,) = claim["groups"]
    assert len(group["samples"]) == 2
    # A third sample of a group of two, or a different size, is refused.
    body = {"task_id": "t", "group_id": "sized"}
    assert proxy.admin.post(f"/api/v1/runs/{run}/sessions", json=body).status_code == 409
    other = {"task_id": "t", "group_id": "other", "group_size": 2}
    assert proxy.admin.post(f"/api/v1/runs/{run}/sessions", json=other).status_code == 200
    other["group_size"] = 3
    assert proxy.admin.post(f"/api/v1/runs/{run}/sessions", json=other).status_code == 409


def test_a_late_sample_of_an_exported_group_is_refused_not_lost(proxy: Proxy) -> None:
    run = new_run(proxy)
    first = new_session(proxy, run, "undeclared")
    assert finish(proxy, first["id"]).status_code == 200
    claim = proxy.admin.post(f"/api/v1/runs/{run}/claims", json={"groups": 1}).json()
    assert len(claim["groups"]) == 1
    late = proxy.admin.post(
        f"/api/v1/runs/{run}/sessions", json={"task_id": "t", "group_id": "undeclared"}
    )
    assert late.status_code == 409, late.text
    assert "group_size" in late.json()["error"]["message"]


def test_a_closed_group_takes_no_more_sessions_and_exports_when_finished(proxy: Proxy) -> None:
    run = new_run(proxy)
    sessions = [new_session(proxy, run, "closing") for _ in range(2)]
    closed = proxy.admin.post(f"/api/v1/runs/{run}/groups/closing/close")
    assert closed.status_code == 200, closed.text
    assert closed.json() | {"run_id": None} == {
        "run_id": None,
        "group_id": "closing",
        "size": None,
        "sessions": 2,
        "closed": True,
        "exported": False,
    }
    body = {"task_id": "t", "group_id": "closing"}
    assert proxy.admin.post(f"/api/v1/runs/{run}/sessions", json=body).status_code == 409
    assert proxy.admin.post(f"/api/v1/runs/{run}/groups/nope/close").status_code == 404
    for session in sessions:
        assert finish(proxy, session["id"]).status_code == 200
    claim = proxy.admin.post(f"/api/v1/runs/{run}/claims", json={"groups": 1}).json()
    assert len(claim["groups"][0]["samples"]) == 2


CALL = {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}


@pytest.mark.parametrize(
    ("messages", "extra", "param"),
    [
        ([{"role": "tool", "tool_call_id": "nobody", "content": "x"}], {}, "tool_call_id"),
        (
            [
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": None, "tool_calls": [CALL, CALL]},
            ],
            {},
            "tool_calls[1]",
        ),
        (
            [
                {"role": "user", "content": "go"},
                {
                    "role": "assistant",
                    "tool_calls": [CALL | {"function": {"name": "bash", "arguments": "{oops"}}],
                },
            ],
            {},
            "arguments",
        ),
        ([{"role": "user", "content": "hi"}], {"stop": [""]}, "stop"),
    ],
)
def test_conversations_the_upstream_apis_refuse_are_a_400(
    proxy: Proxy, messages: list[dict[str, Any]], extra: dict[str, Any], param: str
) -> None:
    session = new_session(proxy, new_run(proxy))
    error = openai_error(chat(proxy, session["key"], messages=messages, **extra))
    assert param in error["param"], error
    assert proxy.trajectory(session["id"])["turns"] == []  # nothing was generated


def test_an_anthropic_message_with_empty_content_is_a_400(proxy: Proxy) -> None:
    session = new_session(proxy, new_run(proxy))
    empty: list[object] = ["", []]
    for content in empty:
        body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": content}]}
        response = post(proxy, session["key"], "messages", body)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["type"] == "invalid_request_error"


async def record_a_broken_turn(proxy: Proxy, session_id: str) -> None:
    """A turn that continues one the database never got (what a lost turn leaves)."""
    store = await Store.open(proxy.settings.effective_database_url)
    try:
        orphan = dataclasses.replace(
            make_turn(session_id, 10**15, prompt=(1, 2, 3, 4)),
            parent_turn_id="a-turn-that-was-never-recorded",
            classification="extend",
            reused_prefix_len=2,
        )
        await store.write_turns([orphan])
    finally:
        await store.close()


@pytest.mark.parametrize("wire", ["json", "binv1"])
async def test_a_broken_session_never_blocks_a_runs_export(proxy: Proxy, wire: str) -> None:
    run = new_run(proxy)
    broken = new_session(proxy, run, "broken")
    healthy = new_session(proxy, run, "healthy")
    assert chat(proxy, healthy["key"]).status_code == 200
    await record_a_broken_turn(proxy, broken["id"])
    for session in (broken, healthy):
        assert finish(proxy, session["id"]).status_code == 200
    url = f"/api/v1/runs/{run}/claims?format={wire}"
    if wire == "binv1":
        # The head went out before the broken session was read: the body ends early (the
        # client refuses it), and the batch is handed back at once.
        with pytest.raises(httpx.RemoteProtocolError):
            proxy.admin.post(url, json={"groups": 10})
    first = proxy.admin.post(url, json={"groups": 10})
    assert first.status_code == 200, first.text
    batch = decode_claim(first.content)
    assert [g.group_id for g in batch.groups] == ["healthy"]
    assert batch.batch_id is not None
    proxy.admin.post(f"/api/v1/batches/{batch.batch_id}/ack").raise_for_status()
    again = proxy.admin.post(url, json={"groups": 10})
    assert decode_claim(again.content).groups == ()  # the broken group is never handed out
    metrics = proxy.admin.get("/metrics").text
    assert "lego_export_broken_groups_total" in metrics


def test_a_claims_lease_starts_once_its_samples_are_read(proxy: Proxy) -> None:
    run = new_run(proxy)
    for index in range(20):
        session = new_session(proxy, run, f"lease-{index}")
        assert chat(proxy, session["key"]).status_code == 200
        assert finish(proxy, session["id"]).status_code == 200
    response = proxy.admin.post(f"/api/v1/runs/{run}/claims", json={"groups": 20, "lease_s": 1})
    received = time.time()
    body = response.raise_for_status().json()
    assert len(body["groups"]) == 20
    # The lease runs from when the samples were read, not from when the claim began.
    assert body["lease_expires_at"] > received
    assert proxy.admin.post(f"/api/v1/batches/{body['batch_id']}/ack").status_code == 200
