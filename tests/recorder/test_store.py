"""Store: runs, sessions and turns on SQLite and a real Postgres."""

from __future__ import annotations

import socket
import uuid
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import func, select

from kernel.errors import Conflict, InvalidRequest, NotFound, RecorderError
from recorder.export import ExportStore
from recorder.per_turn import OverSqlAlchemy
from recorder.records import (
    DefenseEvent,
    PauseState,
    SessionInfo,
    SessionSpec,
    SessionStatus,
    StageTimes,
    TurnRecord,
)
from recorder.rows import StoredTurn, encode_turn
from recorder.schema import turns
from recorder.store import Store
from tests.recorder.builders import experts, make_turn, rich_turn


async def new_session(store: Store) -> SessionInfo:
    run = await store.create_run(f"run-{uuid.uuid4().hex[:8]}")
    spec = SessionSpec(
        run_id=run.id, task_id="task-1", group_id="g-1", sample_index=0, harness="claude-code"
    )
    return await store.create_session(spec)


def assert_same_turn(got: TurnRecord, want: TurnRecord) -> None:
    for name in TurnRecord.__slots__:
        if name in ("logprobs", "routed_experts"):
            continue
        assert getattr(got, name) == getattr(want, name), name
    expected_logprobs = tuple(float(np.float32(x)) for x in want.logprobs)
    assert got.logprobs == expected_logprobs
    if want.routed_experts is None:
        assert got.routed_experts is None
    else:
        assert got.routed_experts is not None
        assert got.routed_experts.start == want.routed_experts.start
        assert got.routed_experts.rows.dtype == np.int32
        np.testing.assert_array_equal(got.routed_experts.rows, want.routed_experts.rows)
        assert got.routed_experts.rows.shape == want.routed_experts.rows.shape


# -- runs ---------------------------------------------------------------------------------


async def test_run_round_trip_and_errors(store: Store) -> None:
    run = await store.create_run("grpo-1")
    assert len(run.id) == 32
    assert await store.get_run(run.id) == run
    with pytest.raises(NotFound):
        await store.get_run("nope")
    with pytest.raises(Conflict, match="taken"):
        await store.create_run("grpo-1")


# -- sessions -----------------------------------------------------------------------------


async def test_session_round_trip(store: Store) -> None:
    run = await store.create_run("r")
    spec = SessionSpec(
        run_id=run.id,
        task_id="swe-123",
        group_id="grp-7",
        sample_index=3,
        harness="opencode",
        sampling={"temperature": 1.0, "top_p": 0.9, "stop": ["x"]},
        max_prompt_tokens=30_000,
        max_output_tokens=2_000,
    )

    created = await store.create_session(spec)

    assert created.key.startswith("lego-sk-")
    assert len(created.key) > 30
    assert len(created.id) == 32
    assert created.status is SessionStatus.ACTIVE
    assert created.turn_count == 0
    assert await store.get_session(created.id) == created
    assert await store.get_session_by_key(created.key) == created
    assert await store.get_session_by_key("lego-sk-unknown") is None
    other = await store.create_session(spec)
    assert other.key != created.key
    assert other.id != created.id


async def test_session_errors(store: Store) -> None:
    spec = SessionSpec(run_id="missing", task_id="t", group_id="g", sample_index=0, harness="h")
    with pytest.raises(NotFound, match="run"):
        await store.create_session(spec)
    with pytest.raises(NotFound):
        await store.get_session("missing")
    with pytest.raises(NotFound):
        await store.finish_session("missing", "done", 1.0, None)


async def test_finish_session_once(store: Store) -> None:
    session = await new_session(store)

    finished = await store.finish_session(session.id, "completed", 0.75, {"tests": [1, 0, 1]})

    assert finished.status is SessionStatus.FINISHED
    assert (finished.termination, finished.reward) == ("completed", 0.75)
    assert finished.reward_details == {"tests": [1, 0, 1]}
    assert await store.get_session(session.id) == finished
    with pytest.raises(Conflict, match="already finished"):
        await store.finish_session(session.id, "completed", 1.0, None)
    assert (await store.get_session(session.id)).reward == 0.75


