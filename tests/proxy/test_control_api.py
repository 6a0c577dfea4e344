"""The control API, health and metrics endpoints against a real proxy (SQLite and Postgres).

Orchestrators script against these routes, so the tests pin status codes, the OpenAI-shaped
error envelope, the ``param`` that names the offending field, and the session JSON.
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from recorder.export_wire import SCHEMA_VERSION, decode_trajectory
from tests.proxy.conftest import DEFAULT_REPLY, Proxy

ENVELOPE_FIELDS = {"message", "type", "param", "code"}


def error_of(response: httpx.Response, status: int) -> dict[str, Any]:
    """The error object of an OpenAI-shaped error response, after checking its shape."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}
    error: dict[str, Any] = body["error"]
    assert set(error) == ENVELOPE_FIELDS
    assert isinstance(error["message"], str)
    assert error["message"]
    return error


def new_run(proxy: Proxy) -> str:
    name = f"run-{uuid.uuid4().hex[:12]}"
    response = proxy.admin.post("/api/v1/runs", json={"name": name})
    run_id: str = response.raise_for_status().json()["id"]
    return run_id


def session_body(**overrides: Any) -> dict[str, Any]:
    return {"task_id": "t1", "group_id": "g1", "sample_index": 0, "harness": "pytest", **overrides}


# -- admin authentication ------------------------------------------------------------------


def test_admin_routes_need_the_admin_key(proxy: Proxy) -> None:
    session = proxy.new_session()
    name = f"unauthorised-{uuid.uuid4().hex[:8]}"
    routes = [
        ("POST", "/api/v1/runs", {"name": name}),
        ("POST", f"/api/v1/runs/{session['run_id']}/sessions", session_body()),
        ("POST", f"/api/v1/sessions/{session['id']}/finish", {"termination": "completed"}),
        ("GET", f"/api/v1/sessions/{session['id']}", None),
        ("GET", f"/api/v1/sessions/{session['id']}/trajectory", None),
    ]
    bad_headers: list[dict[str, str]] = [
        {},
        {"authorization": "Bearer not-the-admin-key"},
        {"authorization": f"Bearer {session['key']}"},  # a session key is not an admin key
        {"authorization": f"Basic {proxy.settings.effective_admin_key}"},
        {"x-api-key": proxy.settings.effective_admin_key},
    ]
    with httpx.Client(base_url=proxy.url, timeout=30) as anonymous:
        for method, path, body in routes:
            for headers in bad_headers:
                response = anonymous.request(method, path, json=body, headers=headers)
                error = error_of(response, 401)
                assert error["code"] == "invalid_api_key"
    # Nothing above changed state: the session is still open and the run name still free.
    assert proxy.admin.get(f"/api/v1/sessions/{session['id']}").json()["status"] == "active"
    proxy.admin.post("/api/v1/runs", json={"name": name}).raise_for_status()


# -- validation ------------------------------------------------------------------------------


DROP = object()  # marks a field to leave out of the otherwise valid body


