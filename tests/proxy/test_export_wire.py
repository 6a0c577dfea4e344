"""Claims end to end in every wire form: stored turns -> export route on a real uvicorn
server -> ``trainer_bridge`` client, every array bit-exact against the recorded turns."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import httpx
import numpy as np
import pytest
from fastapi import FastAPI

from kernel.errors import BackendUnavailable, RecorderError
from kernel.threaded import serve
from proxy.adapters.openai_chat import OpenAIChatAdapter
from proxy.gate import RunGate
from proxy.metrics import Metrics
from proxy.routes import export
from proxy.settings import Settings
from recorder.export import ExportStore
from recorder.export_wire import MAGIC, MEDIA_TYPE, Segment
from recorder.records import RoutedExperts, SessionSpec, TurnRecord, TurnStatus
from recorder.store import Store
from recorder.trajectory import build_segments
from recorder.writer import TurnWriter
from tests.recorder.builders import make_turn
from trainer_bridge.client import ExportClient

ADMIN_KEY = "wire-admin-key"
LAYERS, TOP_K = 3, 2


def export_app(database_url: str) -> FastAPI:
    """Only the export routes, their stores opened on the server's own event loop."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = await Store.open(database_url)
        exports = ExportStore.open(database_url)
        writer = TurnWriter(store)
        app.state.lego_export = export.ExportState(store, exports, writer, RunGate(), Metrics())
        yield
        await exports.close()
        await store.close()

    app = FastAPI(lifespan=lifespan)
    settings = Settings(admin_key=ADMIN_KEY, database_url=database_url)
    app.include_router(export.build_router(settings, OpenAIChatAdapter().error_response))
    return app


@pytest.fixture
def server(database_url: str) -> Iterator[str]:
    with serve(export_app(database_url)) as url:
        yield url


def routing(rng: np.random.Generator, start: int, end: int, experts: int) -> RoutedExperts:
    rows = rng.integers(0, experts, (end - start, LAYERS, TOP_K), dtype=np.int32)
    rows[0, 0, 0] = experts - 1  # the largest id occurs: it decides the stored dtype
    return RoutedExperts(start=start, rows=rows)


def agent_session(session_id: str, experts: int, seed: int) -> list[TurnRecord]:
    """Three turns continuing each other (linear storage), then a side request (a fork)."""
    rng = np.random.default_rng(seed)
    turns: list[TurnRecord] = []
    prompt = tuple(int(x) for x in rng.integers(0, 150_000, 30))
    for seq in range(3):
        output = tuple(int(x) for x in rng.integers(0, 150_000, 7 + seq))
        parent = turns[-1] if turns else None
        reused = len(parent.prompt_ids) + len(parent.output_ids) if parent else 0
        turn = make_turn(
            session_id,
            seq,
            prompt=prompt,
            output=output,
            logprobs=tuple(float(x) for x in rng.normal(-1.0, 0.7, len(output))),
            routed=routing(rng, max(0, reused - 1), len(prompt) + len(output) - 1, experts),
            weight_version=f"v{seq // 2}",
        )
        if parent is not None:
            turn = dataclasses.replace(
                turn, parent_turn_id=parent.id, classification="extend", reused_prefix_len=reused
            )
        turns.append(turn)
        prompt = prompt + output + tuple(int(x) for x in rng.integers(0, 150_000, 5))
    side_prompt = (*turns[0].prompt_ids[:10], 424_242)
    side = make_turn(
        session_id,
        3,
        prompt=side_prompt,
        output=(9, 8),
        routed=routing(rng, 0, len(side_prompt) + 1, experts),
    )
    cancelled = make_turn(session_id, 4, prompt=(1,), output=(2,), status=TurnStatus.CANCELLED)
    return [*turns, side, cancelled]


