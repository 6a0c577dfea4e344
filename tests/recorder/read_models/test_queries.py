"""The read models against seeded runs on SQLite and Postgres: numbers, sorting, paging,
the constant statement count on a 1,000-session run, validation sessions kept apart from
the training numbers, the session tree with its turns numbered and an edited-history
fork's diff, and rewards as the recorder reads them (a vector too)."""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import event

from kernel.errors import InvalidRequest, NotFound
from proxy.canonical import Message
from recorder.read_models.epochs import load_epochs
from recorder.read_models.overview import load_overview
from recorder.read_models.session_view import load_session
from recorder.read_models.steps import load_steps
from recorder.read_models.tables import (
    SessionFilter,
    load_runs,
    load_session_choices,
    load_sessions,
    load_tasks,
)
from recorder.store import Store
from tests.proxy.test_conversations import (
    SYSTEM,
    USER,
    Harness,
    answer,
    new_session,
    request,
    result,
)
from tests.recorder.read_models.seed import (
    EDITED_SUFFIX,
    FORK_ADDED,
    FORK_EDIT,
    FORK_SHARED,
    SeededRun,
    SeededSession,
    seed_run,
)


@contextmanager
def count_statements(store: Store) -> Iterator[list[str]]:
    seen: list[str] = []

    def on_execute(*args: Any) -> None:
        seen.append(str(args[2]))

    engine = store.engine.sync_engine
    event.listen(engine, "before_cursor_execute", on_execute)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", on_execute)


def mixed_plan(v: int, n: int) -> tuple[str | None, float | None, int, int, int]:
    """Deterministic mix: solves, failures, an excluded env failure, an active session."""
    if n % 7 == 6:
        return ("env_setup_failure", None, 1, 5, 0)
    if n % 11 == 10:
        return (None, None, 2, 5, 0)
    solved = (n + v) % 3 == 0
    return ("completed", 1.0 if solved else 0.0, 1 + n % 4, 10 + 5 * v + n % 3, n % 5 == 0)


async def seed_mixed(url: str, versions: int = 3, groups: int = 4) -> SeededRun:
    return await seed_run(
        url,
        versions=versions,
        groups_per_version=groups,
        group_size=4,
        plan=mixed_plan,
        tasks=3,
        epoch_groups=True,
        stages=lambda v, n: {"sandbox_setup": 1.0 + n, "agent_execution": 10.0 * (v + 1)},
        fork=lambda v, n: n == 1,
    )


async def test_overview_matches_an_independent_count(database_url: str, store: Store) -> None:
    run = await seed_mixed(database_url)
    overview = await load_overview(store, run.id)

    assert [v.version for v in overview.versions] == list(run.versions)
    assert overview.sessions == len(run.sessions)
    assert overview.active == sum(s.termination is None for s in run.sessions)
    for stats in overview.versions:
        mine = [s for s in run.sessions if s.version == stats.version]
        graded = [s for s in mine if s.termination == "completed"]
        assert stats.sessions == len(mine)
        assert stats.graded == len(graded)
        assert stats.mean_reward == pytest.approx(statistics.mean(s.reward or 0 for s in graded))
        assert stats.solve_rate == pytest.approx(sum(s.reward == 1.0 for s in graded) / len(graded))
        assert stats.turns_per_trajectory == pytest.approx(statistics.mean(s.turns for s in mine))
        assert stats.response_tokens == pytest.approx(
            statistics.mean(s.turns * s.output_tokens for s in mine)
        )
        assert stats.malformed_per_turn == pytest.approx(
            sum(s.malformed for s in mine) / sum(s.turns for s in mine)
        )
        reasons: dict[str, int] = defaultdict(int)
        for s in mine:
            reasons[s.termination or "active"] += 1
        assert dict(stats.terminations) == reasons
        by_group: dict[str, list[float]] = defaultdict(list)
        for s in graded:
            by_group[s.group_id].append(s.reward or 0.0)
        groups = [r for r in by_group.values() if len(r) >= 2]
        assert stats.groups == len(groups)
        assert stats.all_failed_groups == sum(all(x < 1 for x in r) for r in groups)
        assert stats.all_solved_groups == sum(all(x >= 1 for x in r) for r in groups)


async def test_unknown_run_and_bad_arguments_raise(store: Store) -> None:
    with pytest.raises(NotFound):
        await load_overview(store, "nope")
    with pytest.raises(NotFound):
        await load_tasks(store, "nope")
    with pytest.raises(NotFound):
        await load_session(store, "nope")