@pytest.mark.parametrize(
    ("changes", "param"),
    [
        ({"task_id": DROP}, "task_id"),
        ({"task_id": ""}, "task_id"),
        ({"group_id": DROP}, "group_id"),
        ({"sample_index": -1}, "sample_index"),
        ({"sample_index": "first"}, "sample_index"),
        ({"surprise": True}, "surprise"),
        ({"sampling": {"temperature": 5}}, "sampling.temperature"),
        ({"sampling": {"top_p": 0}}, "sampling.top_p"),
        ({"sampling": {"max_tokens": 0}}, "sampling.max_tokens"),
        ({"sampling": {"n": 4}}, "sampling.n"),
        # SGLang's rules: every turn of such a session would fail at the backend.
        ({"sampling": {"top_k": 0}}, "sampling.top_k"),
        ({"sampling": {"top_k": -2}}, "sampling.top_k"),
        ({"sampling": {"seed": -1}}, "sampling.seed"),
        ({"sampling": {"seed": 2**63}}, "sampling.seed"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
    ],
)
def test_invalid_session_specs_name_the_field(
    proxy: Proxy, changes: dict[str, Any], param: str
) -> None:
    body = {k: v for k, v in {**session_body(), **changes}.items() if v is not DROP}
    run_id = new_run(proxy)
    response = proxy.admin.post(f"/api/v1/runs/{run_id}/sessions", json=body)
    error = error_of(response, 400)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    # The same run accepts the valid body: the 400 was about the field, not the run.
    proxy.admin.post(f"/api/v1/runs/{run_id}/sessions", json=session_body()).raise_for_status()


def test_invalid_finish_and_run_bodies_name_the_field(proxy: Proxy) -> None:
    session = proxy.new_session()
    finish = f"/api/v1/sessions/{session['id']}/finish"
    cases: list[tuple[str, dict[str, Any], str]] = [
        (finish, {"termination": "gave_up"}, "termination"),
        (finish, {"reward": 1.0}, "termination"),
        (finish, {"termination": "completed", "reward": "high"}, "reward"),
        (finish, {"termination": "completed", "bonus": 1}, "bonus"),
        ("/api/v1/runs", {}, "name"),
        ("/api/v1/runs", {"name": ""}, "name"),
        ("/api/v1/runs", {"name": "x", "owner": "me"}, "owner"),
    ]
    for path, body, param in cases:
        error = error_of(proxy.admin.post(path, json=body), 400)
        assert error["param"] == param, (path, body)
    # None of the rejected finishes took effect.
    assert proxy.admin.get(f"/api/v1/sessions/{session['id']}").json()["status"] == "active"


def test_malformed_json_is_a_400(proxy: Proxy) -> None:
    run_id = new_run(proxy)
    headers = {"content-type": "application/json"}
    for path in ("/api/v1/runs", f"/api/v1/runs/{run_id}/sessions"):
        response = proxy.admin.post(path, content=b'{"name": ', headers=headers)
        assert error_of(response, 400)["type"] == "invalid_request_error"
    not_an_object = proxy.admin.post("/api/v1/runs", content=b"[1, 2]", headers=headers)
    error_of(not_an_object, 400)


# -- not found and conflicts ----------------------------------------------------------------


def test_unknown_run_and_session_are_404(proxy: Proxy) -> None:
    response = proxy.admin.post("/api/v1/runs/no-such-run/sessions", json=session_body())
    assert error_of(response, 404)["code"] == "not_found"
    for method, path, body in [
        ("GET", "/api/v1/sessions/no-such-session", None),
        ("GET", "/api/v1/sessions/no-such-session/trajectory", None),
        ("POST", "/api/v1/sessions/no-such-session/finish", {"termination": "completed"}),
    ]:
        error = error_of(proxy.admin.request(method, path, json=body), 404)
        assert error["code"] == "not_found"
        assert "no-such-session" in error["message"]


def test_duplicate_run_name_is_409(proxy: Proxy) -> None:
    twice = f"twice-{uuid.uuid4().hex[:8]}"
    proxy.admin.post("/api/v1/runs", json={"name": twice}).raise_for_status()
    error = error_of(proxy.admin.post("/api/v1/runs", json={"name": twice}), 409)
    assert error["code"] == "conflict"
    assert error["param"] == "name"


def test_finishing_twice_is_409_and_keeps_the_first_result(proxy: Proxy) -> None:
    session = proxy.new_session()
    path = f"/api/v1/sessions/{session['id']}/finish"
    first = proxy.admin.post(path, json={"termination": "completed", "reward": 0.25})
    assert first.status_code == 200
    assert first.json()["status"] == "finished"
    second = proxy.admin.post(path, json={"termination": "max_turns", "reward": 1.0})
    assert error_of(second, 409)["code"] == "conflict"
    after = proxy.admin.get(f"/api/v1/sessions/{session['id']}").json()
    assert (after["termination"], after["reward"]) == ("completed", 0.25)


# -- finishing ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "termination", ["env_setup_failure", "harness_error", "agent_timeout", "grader_error"]
)
def test_excluded_termination_keeps_reward_null(proxy: Proxy, termination: str) -> None:
    session = proxy.new_session()
    finished = proxy.admin.post(
        f"/api/v1/sessions/{session['id']}/finish", json={"termination": termination}
    ).raise_for_status()
    for body in (finished.json(), proxy.admin.get(f"/api/v1/sessions/{session['id']}").json()):
        assert body["termination"] == termination
        assert body["excluded"] is True
        assert body["reward"] is None  # a failed environment is never a zero reward


def test_graded_termination_records_reward_and_details(proxy: Proxy) -> None:
    session = proxy.new_session()
    body = {"termination": "max_turns", "reward": 0.0, "reward_details": {"tests_passed": 0}}
    finished = proxy.admin.post(f"/api/v1/sessions/{session['id']}/finish", json=body)
    result = finished.raise_for_status().json()
    assert result["excluded"] is False
    assert result["reward"] == 0.0
    assert result["reward_details"] == {"tests_passed": 0}


STAGES = {"sandbox_setup": 2.5, "agent_setup": 0.5, "agent_execution": 61.0, "verification": 4}
EVENTS = [
    {"kind": "test_path_reverted", "path": "tests/test_calc.py"},
    {"kind": "test_file_removed", "path": "tests/conftest.py", "bytes": 42},
    {"kind": "history_hidden", "refs": ["refs/heads/fix", "refs/tags/v1"], "detail": {"n": 2}},
]


