"""ExportStore: weight versions, exactly-once claims, leases, acks, exclusion, staleness."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator

import pytest

from kernel.errors import Conflict, NotFound
from recorder.export import AlignmentReport, ExportStore
from recorder.records import SessionSpec
from recorder.store import Store
from tests.recorder.builders import make_turn


@pytest.fixture
async def stores(database_url: str) -> AsyncIterator[tuple[Store, ExportStore]]:
    store = await Store.open(database_url)
    exports = ExportStore.open(database_url)
    yield store, exports
    await exports.close()
    await store.close()


async def add_group(
    store: Store,
    run_id: str,
    group_id: str,
    outcomes: list[tuple[str, float | None] | None],
    version: str = "v0",
) -> list[str]:
    """Sessions of one group; None leaves that session active (the group is incomplete)."""
    ids = []
    for index, outcome in enumerate(outcomes):
        spec = SessionSpec(run_id, "task-" + group_id, group_id, index, "h")
        session = await store.create_session(spec)
        await store.write_turns([make_turn(session.id, 0, weight_version=version)])
        if outcome is not None:
            await store.finish_session(session.id, outcome[0], outcome[1], None)
        ids.append(session.id)
    return ids


async def new_run(store: Store) -> str:
    return (await store.create_run(f"run-{uuid.uuid4().hex[:8]}")).id


async def test_weight_versions_are_ordered_by_announcement(
    stores: tuple[Store, ExportStore],
) -> None:
    store, exports = stores
    run = await new_run(store)
    assert [(await exports.announce_version(run, v)).index for v in ("a", "b", "a")] == [0, 1, 0]
    assert [v.version for v in await exports.list_versions(run)] == ["a", "b"]
    with pytest.raises(NotFound):
        await exports.announce_version("nope", "a")


async def test_only_complete_groups_without_excluded_samples_are_delivered(
    stores: tuple[Store, ExportStore],
) -> None:
    store, exports = stores
    run = await new_run(store)
    done = await add_group(store, run, "done", [("completed", 1.0), ("env_setup_failure", None)])
    await add_group(store, run, "running", [("completed", 1.0), None])
    await add_group(store, run, "broken", [("harness_error", None), ("agent_timeout", 0.0)])
    await add_group(store, run, "mixed", [("completed", 0.0), ("max_turns", 1.0)])

    claim = await exports.claim(run, 10, None, 600)

    assert [g.group_id for g in claim.groups] == ["done", "mixed"]
    assert claim.groups[0].session_ids == (done[0],)  # the failed environment is left out
    assert claim.zero_variance_groups == 1  # "done" has one sample; "mixed" has signal
    assert claim.batch_id is not None
    # The all-excluded group is never delivered, the incomplete one not yet.
    assert (await exports.claim(run, 10, None, 600)).groups == ()


async def test_validation_sessions_are_recorded_but_never_handed_to_a_trainer(
    stores: tuple[Store, ExportStore],
) -> None:
    store, exports = stores
    run = await new_run(store)
    await add_group(store, run, "train", [("completed", 1.0), ("completed", 0.0)])
    for index, reward in enumerate((1.0, 0.0)):
        spec = SessionSpec(run, "held-out", "val", index, "h", purpose="validation")
        session = await store.create_session(spec)
        await store.finish_session(session.id, "completed", reward, None)
        assert (await store.get_session(session.id)).spec.purpose == "validation"

    claim = await exports.claim(run, 10, None, 600)

    assert [g.group_id for g in claim.groups] == ["train"]
    assert (await exports.claim(run, 10, None, 600)).groups == ()


async def test_vector_rewards_count_variance_per_group(stores: tuple[Store, ExportStore]) -> None:
    store, exports = stores
    run = await new_run(store)
    for group, rewards in (("same", [(1.0, 0.5), (1.0, 0.5)]), ("diff", [(1.0, 0.5), (1.0, 0.0)])):
        for index, reward in enumerate(rewards):
            session = await store.create_session(SessionSpec(run, "t", group, index, "h"))
            finished = await store.finish_session(session.id, "completed", reward, {"k": 1})
            assert finished.reward == reward
    claim = await exports.claim(run, 10, None, 600)
    assert (len(claim.groups), claim.zero_variance_groups) == (2, 1)


async def test_concurrent_claimers_never_receive_the_same_group(
    stores: tuple[Store, ExportStore], database_url: str
) -> None:
    store, _ = stores
    run = await new_run(store)
    for n in range(24):
        await add_group(store, run, f"g{n:02d}", [("completed", 1.0), ("completed", 0.0)])
    trainers = [ExportStore.open(database_url) for _ in range(6)]
    try:
        claims = await asyncio.gather(
            *(t.claim(run, 3, None, 600) for t in trainers for _ in range(3))
        )
    finally:
        for trainer in trainers:
            await trainer.close()
    delivered = [g.group_id for c in claims for g in c.groups]
    assert len(delivered) == len(set(delivered)) == 24


async def test_an_expired_lease_returns_its_groups_and_its_ack_conflicts(
    stores: tuple[Store, ExportStore],
) -> None:
    store, exports = stores
    run = await new_run(store)
    await add_group(store, run, "g", [("completed", 1.0)])
    first = await exports.claim(run, 1, None, lease_s=0.2)
    assert (await exports.claim(run, 1, None, 600)).groups == ()  # leased
    await asyncio.sleep(0.3)

    second = await exports.claim(run, 1, None, 600)
    assert [g.group_id for g in second.groups] == ["g"]
    assert (first.reclaimed_groups, second.reclaimed_groups) == (0, 1)  # lease expiries
    assert first.batch_id is not None
    assert second.batch_id is not None
    with pytest.raises(Conflict):
        await exports.ack(first.batch_id)
    await exports.ack(second.batch_id)
    await exports.ack(second.batch_id)  # idempotent
    await asyncio.sleep(0.01)
    assert (await exports.claim(run, 1, None, 0.01)).groups == ()  # acked for good
    with pytest.raises(NotFound):
        await exports.ack("no-such-batch")


async def test_an_expired_lease_nobody_took_can_still_be_acked(
    stores: tuple[Store, ExportStore],
) -> None:
    store, exports = stores
    run = await new_run(store)
    await add_group(store, run, "g", [("completed", 1.0)])
    claim = await exports.claim(run, 1, None, lease_s=0.05)
    await asyncio.sleep(0.1)
    assert claim.batch_id is not None
    await exports.ack(claim.batch_id)
    assert (await exports.claim(run, 1, None, 600)).groups == ()


async def test_stale_groups_are_held_back_and_counted(stores: tuple[Store, ExportStore]) -> None:
    store, exports = stores
    run = await new_run(store)
    for version in ("v0", "v1", "v2"):
        await exports.announce_version(run, version)
    await add_group(store, run, "old", [("completed", 1.0)], version="v0")
    await add_group(store, run, "unknown", [("completed", 1.0)], version="never-announced")
    await add_group(store, run, "fresh", [("completed", 1.0)], version="v2")
    straddling = await add_group(store, run, "straddle", [None], version="v2")
    # One turn of "straddle" has tokens from v1 (a pause-abort resumption across an update).
    turn = dataclasses.replace(
        make_turn(straddling[0], 1, output=(1, 2, 3)),
        weight_version="v2",
        weight_version_spans=(("v1", 0, 2), ("v2", 2, 3)),
    )
    await store.write_turns([turn])
    await store.finish_session(straddling[0], "completed", 1.0, None)

    claim = await exports.claim(run, 10, max_staleness=1, lease_s=600)
    assert {g.group_id: g.staleness for g in claim.groups} == {"fresh": 0, "straddle": 1}
    assert claim.stale_groups == 2
    loose = await exports.claim(run, 10, max_staleness=None, lease_s=600)
    assert {g.group_id: g.staleness for g in loose.groups} == {"old": 2, "unknown": 3}


async def test_alignment_reports_replace_per_step(stores: tuple[Store, ExportStore]) -> None:
    store, exports = stores
    run = await new_run(store)
    for r in (0.9, 0.99):
        await exports.record_alignment(
            AlignmentReport(run, 3, "v1", {"pearson_r": r, "expert_overlap": None}, False, 1.0)
        )
    (report,) = await exports.list_alignment(run)
    assert (report.step, report.metrics["pearson_r"], report.flagged) == (3, 0.99, False)
