"""The in-batch success histogram per epoch, against groups laid out by hand: excluded
samples are not samples of their group, unfinished ones neither, validation sessions are
not groups, and the epoch comes from the group's name."""

from __future__ import annotations

import pytest
from sqlalchemy import update

from kernel.errors import NotFound
from recorder.database import create_engine
from recorder.read_models.epochs import epoch_of, load_epochs
from recorder.schema import sessions
from recorder.store import Store
from tests.recorder.read_models.seed import Outcome, seed_run

# (version, group) -> the outcome of each of its four samples; with two tasks the groups
# are task-0.e0, task-1.e0 (version 0), task-0.e1, task-1.e1 (version 1).
GROUPS: dict[tuple[int, int], list[Outcome]] = {
    (0, 0): [("completed", 1.0, 1, 4, 0)] * 4,  # 4 of 4
    (0, 1): [("completed", 0.0, 1, 4, 0)] * 3 + [("env_setup_failure", None, 1, 4, 0)],  # 0/3
    (1, 0): [("completed", r, 1, 4, 0) for r in (1.0, 0.0, 1.0, 0.0)],  # 2 of 4
    (1, 1): [
        ("completed", 1.0, 1, 4, 0),
        ("max_turns", 0.0, 1, 4, 0),
        (None, None, 1, 4, 0),  # still running
        ("harness_error", None, 1, 4, 0),
    ],  # 1 of 2
}


def plan(v: int, n: int) -> Outcome:
    return GROUPS[(v, n // 4)][n % 4]


def test_the_epoch_is_read_from_the_group_name() -> None:
    assert epoch_of("task-3.e12") == 12
    assert epoch_of("astropy__astropy-12907.e0") == 0
    assert epoch_of("a.e1.e2") == 2
    assert epoch_of("g0-1") is None
    assert epoch_of("task.e") is None
    assert epoch_of("task.e1x") is None


async def test_groups_by_successes_per_epoch(database_url: str, store: Store) -> None:
    run = await seed_run(
        database_url,
        versions=2,
        groups_per_version=2,
        group_size=4,
        plan=plan,
        tasks=2,
        epoch_groups=True,
        validation=lambda v: [("completed", 1.0), ("completed", 0.0)],
    )
    assert {s.group_id for s in run.train} == {"task-0.e0", "task-1.e0", "task-0.e1", "task-1.e1"}
    epochs = await load_epochs(store, run.id)
    first, second = epochs.epochs
    assert (first.epoch, second.epoch) == (0, 1)
    assert dict(first.histogram) == {(4, 4): 1, (0, 3): 1}
    assert (first.groups, first.all_failed, first.all_solved) == (2, 1, 1)
    assert first.zero_variance_share == 1.0
    assert dict(second.histogram) == {(2, 4): 1, (1, 2): 1}
    assert second.zero_variance_share == 0.0
    # Every k of the largest group size, then the other sizes' bins that hold a group.
    assert epochs.bins() == [(0, 4), (1, 4), (2, 4), (3, 4), (4, 4), (0, 3), (1, 2)]

    # A group whose sessions are validation ones is no group a trainer learns from.
    engine = create_engine(database_url)
    async with engine.begin() as conn:
        await conn.execute(
            update(sessions).where(sessions.c.group_id == "task-1.e1").values(purpose="validation")
        )
    await engine.dispose()
    later = await load_epochs(store, run.id)
    assert dict(later.epochs[1].histogram) == {(2, 4): 1}


async def test_groups_named_otherwise_count_under_no_epoch(database_url: str, store: Store) -> None:
    run = await seed_run(
        database_url,
        versions=1,
        groups_per_version=3,
        group_size=2,
        plan=lambda v, n: ("completed", float(n < 3), 1, 4, 0),  # 2/2, 1/2, 0/2
    )
    [unnamed] = (await load_epochs(store, run.id)).epochs
    assert unnamed.epoch is None
    assert dict(unnamed.histogram) == {(2, 2): 1, (1, 2): 1, (0, 2): 1}
    assert unnamed.zero_variance_share == pytest.approx(2 / 3)


async def test_an_unknown_run_is_not_found(store: Store) -> None:
    with pytest.raises(NotFound):
        await load_epochs(store, "nope")
