"""``GET /api/v1/runs/{id}/behaviour`` and the Live UI's behaviour tab on a real proxy, after
sessions driven through the scripted engine with the official SDK (SQLite and Postgres).

The run: an OpenCode session that writes a file with its shell tool and answers, an
OpenCode session whose only call is malformed, and a session of a harness no indicator
understands; the first two share a prompt group. Every number below is worked out by hand
from the script's replies (``tests.proxy.conftest.SCRIPT``)."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import openai
import pytest

from proxy.ui.pages import MISSING
from tests.proxy.conftest import AFTER_TOOL_REPLY, READ_TOOL, SHELL_TOOL, Proxy
from tests.proxy.test_control_api import error_of


def chat(session: dict[str, Any], content: str) -> Any:
    client = openai.OpenAI(base_url=session["openai_base_url"], api_key="x", max_retries=0)
    messages: list[Any] = [{"role": "user", "content": content}]
    first = client.chat.completions.create(
        model="m", messages=messages, tools=[SHELL_TOOL, READ_TOOL]
    )
    calls = first.choices[0].message.tool_calls
    if content == "CALL_TOOL please":  # the harness runs the call and sends its result
        assert calls
        messages += [
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": calls[0].id, "content": "done: out.txt"},
        ]
        follow = client.chat.completions.create(model="m", messages=messages, tools=[SHELL_TOOL])
        assert follow.choices[0].message.content == AFTER_TOOL_REPLY.split("</think>\n\n")[1]
    return first


@pytest.fixture(scope="module")
def run_id(proxy: Proxy) -> str:
    created = proxy.admin.post("/api/v1/runs", json={"name": f"behaviour-{uuid.uuid4().hex[:8]}"})
    run: str = created.raise_for_status().json()["id"]
    plan = [
        ("opencode", "g1", "CALL_TOOL please", "completed", 1.0),
        ("opencode", "g1", "BAD_CALL", "max_turns", 0.0),
        ("my-harness", "g2", "TWO_CALLS", "completed", 1.0),
    ]
    for index, (harness, group, content, termination, reward) in enumerate(plan):
        body = {"task_id": "t", "group_id": group, "sample_index": index, "harness": harness}
        session = proxy.admin.post(f"/api/v1/runs/{run}/sessions", json=body)
        session.raise_for_status()
        chat(session.json(), content)
        proxy.admin.post(
            f"/api/v1/sessions/{session.json()['id']}/finish",
            json={"termination": termination, "reward": reward},
        ).raise_for_status()
    return run


def behaviour(proxy: Proxy, run_id: str, query: str = "") -> dict[str, Any]:
    response = proxy.admin.get(f"/api/v1/runs/{run_id}/behaviour{query}")
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()
    return found


def indicator(found: dict[str, Any], key: str) -> dict[str, Any]:
    (row,) = [i for i in found["indicators"] if i["key"] == key]
    return dict(row)


def counts(row: dict[str, Any], part: str = "all") -> tuple[Any, ...]:
    cell = row[part]
    return (cell["value"], cell["sessions"], cell["not_applicable"], cell["not_understood"])


def test_the_api_answers_the_run_s_indicators_worked_by_hand(proxy: Proxy, run_id: str) -> None:
    found = behaviour(proxy, run_id)
    assert (found["graded_sessions"], found["read_sessions"], found["session_limit"]) == (
        3,
        3,
        2000,
    )
    # (value, measured, nothing to measure, harness not understood) over all three.
    assert counts(indicator(found, "runs_tests")) == (0.0, 2, 0, 1)
    # The shell wrote out.txt (an edit) and never read it back; the other one never edited.
    assert counts(indicator(found, "reads_back_edit")) == (0.0, 1, 1, 1)
    assert counts(indicator(found, "explored_before_edit")) == (0.0, 1, 1, 1)
    assert counts(indicator(found, "reproduces_before_edit")) == (0.0, 1, 1, 1)
    # A final answer after the tool result; the malformed block is no finish.
    assert counts(indicator(found, "explicit_finish")) == (0.5, 2, 0, 1)
    # OpenCode's shell results do not say how a command exited.
    solves = indicator(found, "solves_despite_failure")
    assert counts(solves) == (None, 0, 0, 3)
    assert "opencode" not in solves["harnesses"]
    # 1 malformed block over 1 + 1 + 2 calls, every harness understood.
    assert counts(indicator(found, "malformed_calls")) == (0.25, 3, 0, 0)
    assert indicator(found, "malformed_calls")["harnesses"] is None
    reasoning = indicator(found, "reasoning_share")["all"]
    assert 0.0 < reasoning["value"] < 1.0
    # Thirds of one session: the first is the OpenCode fix, the last the unknown harness.
    assert counts(indicator(found, "explicit_finish"), "first_third") == (1.0, 1, 0, 0)
    assert counts(indicator(found, "explicit_finish"), "last_third") == (None, 0, 0, 1)
    first, last = found["slices"]["first_third"], found["slices"]["last_third"]
    assert (first["sessions"], first["harnesses"]) == (1, {"opencode": 1})
    assert (last["sessions"], last["harnesses"]) == (1, {"my-harness": 1})
    assert found["slices"]["all"]["harnesses"] == {"my-harness": 1, "opencode": 2}


def test_pass_at_k_over_the_run_s_prompt_groups(proxy: Proxy, run_id: str) -> None:
    # g1 = (1.0, 0.0), g2 = (1.0): sizes tie, the larger (2) is k and g2 is left out.
    every = behaviour(proxy, run_id)["slices"]["all"]
    assert (every["k"], every["groups"], every["groups_left_out"]) == (2, 1, 1)
    assert (every["pass_at_k"], every["pass_hat_k"]) == (1.0, 0.0)
    # k=1: g1 passes half its single draws, g2 all of them.
    one = behaviour(proxy, run_id, "?k=1")["slices"]["all"]
    assert (one["k"], one["groups"], one["groups_left_out"]) == (1, 2, 0)
    assert one["pass_at_k"] == pytest.approx(0.75)
    assert one["pass_hat_k"] == pytest.approx(0.75)


def test_api_errors_come_in_the_control_api_s_envelope(proxy: Proxy, run_id: str) -> None:
    assert error_of(proxy.admin.get("/api/v1/runs/no-such-run/behaviour"), 404)
    for bad in ("0", "abc", "10001"):
        error = error_of(proxy.admin.get(f"/api/v1/runs/{run_id}/behaviour?k={bad}"), 400)
        assert error["param"] == "k"
    with httpx.Client(base_url=proxy.url) as anonymous:
        error = error_of(anonymous.get(f"/api/v1/runs/{run_id}/behaviour"), 401)
        assert error["code"] == "invalid_api_key"


def test_the_live_ui_has_a_behaviour_tab(proxy: Proxy, run_id: str) -> None:
    behaviour(proxy, run_id)  # flushes the writer
    overview = proxy.admin.get(f"/ui/runs/{run_id}").raise_for_status().text
    assert f'<a href="/ui/runs/{run_id}/behaviour">behaviour</a>' in overview
    page = proxy.admin.get(f"/ui/runs/{run_id}/behaviour").raise_for_status().text
    assert '<span id="read-sessions">3</span>' in page
    assert '<tr data-indicator="explicit_finish">' in page
    finish = page.split('<tr data-indicator="explicit_finish">')[1].split("</tr>")[0]
    assert 'data-slice="first_third"' in finish
    assert '>100.0% <span class="muted">n=1</span>' in finish
    assert f'>{MISSING} <span class="muted">n=0, 1 left out</span>' in finish  # last third
    assert '>50.0% <span class="muted">n=2, 1 left out</span>' in finish  # all
    malformed = page.split('<tr data-indicator="malformed_calls">')[1].split("</tr>")[0]
    assert ">25.0% <span" in malformed
    passes = page.split('<tr data-field="pass_at_k">')[1].split("</tr>")[0]
    assert '<td class="num" data-slice="all">100.0%</td>' in passes
    asked = proxy.admin.get(f"/ui/runs/{run_id}/behaviour?k=1").raise_for_status().text
    assert "pass@1" in asked
    assert proxy.admin.get("/ui/runs/no-such-run/behaviour").status_code == 404
    assert proxy.admin.get(f"/ui/runs/{run_id}/behaviour?k=x").status_code == 400
    with httpx.Client(base_url=proxy.url) as anonymous:
        assert anonymous.get(f"/ui/runs/{run_id}/behaviour").status_code == 303  # to login