def test_a_trial_report_is_stored_and_every_read_gives_it_back(proxy: Proxy) -> None:
    session = proxy.new_session()
    body = {"termination": "completed", "reward": 1.0, "stages": STAGES, "events": EVENTS}

    finished = proxy.admin.post(f"/api/v1/sessions/{session['id']}/finish", json=body)

    got = proxy.admin.get(f"/api/v1/sessions/{session['id']}").json()
    trajectory = proxy.trajectory(session["id"])
    for read in (finished.raise_for_status().json(), got, trajectory):
        assert read["stages"] == {**STAGES, "verification": 4.0}
        assert read["defense_events"] == EVENTS
    assert trajectory["events"] == []  # the ledger's departures, a separate list


def test_a_finish_without_a_trial_report_reads_back_none(proxy: Proxy) -> None:
    session = proxy.new_session()
    finish = f"/api/v1/sessions/{session['id']}/finish"
    result = proxy.admin.post(finish, json={"termination": "harness_error"}).raise_for_status()
    assert (result.json()["stages"], result.json()["defense_events"]) == (None, [])
    assert proxy.trajectory(session["id"])["stages"] is None


@pytest.mark.parametrize(
    ("report", "param", "says"),
    [
        ({"stages": {"setup": 1.0}}, "stages", "unknown stage 'setup'"),
        ({"stages": {"verification": -0.5}}, "stages.verification", "greater than or equal"),
        ({"stages": {"verification": 1e9}}, "stages.verification", "less than or equal"),
        ({"stages": {"verification": "3"}}, "stages.verification", "valid number"),
        ({"stages": {"verification": True}}, "stages.verification", "valid number"),
        ({"stages": [1.0]}, "stages", "object"),
        ({"events": {"kind": "x"}}, "events", "array"),
        ({"events": [{"path": "a"}]}, "events.0.kind", "required"),
        ({"events": [{"kind": 3}]}, "events.0.kind", "string"),
        ({"events": [{"kind": "Not A Kind"}]}, "events.0.kind", "pattern"),
        ({"events": [{"kind": "x", "n": 2**70}]}, "events.0", "64 bits"),
        ({"events": [{"kind": "x", "note": "a\x00b"}]}, "events.0", "NUL"),
        ({"events": [{"kind": "x", "blob": "y" * 65_536}]}, "events.0", "65536 bytes"),
        ({"events": [{"kind": "x"}] * 257}, "events", "at most 256"),
    ],
)
def test_bad_trial_reports_are_refused_naming_the_field(
    proxy: Proxy, report: dict[str, Any], param: str, says: str
) -> None:
    session = proxy.new_session()
    finish = f"/api/v1/sessions/{session['id']}/finish"
    body = {"termination": "completed", "reward": 1.0, **report}
    error = error_of(proxy.admin.post(finish, json=body), 400)
    assert error["param"] == param
    assert says in error["message"]
    assert proxy.admin.get(f"/api/v1/sessions/{session['id']}").json()["status"] == "active"


# -- session JSON ---------------------------------------------------------------------------


def test_session_json_and_base_urls_work_with_the_sdk(proxy: Proxy) -> None:
    run_id = new_run(proxy)
    spec = session_body(
        task_id="task-7",
        group_id="group-3",
        sample_index=2,
        harness="opencode",
        sampling={"temperature": 0.5, "max_tokens": 64},
        max_prompt_tokens=4096,
    )
    created = proxy.admin.post(f"/api/v1/runs/{run_id}/sessions", json=spec)
    session = created.raise_for_status().json()
    key = session["key"]
    assert key
    assert session["run_id"] == run_id
    assert (session["task_id"], session["group_id"], session["sample_index"]) == (
        "task-7",
        "group-3",
        2,
    )
    assert session["harness"] == "opencode"
    assert session["sampling"] == {"temperature": 0.5, "max_tokens": 64}
    assert session["max_prompt_tokens"] == 4096
    assert session["status"] == "active"
    assert session["turn_count"] == 0
    assert session["reward"] is None
    assert session["excluded"] is False
    public = proxy.settings.effective_public_url
    assert session["openai_base_url"] == f"{public}/s/{key}/v1"
    assert session["anthropic_base_url"] == f"{public}/s/{key}"

    fetched = proxy.admin.get(f"/api/v1/sessions/{session['id']}").raise_for_status().json()
    assert "key" not in fetched  # the key is handed out once, at creation
    assert fetched["openai_base_url"] == session["openai_base_url"]

    client = openai.OpenAI(base_url=session["openai_base_url"], api_key="unused", max_retries=0)
    for _ in range(2):
        reply = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
        assert reply.choices[0].message.content == DEFAULT_REPLY
    fetched = proxy.admin.get(f"/api/v1/sessions/{session['id']}").raise_for_status().json()
    assert fetched["turn_count"] == 2


