"""Linear storage: a continuing turn stores only its new tokens; reads rebuild them exactly."""

from __future__ import annotations

import dataclasses
import random
import uuid

import numpy as np
import pytest

from kernel.errors import RecorderError
from recorder.records import RoutedExperts, SessionSpec, TurnRecord, TurnStatus
from recorder.store import Store
from recorder.trajectory import build_segments
from tests.recorder.builders import make_turn

LAYERS, TOP_K = 4, 2


async def new_session(store: Store) -> str:
    run = await store.create_run(f"run-{uuid.uuid4().hex[:8]}")
    spec = SessionSpec(run_id=run.id, task_id="t", group_id="g", sample_index=0, harness="h")
    return (await store.create_session(spec)).id


def conversation(
    session_id: str, turns: int, seed: int = 0, experts: int = 128
) -> list[TurnRecord]:
    """An agent loop: each turn's prompt is the previous prompt + output + a tool result.

    Routed expert ids are drawn from ``range(experts)``, the largest included."""
    rng = random.Random(seed)
    records: list[TurnRecord] = []
    history: tuple[int, ...] = tuple(rng.randrange(150_000) for _ in range(40))
    parent: TurnRecord | None = None
    for seq in range(turns):
        output = tuple(rng.randrange(150_000) for _ in range(rng.randint(5, 30)))
        # The ids shared with the parent: its whole prompt + output.
        reused = len(parent.prompt_ids) + len(parent.output_ids) if parent else 0
        start = max(0, reused - 1)
        rows = np.asarray(
            [[[rng.randrange(experts) for _ in range(TOP_K)] for _ in range(LAYERS)]]
            * (len(history) + len(output) - start),
            dtype=np.int32,
        )
        rows[:, 0, 0] = experts - 1  # the largest id occurs: it decides the stored dtype
        turn = make_turn(
            session_id,
            seq,
            prompt=history,
            output=output,
            logprobs=tuple(-rng.random() * 5 for _ in output),
            routed=RoutedExperts(start=start, rows=rows),
        )
        if parent is not None:
            turn = dataclasses.replace(
                turn, parent_turn_id=parent.id, classification="extend", reused_prefix_len=reused
            )
        records.append(turn)
        parent = turn
        tool_result = tuple(rng.randrange(150_000) for _ in range(rng.randint(10, 60)))
        history = history + output + tool_result
    return records


async def test_a_long_session_stores_bytes_linear_in_its_new_tokens(store: Store) -> None:
    session_id = await new_session(store)
    records = conversation(session_id, 50)
    await store.write_turns(records)

    new_tokens = sum(len(t.prompt_ids) - t.reused_prefix_len + len(t.output_ids) for t in records)
    rows = sum(t.routed_experts.num_rows for t in records if t.routed_experts)
    # ids int32 + logprobs float32 (outputs only) + one uint8 routing row per new token.
    expected = 4 * new_tokens + 4 * sum(len(t.output_ids) for t in records) + rows * LAYERS * TOP_K
    stored = await store.storage_bytes(session_id)
    assert stored == expected
    quadratic = sum(4 * len(t.prompt_ids) for t in records)
    assert stored < quadratic / 5  # re-storing each prompt would be turns x context


async def test_every_array_round_trips_bit_exact_through_the_parent_chain(store: Store) -> None:
    session_id = await new_session(store)
    records = conversation(session_id, 12, seed=7)
    # Out of order and in separate batches: the chain is resolved at read time.
    await store.write_turns(records[6:])
    await store.write_turns(records[:6])

    got = await store.list_turns(session_id)
    assert [t.id for t in got] == [t.id for t in records]
    for want, have in zip(records, got, strict=True):
        assert have.prompt_ids == want.prompt_ids
        assert have.output_ids == want.output_ids
        assert np.array_equal(
            np.asarray(have.logprobs, dtype=np.float32), np.asarray(want.logprobs, np.float32)
        )
        assert have.routed_experts is not None
        assert want.routed_experts is not None
        assert have.routed_experts.start == want.routed_experts.start
        assert np.array_equal(have.routed_experts.rows, want.routed_experts.rows)
        assert have.reused_prefix_len == want.reused_prefix_len


@pytest.mark.parametrize(
    ("experts", "stored"), [(128, np.uint8), (4096, np.uint16), (100_000, np.int32)]
)
async def test_turn_arrays_are_the_stored_turns_with_routing_in_its_stored_dtype(
    store: Store, experts: int, stored: type[np.integer]
) -> None:
    session_id = await new_session(store)
    records = conversation(session_id, 6, seed=3, experts=experts)
    failed = dataclasses.replace(
        make_turn(session_id, 6, prompt=(5, 6)), status=TurnStatus.FAILED, weight_version="v9"
    )
    await store.write_turns([*records, failed])

    arrays = await store.list_turn_arrays(session_id)
    turns = await store.list_turns(session_id)

    assert [a.id for a in arrays] == [t.id for t in turns] == [*(r.id for r in records), failed.id]
    assert arrays[-1].status is TurnStatus.FAILED
    for have, want in zip(arrays[:-1], turns, strict=False):
        assert (have.seq, have.weight_version) == (want.seq, want.weight_version)
        assert have.prompt_ids.tolist() == list(want.prompt_ids)
        assert have.output_ids.tolist() == list(want.output_ids)
        assert have.logprobs.dtype == np.float32
        assert have.logprobs.astype(np.float64).tolist() == list(want.logprobs)
        assert want.routed_experts is not None
        assert have.routed_rows is not None
        assert have.routed_rows.dtype == stored  # as stored: never widened on the way out
        assert have.routed_start == want.routed_experts.start
        np.testing.assert_array_equal(have.routed_rows, want.routed_experts.rows)
    # One segment of all six turns, identical whichever way it was read.
    [fast] = build_segments(arrays)
    [slow] = build_segments(turns)
    assert fast.turn_ids == slow.turn_ids == tuple(r.id for r in records)
    for key in ("tokens", "loss_mask", "logprobs", "routed_experts"):
        np.testing.assert_array_equal(getattr(fast, key), getattr(slow, key))
    assert fast.routed_experts is not None
    assert fast.routed_experts.dtype == stored


async def test_weight_version_spans_round_trip(store: Store) -> None:
    session_id = await new_session(store)
    turn = dataclasses.replace(
        make_turn(session_id, 0, output=(1, 2, 3, 4)),
        weight_version="v2",
        weight_version_spans=(("v1", 0, 3), ("v2", 3, 4)),
    )
    await store.write_turns([turn])
    (got,) = await store.list_turns(session_id)
    assert got.weight_version_spans == (("v1", 0, 3), ("v2", 3, 4))


async def test_a_parent_outside_the_session_is_an_error(store: Store) -> None:
    session_id = await new_session(store)
    orphan = dataclasses.replace(
        make_turn(session_id, 0, prompt=(1, 2, 3, 4)),
        parent_turn_id="missing",
        reused_prefix_len=2,
    )
    await store.write_turns([orphan])
    with pytest.raises(RecorderError, match="not recorded"):
        await store.list_turns(session_id)
