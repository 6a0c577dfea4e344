"""Export / run-control API through the real proxy: claims, formats, pause, versions,
alignment, listing; and a multi-session run that survives Postgres going away."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from kernel.errors import Overloaded
from kernel.threaded import free_port, serve
from proxy.app import create_app
from proxy.gate import RunGate
from proxy.settings import Settings
from recorder.export_wire import SCHEMA_VERSION, decode_claim
from recorder.scratch_postgres import PostgresServer
from tests.proxy.conftest import ADMIN_KEY, Proxy
from tests.support.tap import BackendTap

CLAIM_KEYS = {
    "batch_id",
    "lease_expires_at",
    "schema_version",
    "format",
    "zero_variance_groups",
    "stale_groups",
    "groups",
}
SAMPLE_KEYS = {
    "session_id",
    "sample_index",
    "reward",
    "reward_details",
    "termination",
    "stages",
    "defense_events",
    "segments",
}
SEGMENT_KEYS = {
    "tokens",
    "loss_mask",
    "logprobs",
    "routed_experts",
    "weight_versions",
    "weight_version_spans",
    "turn_ids",
}


def new_run(proxy: Proxy) -> str:
    name = f"export-{time.time_ns()}"
    return str(
        proxy.admin.post("/api/v1/runs", json={"name": name}).raise_for_status().json()["id"]
    )


def new_session(proxy: Proxy, run: str, group: str, index: int) -> dict[str, Any]:
    body = {"task_id": f"task-{group}", "group_id": group, "sample_index": index}
    response = proxy.admin.post(f"/api/v1/runs/{run}/sessions", json=body)
    return dict(response.raise_for_status().json())


def converse(session: dict[str, Any], turns: int = 2) -> int:
    """A multi-turn conversation; returns how many responses completed."""
    client = openai.OpenAI(base_url=session["openai_base_url"], api_key="x", max_retries=0)
    messages: list[Any] = []
    for n in range(turns):
        messages.append({"role": "user", "content": f"question {n}"})
        reply = client.chat.completions.create(model="m", messages=messages, max_tokens=24)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
    return turns


def finish(proxy: Proxy, session: dict[str, Any], termination: str, reward: Any) -> None:
    body = {"termination": termination, "reward": reward}
    proxy.admin.post(f"/api/v1/sessions/{session['id']}/finish", json=body).raise_for_status()


def claim(proxy: Proxy, run: str, fmt: str = "json", **body: Any) -> dict[str, Any]:
    body.setdefault("groups", 10)
    response = proxy.admin.post(f"/api/v1/runs/{run}/claims?format={fmt}", json=body)
    return dict(response.raise_for_status().json())


def test_claims_deliver_complete_groups_once_with_the_trajectory_segments(proxy: Proxy) -> None:
    run = new_run(proxy)
    group = [new_session(proxy, run, "g1", i) for i in range(3)]
    for session in group:
        converse(session)
    finish(proxy, group[0], "completed", 1.0)
    assert claim(proxy, run)["groups"] == []  # incomplete: two samples still running
    finish(proxy, group[1], "completed", [0.0, 0.5])
    finish(proxy, group[2], "env_setup_failure", None)

    batch = claim(proxy, run)

    assert set(batch) == CLAIM_KEYS
    assert batch["schema_version"] == SCHEMA_VERSION
    assert batch["zero_variance_groups"] == 0
    (delivered,) = batch["groups"]
    assert (delivered["group_id"], delivered["task_id"]) == ("g1", "task-g1")
    samples = delivered["samples"]
    assert [s["session_id"] for s in samples] == [group[0]["id"], group[1]["id"]]  # no excluded
    assert [s["reward"] for s in samples] == [1.0, [0.0, 0.5]]
    for sample in samples:
        assert set(sample) == SAMPLE_KEYS
        expected = proxy.trajectory(sample["session_id"])["segments"]
        assert [set(seg) for seg in sample["segments"]] == [SEGMENT_KEYS] * len(expected)
        assert sample["segments"] == expected
        main = sample["segments"][0]
        assert len(main["turn_ids"]) == 2  # the second turn extended the first
        assert sum(main["loss_mask"]) == sum(
            end - start for _, start, end in main["weight_version_spans"]
        )
    assert claim(proxy, run)["groups"] == []  # leased: never handed out twice
    ack = proxy.admin.post(f"/api/v1/batches/{batch['batch_id']}/ack")
    assert ack.raise_for_status().json() == {"batch_id": batch["batch_id"], "acked": True}


def test_the_compact_format_decodes_to_the_json_arrays(proxy: Proxy) -> None:
    run = new_run(proxy)
    session = new_session(proxy, run, "g", 0)
    converse(session, turns=3)
    finish(proxy, session, "completed", 0.25)
    expected = proxy.trajectory(session["id"])["segments"]

    response = proxy.admin.post(f"/api/v1/runs/{run}/claims?format=b64v1", json={"groups": 1})
    raw = response.raise_for_status().json()
    batch = decode_claim(response.content)

    assert raw["format"] == raw["groups"][0]["samples"][0]["segments"][0]["format"] == "b64v1"
    (segment,) = batch.groups[0].samples[0].segments
    (want,) = expected
    assert segment.tokens.tolist() == want["tokens"]
    assert segment.loss_mask.tolist() == want["loss_mask"]
    assert segment.logprobs.dtype == np.float32
    assert segment.logprobs.astype(np.float64).tolist() == want["logprobs"]
    if want["routed_experts"] is not None:
        assert segment.routed_experts is not None
        assert segment.routed_experts.dtype.itemsize <= 2
        assert segment.routed_experts.astype(np.int32).tolist() == want["routed_experts"]
    assert list(segment.turn_ids) == want["turn_ids"]
    bad = proxy.admin.post(f"/api/v1/runs/{run}/claims?format=xml", json={"groups": 1})
    assert bad.status_code == 400


@pytest.mark.parametrize("fmt", ["json", "b64v1", "binv1"])
def test_claimed_samples_carry_the_trial_report_in_every_format(proxy: Proxy, fmt: str) -> None:
    run = new_run(proxy)
    reported, silent = new_session(proxy, run, "g", 0), new_session(proxy, run, "g", 1)
    converse(reported, turns=1)
    converse(silent, turns=1)
    stages = {"sandbox_setup": 1.25, "agent_execution": 30.5, "verification": 2.0}
    events = [{"kind": "test_path_reverted", "path": "tests/test_a.py"}, {"kind": "history_hidden"}]
    body = {"termination": "completed", "reward": 1.0, "stages": stages, "events": events}
    path = f"/api/v1/sessions/{reported['id']}/finish"
    proxy.admin.post(path, json=body).raise_for_status()
    finish(proxy, silent, "completed", 0.0)

    response = proxy.admin.post(f"/api/v1/runs/{run}/claims?format={fmt}", json={"groups": 1})
    batch = decode_claim(response.raise_for_status().content)

    first, second = batch.groups[0].samples
    assert first.session_id == reported["id"]
    assert first.stages is not None
    assert first.stages.reported() == stages
    assert [event.flat() for event in first.defense_events] == events
    assert (second.stages, second.defense_events) == (None, ())
    if fmt != "binv1":
        raw = response.json()["groups"][0]["samples"]
        assert (raw[0]["stages"], raw[0]["defense_events"]) == (stages, events)


def test_weight_versions_and_staleness_filter(proxy: Proxy) -> None:
    run = new_run(proxy)
    path = f"/api/v1/runs/{run}/weight_versions"
    posted = [proxy.admin.post(path, json={"version": v}).json() for v in ("a", "b", "c")]
    assert [(p["version"], p["index"]) for p in posted] == [("a", 0), ("b", 1), ("c", 2)]
    assert [v["version"] for v in proxy.admin.get(path).json()["versions"]] == ["a", "b", "c"]
    session = new_session(proxy, run, "g", 0)
    converse(session, turns=1)  # the engine reports a version never announced: index -1
    finish(proxy, session, "completed", 1.0)

    held = claim(proxy, run, max_staleness=2)
    assert (held["groups"], held["stale_groups"]) == ([], 1)
    assert claim(proxy, run, max_staleness=3)["groups"][0]["staleness"] == 3


def test_trajectories_page_with_a_stable_cursor_and_filters(proxy: Proxy) -> None:
    run = new_run(proxy)
    sessions = [new_session(proxy, run, f"g{i}", 0) for i in range(5)]
    finish(proxy, sessions[0], "completed", 1.0)
    finish(proxy, sessions[1], "harness_error", None)
    path = f"/api/v1/runs/{run}/trajectories"

    seen: list[str] = []
    cursor: str | None = ""
    while cursor is not None:
        page = proxy.admin.get(path, params={"limit": 2, "cursor": cursor}).json()
        seen += [item["id"] for item in page["items"]]
        cursor = page["next_cursor"]
    assert seen == [s["id"] for s in sessions]

    done = proxy.admin.get(path, params={"finished": "true", "excluded": "false"}).json()
    assert [item["id"] for item in done["items"]] == [sessions[0]["id"]]
    assert done["items"][0]["reward"] == 1.0
    excluded = proxy.admin.get(path, params={"excluded": "true"}).json()
    assert [item["excluded"] for item in excluded["items"]] == [True]
    assert proxy.admin.get(path, params={"cursor": "!!"}).status_code == 400


def test_alignment_reports_become_prometheus_gauges(proxy: Proxy) -> None:
    run = new_run(proxy)
    path = f"/api/v1/runs/{run}/alignment"
    metrics = {"pearson_r": 0.9991, "k3_kl": 1e-4, "abs_dlogp_p99": 0.01, "expert_overlap": None}
    for step in (1, 2):
        body = {"step": step, "weight_version": "v1", "metrics": metrics, "flagged": False}
        proxy.admin.post(path, json=body).raise_for_status()
    assert [r["step"] for r in proxy.admin.get(path).json()["reports"]] == [1, 2]
    text = httpx.get(f"{proxy.url}/metrics").text
    assert f'lego_alignment_pearson_r{{run="{run}"}} 0.9991' in text
    bad = proxy.admin.post(path, json={"step": 1, "weight_version": "v", "metrics": {"x": "y"}})
    assert bad.status_code == 400


def test_a_flagged_step_keeps_the_trainers_reasons(proxy: Proxy) -> None:
    run = new_run(proxy)
    path = f"/api/v1/runs/{run}/alignment"
    why = ["pearson_r 0.91 < 0.99"]
    body = {"step": 1, "weight_version": "v0", "metrics": {"pearson_r": 0.91}}
    proxy.admin.post(path, json={**body, "flagged": True, "reasons": why}).raise_for_status()
    proxy.admin.post(path, json={**body, "step": 2}).raise_for_status()
    reports = proxy.admin.get(path).json()["reports"]
    assert [(r["flagged"], r["reasons"]) for r in reports] == [(True, why), (False, [])]
    too_long = proxy.admin.post(path, json={**body, "reasons": ["x" * 2000]})
    assert too_long.status_code == 400


def test_the_export_api_needs_the_admin_key(proxy: Proxy) -> None:
    run = new_run(proxy)
    response = httpx.post(f"{proxy.url}/api/v1/runs/{run}/claims", json={"groups": 1})
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"
    unknown = proxy.admin.post("/api/v1/runs/nope/claims", json={"groups": 1})
    assert unknown.status_code == 404
    assert proxy.admin.post("/api/v1/batches/nope/ack").status_code == 404


def test_a_paused_run_holds_new_turns_until_resumed(proxy: Proxy) -> None:
    run = new_run(proxy)
    session = new_session(proxy, run, "g", 0)
    proxy.admin.post(f"/api/v1/runs/{run}/pause").raise_for_status()
    finished = threading.Event()

    def ask() -> None:
        converse(session, turns=1)
        finished.set()

    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(ask)
        assert not finished.wait(0.5)  # held at the gate
        resumed = proxy.admin.post(f"/api/v1/runs/{run}/resume").json()
        assert resumed == {"run_id": run, "paused": False}
        future.result(timeout=30)
    assert proxy.trajectory(session["id"])["turn_count"] == 1


async def test_the_gate_gives_up_with_retry_after() -> None:
    gate = RunGate(max_wait_s=0.05, retry_after_s=7)
    await gate.wait("r")  # not paused: no wait
    gate.pause("r")
    with pytest.raises(Overloaded) as caught:
        await gate.wait("r")
    assert (caught.value.status, caught.value.retry_after_s) == (429, 7)
    waiter = asyncio.ensure_future(gate.wait("r"))
    await asyncio.sleep(0.01)
    gate.resume("r")
    await waiter


@pytest.mark.postgres
async def test_a_run_survives_postgres_stopping_in_the_middle(
    stoppable_postgres: PostgresServer, tap: BackendTap, model_dir: Path, tmp_path: Path
) -> None:
    database_url = await stoppable_postgres.create_database()
    port = free_port()
    settings = Settings(
        port=port,
        data_dir=tmp_path,
        database_url=database_url,
        backend_url=tap.url,
        tokenizer_path=model_dir,
        admin_key=ADMIN_KEY,
        context_length=8192,
    )
    try:
        await asyncio.to_thread(drive_through_an_outage, settings, stoppable_postgres)
    finally:
        await stoppable_postgres.drop_database(database_url)


def drive_through_an_outage(settings: Settings, postgres_server: PostgresServer) -> None:
    """Six sessions, two turns each before and two during the outage; every completed
    turn must be recorded exactly once after Postgres returns."""
    headers = {"authorization": f"Bearer {ADMIN_KEY}"}
    with (
        serve(create_app(settings), port=settings.port) as url,
        httpx.Client(base_url=url, headers=headers, timeout=60) as admin,
    ):
        proxy = Proxy(url=url, settings=settings, admin=admin)
        run = new_run(proxy)
        sessions = [new_session(proxy, run, f"g{i // 2}", i % 2) for i in range(6)]
        with ThreadPoolExecutor(6) as pool:
            before = sum(pool.map(lambda s: converse(s, 2), sessions))
            postgres_server.stop()
            try:
                began = time.monotonic()
                during = sum(pool.map(lambda s: converse(s, 2), sessions))
                assert time.monotonic() - began < 30  # inference never waited on it
                metrics = httpx.get(f"{url}/metrics").text
            finally:
                postgres_server.start()
        assert "lego_recorder_spooled_turns_total" in metrics
        waiting = [m for m in metrics.splitlines() if m.startswith("lego_recorder_spool_turns ")]
        assert float(waiting[0].split()[1]) > 0
        for session in sessions:
            turns = proxy.trajectory(session["id"])["turns"]  # flushes the writer first
            assert len(turns) == len({t["id"] for t in turns}) == 4
            assert all(t["status"] == "completed" for t in turns)
        assert before + during == 24


def test_a_paused_run_answers_429_with_retry_after_in_each_wire_shape(
    tap: BackendTap, model_dir: Path, tmp_path: Path
) -> None:
    settings = Settings(
        port=free_port(), data_dir=tmp_path, backend_url=tap.url, tokenizer_path=model_dir,
        admin_key=ADMIN_KEY, pause_max_wait_s=0.2, pause_retry_after_s=3,
    )  # fmt: skip
    with serve(create_app(settings), port=settings.port) as url:
        admin = httpx.Client(base_url=url, headers={"authorization": f"Bearer {ADMIN_KEY}"})
        run = admin.post("/api/v1/runs", json={"name": "paused"}).json()["id"]
        key = admin.post(
            f"/api/v1/runs/{run}/sessions", json={"task_id": "t", "group_id": "g"}
        ).json()["key"]
        admin.post(f"/api/v1/runs/{run}/pause").raise_for_status()
        chat = httpx.post(
            f"{url}/s/{key}/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert chat.status_code == 429
        assert chat.headers["retry-after"] == "3"
        assert chat.json()["error"]["code"] == "overloaded"
        messages = httpx.post(
            f"{url}/s/{key}/v1/messages",
            json={"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
        )
        assert messages.status_code == 429
        assert messages.headers["retry-after"] == "3"
        assert messages.json()["type"] == "error"
        admin.post(f"/api/v1/runs/{run}/resume").raise_for_status()
        ok = httpx.post(
            f"{url}/s/{key}/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            timeout=60,
        )
        assert ok.status_code == 200