def test_the_trajectory_comes_in_json_or_b64v1_and_decodes_the_same(proxy: Proxy) -> None:
    session = proxy.new_session()
    client = openai.OpenAI(base_url=session["openai_base_url"], api_key="unused", max_retries=0)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    route = f"/api/v1/sessions/{session['id']}/trajectory"

    plain, compact = (
        proxy.admin.get(route, params={"format": wire}).raise_for_status()
        for wire in ("json", "b64v1")
    )

    assert plain.json()["schema_version"] == compact.json()["schema_version"] == SCHEMA_VERSION
    assert isinstance(compact.json()["segments"][0]["tokens"]["data"], str)  # base64
    got_plain, got_compact = decode_trajectory(plain.content), decode_trajectory(compact.content)
    assert got_plain.session_id == got_compact.session_id == session["id"]
    (one,), (other,) = got_plain.segments, got_compact.segments
    for name in ("tokens", "loss_mask", "logprobs", "routed_experts"):
        np.testing.assert_array_equal(getattr(one, name), getattr(other, name))
    assert int(one.loss_mask.sum()) == plain.json()["turns"][0]["completion_tokens"]
    error = error_of(proxy.admin.get(route, params={"format": "binv1"}), 400)
    assert error["param"] == "format"


# -- health, metrics, unknown routes --------------------------------------------------------


def counter_value(text: str, name: str, labels: dict[str, str]) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return 0.0


def test_healthz(proxy: Proxy) -> None:
    response = httpx.get(f"{proxy.url}/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_metrics_count_turns_exactly(proxy: Proxy) -> None:
    labels = {"adapter": "openai_chat", "status": "completed"}
    before = httpx.get(f"{proxy.url}/metrics")
    assert before.status_code == 200
    assert before.headers["content-type"].startswith("text/plain")
    families = {f.name for f in text_string_to_metric_families(before.text)}
    assert {"lego_turns", "lego_requests", "lego_sessions_finished"} <= families
    start = counter_value(before.text, "lego_turns_total", labels)

    session = proxy.new_session()
    client = openai.OpenAI(base_url=session["openai_base_url"], api_key="unused", max_retries=0)
    turns = 3
    for _ in range(turns):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    proxy.admin.post(
        f"/api/v1/sessions/{session['id']}/finish", json={"termination": "completed", "reward": 1}
    ).raise_for_status()

    after = httpx.get(f"{proxy.url}/metrics").text
    assert counter_value(after, "lego_turns_total", labels) == start + turns
    finished = {"termination": "completed"}
    assert counter_value(after, "lego_sessions_finished_total", finished) >= 1


def test_unknown_routes_get_the_error_envelope(proxy: Proxy) -> None:
    for path in ("/v1/no-such-endpoint", "/api/v1/no-such-thing", "/s/some-key/v1/nope"):
        error = error_of(httpx.get(f"{proxy.url}{path}"), 404)
        assert error["code"] == "not_found"


def test_a_missing_admin_key_and_a_wrong_one_are_told_apart(proxy: Proxy) -> None:
    with httpx.Client(base_url=proxy.url, timeout=30) as anonymous:
        missing = error_of(anonymous.get("/api/v1/runs"), 401)["message"]
        wrong = error_of(
            anonymous.get("/api/v1/runs", headers={"authorization": "Bearer nope"}), 401
        )["message"]
    assert "needs 'Authorization: Bearer <admin key>'" in missing
    assert "not this proxy's admin key (LEGO_ADMIN_KEY)" in wrong


def test_a_wrong_method_is_405_with_allow_and_its_own_code(proxy: Proxy) -> None:
    response = httpx.delete(f"{proxy.url}/api/v1/runs")
    error = error_of(response, 405)
    assert error["code"] == "method_not_allowed"
    assert set(response.headers["allow"].replace(" ", "").split(",")) == {"GET", "POST"}


def test_the_root_says_where_to_go(proxy: Proxy) -> None:
    index = httpx.get(f"{proxy.url}/").raise_for_status().json()
    assert index["live_ui"] == "/ui"
    assert index["health"] == "/healthz"
    assert httpx.head(f"{proxy.url}/").status_code == 200  # harness preconnects still work


def test_runs_are_listed_in_creation_order_with_a_cursor(proxy: Proxy) -> None:
    created = [new_run(proxy) for _ in range(3)]
    seen: list[str] = []
    cursor: str | None = None
    while True:
        params = {"limit": "2", **({"cursor": cursor} if cursor else {})}
        page = proxy.admin.get("/api/v1/runs", params=params).raise_for_status().json()
        assert len(page["items"]) <= 2
        seen += [run["id"] for run in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert [run for run in seen if run in created] == created
    assert len(seen) == len(set(seen))
    error = error_of(proxy.admin.get("/api/v1/runs", params={"cursor": "%%%"}), 400)
    assert error["param"] == "cursor"