async def test_finish_keeps_the_trial_report_and_every_read_gives_it_back(store: Store) -> None:
    session = await new_session(store)
    stages = StageTimes(sandbox_setup=1.5, agent_setup=0.25, agent_execution=40.0, verification=3.0)
    events = (
        DefenseEvent("test_path_reverted", {"path": "tests/test_calc.py", "bytes": 120}),
        DefenseEvent("test_file_removed", {"path": "tests/test_new.py"}),
        DefenseEvent("history_hidden", {"refs": ["refs/heads/fix"], "nested": {"n": 1.5}}),
    )

    finished = await store.finish_session(
        session.id, "completed", 1.0, None, stages=stages, defense_events=events
    )

    assert (finished.stages, finished.defense_events) == (stages, events)
    assert await store.get_session(session.id) == finished
    (listed,) = await store.list_sessions(session.spec.run_id)
    assert (listed.stages, listed.defense_events) == (stages, events)


async def test_a_finish_without_a_report_reads_back_none(store: Store) -> None:
    session = await new_session(store)
    finished = await store.finish_session(session.id, "harness_error", None, None)
    assert (finished.stages, finished.defense_events) == (None, ())
    assert (await store.get_session(session.id)).stages is None


async def test_failed_environment_keeps_a_null_reward(store: Store) -> None:
    session = await new_session(store)
    finished = await store.finish_session(session.id, "env_error", None, None)
    assert finished.reward is None
    assert finished.reward_details is None
    assert finished.termination == "env_error"


# -- turns --------------------------------------------------------------------------------


async def test_turns_round_trip_exactly_in_seq_order(store: Store) -> None:
    session = await new_session(store)
    small = experts(0, [[[0, 255], [17, 3]], [[1, 2], [3, 4]], [[9, 8], [7, 6]]])
    large = experts(4, [[[256, 1], [65_535, 0]], [[300, 2], [5, 4]]])
    written = [
        rich_turn(session.id, 2, large),
        make_turn(session.id, 0, routed=small, logprobs=(-0.1, -1e-9)),
        make_turn(session.id, 1, prompt=(), output=(), logprobs=()),
        rich_turn(session.id, 3, experts(0, [[[-1, 70_000]]])),
    ]

    await store.write_turns(written)
    got = await store.list_turns(session.id)

    assert [t.seq for t in got] == [0, 1, 2, 3]
    for turn in got:
        assert_same_turn(turn, next(w for w in written if w.id == turn.id))
    assert (await store.get_session(session.id)).turn_count == 4
    assert await store.list_turns("other-session") == []


async def test_routed_experts_use_the_smallest_dtype(store: Store) -> None:
    session = await new_session(store)
    byte_ids = experts(0, [[[0, 255]], [[7, 8]]])  # 2 rows x 1 layer x 2 experts
    wide_ids = experts(0, [[[0, 256]], [[7, 8]]])
    await store.write_turns(
        [make_turn(session.id, 0, routed=byte_ids), make_turn(session.id, 1, routed=wide_ids)]
    )

    async with store.engine.connect() as conn:
        stored = (
            await conn.execute(
                select(turns.c.seq, turns.c.routed_experts_dtype, turns.c.routed_experts)
                .where(turns.c.session_id == session.id)
                .order_by(turns.c.seq)
            )
        ).all()

    assert [(row[1], len(row[2])) for row in stored] == [("uint8", 4), ("uint16", 8)]
    got = await store.list_turns(session.id)
    assert got[1].routed_experts is not None
    np.testing.assert_array_equal(got[1].routed_experts.rows, wide_ids.rows)


async def test_write_turns_is_idempotent_by_id(store: Store) -> None:
    session = await new_session(store)
    first = make_turn(session.id, 0)
    second = make_turn(session.id, 1)
    await store.write_turns([first])

    await store.write_turns([first, second, second])
    # Same id, different content: the recorded turn is not overwritten.
    await store.write_turns([make_turn(session.id, 0, output=(9,), turn_id=first.id)])

    got = await store.list_turns(session.id)
    assert [t.id for t in got] == [first.id, second.id]
    assert got[0].output_ids == first.output_ids
    async with store.engine.connect() as conn:
        assert await conn.scalar(select(func.count()).select_from(turns)) == 2


async def test_unstorable_turns_are_refused_and_nothing_is_written(store: Store) -> None:
    session = await new_session(store)
    await store.write_turns([make_turn(session.id, 0)])

    with pytest.raises(Conflict):  # unknown session
        await store.write_turns([make_turn("no-such-session", 0)])
    with pytest.raises(InvalidRequest, match="int32"):
        await store.write_turns([make_turn(session.id, 2, prompt=(2**31,))])

    assert [t.seq for t in await store.list_turns(session.id)] == [0]