async def test_tasks_compare_first_and_latest_version_and_sort(
    database_url: str, store: Store
) -> None:
    run = await seed_mixed(database_url)
    expected: dict[str, tuple[float, float]] = {}
    for task in {s.task_id for s in run.sessions}:
        graded = [s for s in run.sessions if s.task_id == task and s.termination == "completed"]
        first = min(s.version for s in graded)
        latest = max(s.version for s in graded)

        def rate(version: str, graded: list[SeededSession] = graded) -> float:
            at = [s for s in graded if s.version == version]
            return sum(s.reward == 1.0 for s in at) / len(at)

        expected[task] = (rate(first), rate(latest))

    page = await load_tasks(store, run.id, "task")
    assert [t.task_id for t in page.rows] == sorted(expected)
    for row in page.rows:
        assert (row.first_rate, row.latest_rate) == pytest.approx(expected[row.task_id])
        assert row.first_version == run.versions[0]
        assert row.latest_version == run.versions[-1]

    by_change = await load_tasks(store, run.id, "-change")
    changes = [t.change for t in by_change.rows]
    assert None not in changes  # every seeded task was graded at two versions
    assert changes == sorted((c for c in changes if c is not None), reverse=True)
    with pytest.raises(InvalidRequest):
        await load_tasks(store, run.id, "reward; drop table runs")


async def test_sessions_and_runs_paginate_in_sql(database_url: str, store: Store) -> None:
    run = await seed_mixed(database_url)
    first = await load_sessions(store, run.id, page=1, size=20)
    second = await load_sessions(store, run.id, page=2, size=20)
    assert first.total == len(run.sessions) == 48
    assert first.pages == 3
    assert len(first.rows) == 20
    assert not {r.id for r in first.rows} & {r.id for r in second.rows}
    runs = await load_runs(store)
    assert any(r.id == run.id and r.sessions == 48 for r in runs.rows)


async def test_a_thousand_session_run_costs_the_same_statements_as_a_small_one(
    database_url: str, store: Store
) -> None:
    small = await seed_mixed(database_url, versions=2, groups=2)
    big = await seed_mixed(database_url, versions=10, groups=25)
    assert len(big.sessions) == 1000
    counts = []
    for run in (small, big):
        with count_statements(store) as statements:
            started = time.perf_counter()
            overview = await load_overview(store, run.id)
            tasks = await load_tasks(store, run.id, "-latest")
            sessions = await load_sessions(store, run.id, page=3)
            steps = await load_steps(store, run.id)
            epochs = await load_epochs(store, run.id)
            forked = SessionFilter(fork="edited_history", excluded=False)
            await load_sessions(store, run.id, wanted=forked, sort="-reward")
            await load_session_choices(store, run.id)
            elapsed = time.perf_counter() - started
        counts.append(len(statements))
        assert overview.run_name == run.name
        assert tasks.rows
        assert sessions.total == len(run.sessions)
        assert steps.whole_run.timed == len(run.sessions)
        assert epochs.epochs
    assert counts[0] == counts[1]
    assert elapsed < 2.0  # generous: it takes a few tens of milliseconds


async def test_session_view_is_the_tree_with_new_messages_and_tokens(
    database_url: str, store: Store
) -> None:
    run = await seed_run(
        database_url,
        versions=1,
        groups_per_version=1,
        group_size=1,
        plan=lambda v, n: ("completed", 1.0, 3, 4, 1),
    )
    view = await load_session(store, run.sessions[0].id)
    assert [t.seq for t in view.turns] == [0, 1, 2]
    assert [t.depth for t in view.turns] == [0, 1, 2]
    assert [t.classification for t in view.turns] == ["root", "extend", "extend"]
    # The root shows its whole conversation; a continuation only the tool result it added.
    assert [m.role for m in view.turns[0].new_messages] == ["user"]
    assert [(m.role, m.content) for m in view.turns[2].new_messages] == [("tool", "result 1")]
    assert view.turns[2].reply.tool_calls == (("bash", "{}"),)
    # Sampled ids, not text: decoding them is the renderer's, with the served tokenizer.
    assert [t.token_id for t in view.turns[0].tokens] == [100, 101, 102, 103]
    assert view.turns[0].tokens[1].logprob == pytest.approx(-1.01)
    assert view.turns[2].malformed_tool_calls == 1
    assert view.turns[0].prompt_tokens == 3
    assert view.reward == 1.0


async def test_session_view_rebuilds_requests_stored_linearly(store: Store) -> None:
    """Turns recorded as the pipeline records them: the page shows what each one added."""
    session = await new_session(store)
    h = Harness(session)
    first, second = answer(0), answer(1)
    root = h.turn(request(SYSTEM, USER), first)
    extend = h.turn(request(SYSTEM, USER, first, result(0)), second, root)
    resent = dataclasses.replace(second, reasoning=None)  # re-serialized by the harness
    h.turn(request(SYSTEM, USER, first, result(0), resent, result(1)), first, extend)
    fork = h.turn(request(SYSTEM, Message(role="user", content="Summary.")), second, extend)
    await store.write_turns(h.records)
    assert [r.messages_inherited for r in h.records] == [None, 3, 4, 1]
    view = await load_session(store, session)
    shown = {
        t.id: [(m.role, m.content[:3], m.reasoning) for m in t.new_messages] for t in view.turns
    }
    assert [t.id for t in view.turns] == [r.id for r in h.records]
    assert shown[root.id] == [("system", "You", None), ("user", "Fix", None)]
    assert shown[extend.id] == [("tool", "[0]", None)]
    assert shown[h.records[2].id] == [("tool", "[1]", None)]  # as before: after the reply
    # A fork repeats fewer messages than its parent's conversation holds: nothing is new past it.
    assert shown[fork.id] == []
    assert view.turns[3].depth == 2


