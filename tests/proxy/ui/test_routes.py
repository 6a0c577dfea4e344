"""``/metrics`` and ``/ui`` on a real proxy after a scripted run: counters move exactly as
the run did, the UI's authentication (Bearer and login cookie), and the pages of that run;
a run built through the control API (stage times, validation sessions, epochs) read back
on its steps, epochs and sessions pages."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.proxy.conftest import ADMIN_KEY, AFTER_TOOL_REPLY, SHELL_TOOL, Proxy

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(proxy: Proxy) -> Samples:
    text = httpx.get(f"{proxy.url}/metrics").raise_for_status().text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def moved(before: Samples, after: Samples, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


def client_for(session: dict[str, Any]) -> openai.OpenAI:
    return openai.OpenAI(base_url=session["openai_base_url"], api_key="ignored", max_retries=0)


def scripted_run(proxy: Proxy) -> dict[str, Any]:
    """Two sessions: a tool call and its follow-up (root + extend), then a malformed call."""
    first = proxy.new_session(task_id="ui-task", group_id="ui-group")
    client = client_for(first)
    messages: list[Any] = [{"role": "user", "content": "CALL_TOOL please"}]
    call = client.chat.completions.create(model="m", messages=messages, tools=[SHELL_TOOL])
    calls = call.choices[0].message.tool_calls
    assert calls
    tool_call = calls[0]
    messages += [
        call.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": tool_call.id, "content": "done: out.txt"},
    ]
    follow = client.chat.completions.create(model="m", messages=messages, tools=[SHELL_TOOL])
    assert follow.choices[0].message.content == AFTER_TOOL_REPLY.split("</think>\n\n")[1]
    second = proxy.new_session(task_id="ui-task", group_id="ui-group", sample_index=1)
    bad = client_for(second).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "BAD_CALL"}], tools=[SHELL_TOOL]
    )
    for session, termination, reward in ((first, "completed", 1.0), (second, "max_turns", 0.0)):
        proxy.admin.post(
            f"/api/v1/sessions/{session['id']}/finish",
            json={"termination": termination, "reward": reward},
        ).raise_for_status()
    usages = [r.usage for r in (call, follow, bad)]
    return {
        "first": first,
        "second": second,
        "prompt_tokens": sum(u.prompt_tokens for u in usages if u),
        "completion_tokens": sum(u.completion_tokens for u in usages if u),
    }


@pytest.fixture(scope="module")
def run(proxy: Proxy) -> dict[str, Any]:
    before = scrape(proxy)
    result = scripted_run(proxy)
    return {**result, "before": before, "after": scrape(proxy)}


def test_metrics_moved_exactly_as_the_run_did(run: dict[str, Any]) -> None:
    before, after = run["before"], run["after"]
    chat = {"adapter": "openai_chat"}
    assert moved(before, after, "lego_requests_total", **chat, status="200") == 3
    assert moved(before, after, "lego_turns_total", **chat, status="completed") == 3
    assert moved(before, after, "lego_prompt_tokens_total") == run["prompt_tokens"]
    assert moved(before, after, "lego_completion_tokens_total") == run["completion_tokens"]
    assert moved(before, after, "lego_malformed_tool_calls_total") == 1
    ledger = "lego_ledger_turns_total"
    assert moved(before, after, ledger, classification="root", reason="none") == 2
    assert moved(before, after, ledger, classification="extend", reason="none") == 1
    finished = "lego_sessions_finished_total"
    assert moved(before, after, finished, termination="completed") == 1
    assert moved(before, after, finished, termination="max_turns") == 1
    assert moved(before, after, "lego_turn_duration_seconds_count", **chat) == 3
    assert moved(before, after, "lego_time_to_first_token_seconds_count", **chat) == 3
    errors = [k for k in after if k[0] == "lego_backend_errors_total"]
    assert all(moved(before, after, name, **dict(labels)) == 0 for name, labels in errors)
    # Metrics without observations yet are still exported, so dashboards find them.
    for name in (
        "lego_recorder_write_latency_seconds_count",
        "lego_export_lease_expiries_total",
        "lego_export_staleness_versions_count",
        "lego_recorder_pending_turns",
    ):
        assert (name, ()) in after


def test_ui_needs_the_admin_key(proxy: Proxy) -> None:
    with httpx.Client(base_url=proxy.url) as anonymous:
        redirect = anonymous.get("/ui/runs/x?page=2")
        assert redirect.status_code == 303
        assert redirect.headers["location"] == "/ui/login?next=/ui/runs/x%3Fpage%3D2"
        wrong = anonymous.get("/ui", headers={"authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert "<html" in wrong.text
        assert anonymous.get("/ui/static/ui.css").status_code == 200
        assert anonymous.get("/ui/static/../app.py").status_code == 404
    assert proxy.admin.get("/ui").status_code == 200


def test_login_form_sets_an_http_only_cookie(proxy: Proxy, run: dict[str, Any]) -> None:
    with httpx.Client(base_url=proxy.url) as browser:
        refused = browser.post("/ui/login", data={"key": "guess", "next": "/ui"})
        assert refused.status_code == 401
        assert "not the admin key" in refused.text
        assert "lego_ui" not in browser.cookies
        target = f"/ui/runs/{run['first']['run_id']}"
        ok = browser.post("/ui/login", data={"key": ADMIN_KEY, "next": target})
        assert ok.status_code == 303
        assert ok.headers["location"] == target
        cookie = ok.headers["set-cookie"].lower()
        assert "httponly" in cookie
        assert "samesite=strict" in cookie
        assert "path=/ui" in cookie
        assert ADMIN_KEY not in ok.headers["set-cookie"]  # a derived value, not the key
        assert browser.get(target).status_code == 200
        evil = browser.post("/ui/login", data={"key": ADMIN_KEY, "next": "//evil.example"})
        assert evil.headers["location"] == "/ui"
        browser.post("/ui/logout")
        assert browser.get(target).status_code == 303


def test_pages_show_the_run(proxy: Proxy, run: dict[str, Any]) -> None:
    first, second = run["first"], run["second"]
    proxy.admin.get(f"/api/v1/sessions/{first['id']}").raise_for_status()  # flushes the writer
    overview = proxy.admin.get(f"/ui/runs/{first['run_id']}")
    assert overview.status_code == 200
    assert 'id="total-sessions">1<' in overview.text
    assert 'data-field="solve_rate">100.0%<' in overview.text
    assert 'data-field="turns_per_trajectory">2<' in overview.text
    session = proxy.admin.get(f"/ui/sessions/{first['id']}")
    assert session.status_code == 200
    assert session.text.count('data-classification="root"') == 1
    assert session.text.count('data-classification="extend"') == 1
    assert "done: out.txt" in session.text  # the tool result the second turn added
    assert json.dumps("echo hi > out.txt")[1:-1].replace(">", "&gt;") in session.text
    assert "The file is created." in session.text  # decoded sampled tokens / reply text
    tasks = proxy.admin.get(f"/ui/runs/{second['run_id']}/tasks?sort=-latest")
    assert 'data-task="ui-task"' in tasks.text
    assert proxy.admin.get("/ui/runs/unknown-run").status_code == 404
    assert proxy.admin.get(f"/ui/runs/{first['run_id']}/tasks?sort=bogus").status_code == 400
    assert proxy.admin.get(f"/ui/runs/{first['run_id']}/sessions?page=0").status_code == 400


def test_a_vector_reward_shows_on_the_session_page_and_in_the_sessions_table(
    proxy: Proxy,
) -> None:
    session = proxy.new_session(task_id="vector-task", group_id="vector-group")
    client_for(session).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hello"}]
    )
    proxy.admin.post(
        f"/api/v1/sessions/{session['id']}/finish",
        json={"termination": "completed", "reward": [1.0, 0.0]},
    ).raise_for_status()
    proxy.admin.get(f"/api/v1/sessions/{session['id']}").raise_for_status()  # flushes the writer
    page = proxy.admin.get(f"/ui/sessions/{session['id']}").raise_for_status().text
    assert "reward [1.0, 0.0]," in page
    table = proxy.admin.get(f"/ui/runs/{session['run_id']}/sessions").raise_for_status().text
    assert 'data-field="reward">[1.0, 0.0]</td>' in table


def test_the_session_page_shows_the_trial_report(proxy: Proxy) -> None:
    reported = proxy.new_session(task_id="trial-task", group_id="trial-group")
    silent = proxy.new_session(task_id="trial-task", group_id="trial-group", sample_index=1)
    stages = {"sandbox_setup": 1.5, "agent_execution": 42.25, "verification": 3.0}
    events = [
        {"kind": "test_path_reverted", "path": "tests/<calc>.py"},
        {"kind": "history_hidden", "refs": ["refs/heads/fix"]},
    ]
    body = {"termination": "completed", "reward": 1.0, "stages": stages, "events": events}
    proxy.admin.post(f"/api/v1/sessions/{reported['id']}/finish", json=body).raise_for_status()
    proxy.admin.post(
        f"/api/v1/sessions/{silent['id']}/finish", json={"termination": "harness_error"}
    ).raise_for_status()

    page = proxy.admin.get(f"/ui/sessions/{reported['id']}").raise_for_status().text
    assert '<tr data-stage="sandbox_setup"><td>sandbox_setup</td><td class="num">1.5</td>' in page
    assert '<td>agent_execution</td><td class="num">42.25</td>' in page
    assert '<tr><td>total</td><td class="num">46.75</td></tr>' in page
    assert 'data-stage="agent_setup"' not in page  # not reported, not shown
    assert '<li data-kind="test_path_reverted">' in page
    assert "{&#34;kind&#34;" not in page  # the kind is the badge, not repeated in the details
    assert "tests/&lt;calc&gt;.py" in page  # escaped, never markup
    assert '<li data-kind="history_hidden">' in page
    plain = proxy.admin.get(f"/ui/sessions/{silent['id']}").raise_for_status().text
    assert 'id="trial"' not in plain


def test_the_run_pages_read_what_the_control_api_recorded(proxy: Proxy) -> None:
    """Trials finished over HTTP, as the rollout runner finishes them: their stage times on
    the steps page, their groups on the epochs page, validation kept out of both."""
    run = proxy.admin.post("/api/v1/runs", json={"name": "ui-steps"}).raise_for_status().json()
    finished = [
        ("train", "rt.e0", "completed", 1.0, {"sandbox_setup": 2.0, "agent_execution": 30.0}),
        ("train", "rt.e0", "completed", 0.0, {"sandbox_setup": 4.0, "agent_execution": 50.0}),
        ("train", "rt.e0", "env_setup_failure", None, {"sandbox_setup": 9.0}),
        ("train", "rt.e1", "completed", 1.0, None),
        ("train", "rt.e1", "max_turns", 1.0, None),
        ("validation", "held-out", "completed", 1.0, {"sandbox_setup": 500.0}),
    ]
    for index, (purpose, group, termination, reward, stages) in enumerate(finished):
        session = proxy.admin.post(
            f"/api/v1/runs/{run['id']}/sessions",
            json={"task_id": "rt", "group_id": group, "sample_index": index, "purpose": purpose},
        ).raise_for_status()
        body = {"termination": termination, "reward": reward, "stages": stages}
        proxy.admin.post(
            f"/api/v1/sessions/{session.json()['id']}/finish", json=body
        ).raise_for_status()

    steps = proxy.admin.get(f"/ui/runs/{run['id']}/steps").raise_for_status().text
    assert 'id="timed-trials">3<' in steps  # the validation trial is not a training step's
    table = steps[steps.index('id="stage-table"') :]
    sandbox = table[table.index('data-stage="sandbox_setup"') :]
    assert re.search(r'data-field="mean">5<', sandbox)  # (2 + 4 + 9) / 3
    assert re.search(r'data-field="p50">4<', sandbox)
    assert re.search(r'data-field="share">15.8%<', sandbox)  # 15 of 95 s
    assert re.search(r'data-field="mean">31.67<', table[table.index('data-stage="total"') :])
    assert 'data-reason="env_setup_failure">1 <span class="muted">(20.0%)' in steps

    epochs = proxy.admin.get(f"/ui/runs/{run['id']}/epochs").raise_for_status().text
    assert re.search(r'data-epoch="0">.*?data-field="groups">1<', epochs, re.S)  # 1 of 2
    assert re.search(r'data-epoch="1">.*?data-field="zero_variance_share">100.0%<', epochs, re.S)

    overview = proxy.admin.get(f"/ui/runs/{run['id']}").raise_for_status().text
    assert 'id="total-sessions">6<' in overview
    assert 'id="validation-sessions">1<' in overview

    listed = proxy.admin.get(
        f"/ui/runs/{run['id']}/sessions", params={"purpose": "validation"}
    ).raise_for_status()
    assert 'id="session-total">1<' in listed.text
    excluded = proxy.admin.get(f"/ui/runs/{run['id']}/sessions?excluded=yes&sort=-reward")
    assert 'id="session-total">1<' in excluded.text
    assert '<span class="badge excluded">excluded</span>' in excluded.text
    bad = proxy.admin.get(f"/ui/runs/{run['id']}/sessions?excluded=maybe")
    assert bad.status_code == 400
    assert "excluded: " in bad.text
    assert proxy.admin.get(f"/ui/runs/{run['id']}/sessions?sort=bogus").status_code == 400
    tasks = proxy.admin.get(f"/ui/runs/{run['id']}/tasks").raise_for_status().text
    assert f'href="/ui/runs/{run["id"]}/sessions?task=rt"' in tasks
    assert proxy.admin.get("/ui/runs/unknown-run/steps").status_code == 404
    assert proxy.admin.get("/ui/runs/unknown-run/epochs").status_code == 404