async def record_group(database_url: str) -> tuple[str, dict[str, list[Segment]]]:
    """A run with one finished group: uint8 experts, uint16 experts, no completed turn."""
    store = await Store.open(database_url)
    run = await store.create_run(f"wire-{uuid.uuid4().hex[:8]}")
    expected: dict[str, list[Segment]] = {}
    for index, experts in enumerate((128, 4096, None)):
        spec = SessionSpec(run.id, "task", "g", index, "pytest")
        session = await store.create_session(spec)
        if experts is None:
            turns = [make_turn(session.id, 0, status=TurnStatus.FAILED)]
        else:
            turns = agent_session(session.id, experts, seed=index)
        await store.write_turns(turns)
        await store.finish_session(session.id, "completed", float(index), None)
        expected[session.id] = build_segments(turns)
    await store.close()
    return run.id, expected


def assert_same_arrays(got: Segment, want: Segment) -> None:
    assert got.turn_ids == want.turn_ids
    assert got.weight_versions == want.weight_versions
    assert got.weight_version_spans == want.weight_version_spans
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_array_equal(got.loss_mask, want.loss_mask.astype(bool))
    # Recorded as float32: the delivered values are those float32 values, exactly.
    np.testing.assert_array_equal(got.logprobs, want.logprobs.astype(np.float64))
    assert want.routed_experts is not None
    assert got.routed_experts is not None
    np.testing.assert_array_equal(got.routed_experts, want.routed_experts)


@pytest.mark.parametrize("wire", ["json", "b64v1", "binv1"])
async def test_every_wire_form_delivers_the_recorded_arrays(
    server: str, database_url: str, wire: str
) -> None:
    run_id, expected = await record_group(database_url)

    with ExportClient(server, ADMIN_KEY, run_id) as client:
        batch = client.claim(1, None, 60.0, wire_format=wire)

    (group,) = batch.groups
    assert [s.session_id for s in group.samples] == list(expected)
    for sample in group.samples:
        want = expected[sample.session_id]
        assert len(sample.segments) == len(want)
        for got, seg in zip(sample.segments, want, strict=True):
            assert_same_arrays(got, seg)
    main, fork = group.samples[0].segments
    assert len(main.turn_ids) == 3  # three turns, one segment
    assert len(fork.turn_ids) == 1
    assert group.samples[2].segments == ()


async def test_binv1_streams_the_stored_expert_dtypes(server: str, database_url: str) -> None:
    run_id, _ = await record_group(database_url)

    async with httpx.AsyncClient(base_url=server) as client:
        response = await client.post(
            f"/api/v1/runs/{run_id}/claims?format=binv1",
            json={"groups": 1},
            headers={"authorization": f"Bearer {ADMIN_KEY}"},
        )

    assert response.status_code == 200
    assert response.headers["content-type"] == MEDIA_TYPE
    assert response.headers.get("transfer-encoding") == "chunked"  # streamed, not buffered
    assert response.content.startswith(MAGIC)
    # uint8 rows for the first session, uint16 for the second: never widened to int32.
    assert b'"routed_experts":{"dtype":"|u1"' in response.content
    assert b'"routed_experts":{"dtype":"<u2"' in response.content
    assert b'"routed_experts":{"dtype":"<i4"' not in response.content


async def test_a_binv1_claim_that_fails_mid_stream_is_refused_by_the_client(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id, expected = await record_group(database_url)
    second = list(expected)[1]
    app = export_app(database_url)
    with serve(app) as url:
        store = app.state.lego_export.store
        read = store.list_turn_arrays

        async def fails_on_the_second_sample(session_id: str) -> object:
            if session_id == second:
                raise RecorderError("the database went away")
            return await read(session_id)

        monkeypatch.setattr(store, "list_turn_arrays", fails_on_the_second_sample)
        # The first sample is on the wire by then: the connection ends early instead.
        with (
            ExportClient(url, ADMIN_KEY, run_id) as client,
            pytest.raises(BackendUnavailable, match="incomplete"),
        ):
            client.claim(1, None, 60.0, wire_format="binv1")