async def test_a_vector_reward_shows_as_the_vector_and_stays_out_of_the_aggregates(
    store: Store,
) -> None:
    """The session page and the sessions table read rewards with the recorder's one rule
    (``reward_vector`` wins); the aggregates are scalar-only."""
    session = await new_session(store)
    await store.finish_session(session, "completed", (1.0, 0.0), None)
    run_id = (await store.get_session(session)).spec.run_id

    assert (await load_session(store, session)).reward == (1.0, 0.0)
    [row] = (await load_sessions(store, run_id)).rows
    assert row.reward == (1.0, 0.0)
    [stats] = (await load_overview(store, run_id)).versions
    assert (stats.graded, stats.mean_reward, stats.solve_rate) == (1, None, 0.0)


async def test_validation_sessions_stay_out_of_the_training_numbers(
    database_url: str, store: Store
) -> None:
    """Validation rewards are the validation curve, never the train reward; the alignment
    reports come with the trainer's reasons for a flagged step."""
    run = await seed_run(
        database_url,
        versions=3,
        groups_per_version=1,
        group_size=4,
        plan=lambda v, n: ("completed", float(n < v + 1), 2, 5, 0),  # 1/4, 2/4, 3/4 solved
        # Validation at versions 0 and 2 only (every other step); one still running.
        validation=lambda v: (
            []
            if v == 1
            else [("completed", 1.0), ("completed", 1.0)] + ([(None, None)] if v == 2 else [])
        ),
        alignment=[{"pearson_r": 0.9993, "entropy": 0.13}, {"pearson_r": 0.97, "entropy": 0.2}],
        flagged={1: ["pearson_r 0.97 < 0.99", "k3_kl 0.02 > 0.01"]},
    )
    overview = await load_overview(store, run.id)
    assert [v.mean_reward for v in overview.versions] == [0.25, 0.5, 0.75]
    assert [v.sessions for v in overview.versions] == [4, 4, 4]
    assert [(v.version, v.sessions, v.graded, v.mean_reward) for v in overview.validation] == [
        ("v000", 2, 2, 1.0),
        ("v002", 3, 2, 1.0),
    ]
    assert overview.sessions == 12 + 5
    assert overview.validation_sessions == 5
    assert overview.active == 1  # the running validation session
    assert overview.curve_versions() == ["v000", "v001", "v002"]
    assert [(p.step, p.flagged, p.reasons) for p in overview.alignment] == [
        (0, False, ()),
        (1, True, ("pearson_r 0.97 < 0.99", "k3_kl 0.02 > 0.01")),
    ]
    # The tasks' solve rates are training ones too: no held-out task appears.
    tasks = await load_tasks(store, run.id)
    assert {t.task_id for t in tasks.rows} == {"task-0"}


async def test_turns_are_numbered_by_arrival_and_a_fork_shows_its_edit(
    database_url: str, store: Store
) -> None:
    run = await seed_run(
        database_url,
        versions=1,
        groups_per_version=1,
        group_size=1,
        plan=lambda v, n: ("completed", 1.0, 3, 4, 0),
        fork=lambda v, n: True,
    )
    [seeded] = run.sessions
    view = await load_session(store, seeded.id)
    assert [t.id for t in view.turns] == list(seeded.turn_ids)
    assert [t.number for t in view.turns] == [1, 2, 3, 4]
    assert [t.parent_number for t in view.turns] == [None, 1, 2, 3]
    root, _, parent, fork = view.turns
    assert (fork.classification, fork.fork_reason, fork.depth) == ("fork", "edited_history", 3)
    assert root.edit is None
    assert parent.edit is None
    edit = fork.edit
    assert edit is not None
    assert edit.parent_turn_id == parent.id
    # The parent saw the task and two exchanges (five messages), then answered; the fork
    # edited the task message, kept the exchanges and the answer, added its tool result.
    kinds = [(s.kind, len(s.before), len(s.after)) for s in edit.messages]
    assert kinds == [("changed", 1, 1), ("same", 5, 5), ("added", 0, 1)]
    changed = edit.messages[0]
    assert changed.before[0].content == "solve task-0"
    assert changed.after[0].content == "solve task-0" + EDITED_SUFFIX
    assert [(m.role, m.content) for m in edit.messages[-1].after] == [("tool", "result 2")]
    assert edit.changed_messages == 1
    # Tokens: the parent's prompt 1 2 3 then its four sampled ids, against the fork's.
    sampled = tuple(range(100, 104))
    assert edit.shared_tokens == FORK_SHARED
    assert edit.parent_tokens == 3 + 4
    assert edit.fork_tokens == FORK_SHARED + len(FORK_EDIT) + 4 + len(FORK_ADDED)
    assert [(s.kind, s.start, s.ids) for s in edit.tokens] == [
        ("removed", 2, (3,)),
        ("added", 2, FORK_EDIT),
        ("same", 3, sampled),
        ("added", 3 + 4, FORK_ADDED),
    ]