async def test_replicas_stamping_the_same_seq_lose_no_turn(store: Store) -> None:
    """seq is an arrival time each replica stamps on its own; a clash is not an error."""
    session = await new_session(store)
    first, second = make_turn(session.id, 5), make_turn(session.id, 5)
    await store.write_turns([first])
    await store.write_turns([second])
    stored = await store.list_turns(session.id)
    assert sorted(t.id for t in stored) == sorted([first.id, second.id])
    assert await store.count_completed_turns(session.id) == 2


# -- failures -----------------------------------------------------------------------------


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_unreachable_database_raises_recorder_error() -> None:
    store = await Store.open(f"postgresql+asyncpg://nobody@127.0.0.1:{closed_port()}/none")
    try:
        with pytest.raises(RecorderError, match="create run"):
            await store.create_run("r")
        with pytest.raises(RecorderError):
            await store.get_session_by_key("k")
        with pytest.raises(RecorderError):
            await store.write_turns([make_turn("s", 0)])
    finally:
        await store.close()


async def test_unmigrated_database_raises_recorder_error(tmp_path: Path) -> None:
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'empty.sqlite3'}")
    try:
        with pytest.raises(RecorderError, match="database error"):
            await store.get_run("r")
    finally:
        await store.close()


async def test_a_turn_naming_side_requests_re_labels_their_rows_as_it_is_written(
    store: Store,
) -> None:
    """The write half of the re-label rule (the read half is ``recorder.rows``'s, tested in
    ``test_rows``): the named roots' own columns change in the naming turn's transaction."""
    session = await new_session(store)
    title, other_root = make_turn(session.id, 0), make_turn(session.id, 1, prompt=(9,))
    main = replace(make_turn(session.id, 2, prompt=(7, 8)), side_requests=(title.id,))
    stray = replace(make_turn(session.id, 3, prompt=(6,)), side_requests=("not-recorded",))

    await store.write_turns([title, other_root])
    await store.write_turns([main, stray])
    async with store.engine.connect() as conn:
        columns = (
            await conn.execute(
                select(turns.c.id, turns.c.classification, turns.c.fork_reason)
                .where(turns.c.session_id == session.id)
                .order_by(turns.c.seq)
            )
        ).all()
    assert [tuple(row) for row in columns] == [
        (title.id, "fork", "side_request"),
        (other_root.id, "root", None),
        (main.id, "root", None),
        (stray.id, "root", None),
    ]


async def test_rows_spooled_before_side_requests_existed_still_write(store: Store) -> None:
    session = await new_session(store)
    stored = encode_turn(make_turn(session.id, 0))
    old = StoredTurn(stored.id, {k: v for k, v in stored.row.items() if k != "side_requests"})
    await store.write_rows([old])
    [got] = await store.list_turns(session.id)
    assert (got.id, got.side_requests) == (stored.id, ())


async def test_the_pause_state_is_the_paused_runs_and_the_exclusions_read_together(
    database_url: str, store: Store
) -> None:
    """What every replica polls, on the per-turn path: both lists as the export store's own
    reads give them, and as the same statement gives them through SQLAlchemy."""
    exports = ExportStore.open(database_url)
    over_sqlalchemy = OverSqlAlchemy(store.engine, sqlite_dialect=database_url.startswith("sqlite"))
    try:
        paused = (await store.create_run("paused")).id
        await store.create_run("running")
        assert await store.pause_state() == PauseState(frozenset(), {})
        await exports.set_paused(paused, True)
        await exports.set_worker_exclusions({"http://w1/": "sync failed", "http://w2": "x"}, [])
        state = await store.pause_state()
        assert state.paused_runs == {paused} == await exports.paused_runs()
        exclusions = {"http://w1": "sync failed", "http://w2": "x"}
        assert dict(state.worker_exclusions) == exclusions == await exports.worker_exclusions()
        assert await over_sqlalchemy.pause_state("read") == state
        await exports.set_paused(paused, False)
        await exports.set_worker_exclusions({}, ["http://w1", "http://w2"])
        assert await store.pause_state() == PauseState(frozenset(), {})
        assert await over_sqlalchemy.pause_state("read") == PauseState(frozenset(), {})
    finally:
        await exports.close()
