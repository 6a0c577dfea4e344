"""The sessions list filtered and sorted in SQL: each filter against the seeded sessions
picked out by hand, filters combined, sorts with their ties, and the filters' choices."""

from __future__ import annotations

import pytest

from kernel.errors import InvalidRequest, NotFound
from recorder.read_models.tables import (
    FORK_ANY,
    FORK_NONE,
    SessionFilter,
    load_session_choices,
    load_sessions,
)
from recorder.store import Store
from tests.recorder.read_models.seed import Outcome, SeededRun, seed_run


def plan(v: int, n: int) -> Outcome:
    if n == 5:
        return ("env_setup_failure", None, 1, 4, 0)
    if n == 6:
        return (None, None, 2, 4, 0)  # still running
    return ("completed", [0.0, 0.5, 1.0][n % 3], 1 + n % 3, 4, 0)


async def seeded(url: str) -> SeededRun:
    return await seed_run(
        url,
        versions=2,
        groups_per_version=2,
        group_size=4,
        plan=plan,
        tasks=2,
        fork=lambda v, n: n in (1, 2),
        validation=lambda v: [("completed", 1.0)],
    )


async def ids(store: Store, run: SeededRun, wanted: SessionFilter, sort: str = "task") -> set[str]:
    page = await load_sessions(store, run.id, wanted=wanted, sort=sort, size=100)
    assert page.total == len(page.rows)
    return {r.id for r in page.rows}


async def test_each_filter_picks_what_it_says(database_url: str, store: Store) -> None:
    run = await seeded(database_url)
    every = {s.id: s for s in run.sessions}
    assert len(every) == 18  # 2 versions x 2 groups x 4, and one validation session each

    def pick(predicate: object) -> set[str]:
        assert callable(predicate)
        return {i for i, s in every.items() if predicate(s)}

    assert await ids(store, run, SessionFilter()) == set(every)
    assert await ids(store, run, SessionFilter(task="task-1")) == pick(
        lambda s: s.task_id == "task-1"
    )
    assert await ids(store, run, SessionFilter(termination="env_setup_failure")) == pick(
        lambda s: s.termination == "env_setup_failure"
    )
    assert await ids(store, run, SessionFilter(termination="active")) == pick(
        lambda s: s.termination is None
    )
    assert await ids(store, run, SessionFilter(purpose="validation")) == pick(
        lambda s: s.purpose == "validation"
    )
    assert await ids(store, run, SessionFilter(excluded=True)) == pick(
        lambda s: s.termination == "env_setup_failure"
    )
    assert await ids(store, run, SessionFilter(excluded=False)) == pick(
        lambda s: s.termination != "env_setup_failure"
    )
    forked = pick(lambda s: s.forked)
    assert len(forked) == 4
    assert await ids(store, run, SessionFilter(fork=FORK_ANY)) == forked
    assert await ids(store, run, SessionFilter(fork="edited_history")) == forked
    assert await ids(store, run, SessionFilter(fork="compaction")) == set()
    assert await ids(store, run, SessionFilter(fork=FORK_NONE)) == set(every) - forked
    assert await ids(store, run, SessionFilter(min_reward=0.5)) == pick(
        lambda s: s.reward is not None and s.reward >= 0.5
    )
    assert await ids(store, run, SessionFilter(min_reward=0.1, max_reward=0.9)) == pick(
        lambda s: s.reward == 0.5
    )
    both = SessionFilter(task="task-0", purpose="train", fork=FORK_NONE, max_reward=0.0)
    assert await ids(store, run, both) == pick(
        lambda s: s.task_id == "task-0" and s.purpose == "train" and not s.forked and s.reward == 0
    )


async def test_rows_say_purpose_forks_and_exclusion(database_url: str, store: Store) -> None:
    run = await seeded(database_url)
    page = await load_sessions(store, run.id, size=100)
    rows = {r.id: r for r in page.rows}
    for s in run.sessions:
        row = rows[s.id]
        assert row.purpose == s.purpose
        assert row.forks == int(s.forked)
        assert row.excluded == (s.termination == "env_setup_failure")
        assert row.turns == s.turns


async def test_sorts_are_stable_and_put_missing_values_last(
    database_url: str, store: Store
) -> None:
    run = await seeded(database_url)
    by_id = {s.id: s for s in run.sessions}
    rows = (await load_sessions(store, run.id, sort="-reward", size=100)).rows
    rewards = [r.reward for r in rows]
    scalar = [x for x in rewards if isinstance(x, float)]
    assert scalar == sorted(scalar, reverse=True)
    assert rewards[len(scalar) :] == [None] * (len(rewards) - len(scalar))  # nulls last
    ties = [r.id for r in rows if r.reward == 1.0]
    assert ties == sorted(ties)  # ties by id

    turns = (await load_sessions(store, run.id, sort="turns", size=100)).rows
    assert [r.turns for r in turns] == sorted(by_id[r.id].turns for r in turns)
    # Newest first by default: the last version's validation session, then its last group.
    newest = (await load_sessions(store, run.id, size=5)).rows
    assert [r.id for r in newest] == [s.id for s in reversed(run.sessions[-5:])]
    paged = await load_sessions(store, run.id, 2, 5, wanted=SessionFilter(purpose="train"))
    assert paged.total == 16
    assert len(paged.rows) == 5
    with pytest.raises(InvalidRequest):
        await load_sessions(store, run.id, sort="reward; drop table runs")


async def test_the_filters_choices_are_the_runs(database_url: str, store: Store) -> None:
    run = await seeded(database_url)
    choices = await load_session_choices(store, run.id)
    assert choices.terminations == ("active", "completed", "env_setup_failure")
    assert choices.purposes == ("train", "validation")
    assert choices.fork_reasons == ("edited_history",)
    with pytest.raises(NotFound):
        await load_session_choices(store, "nope")
