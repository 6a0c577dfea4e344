"""Table 4 and the termination profile per trainer step, against numbers worked out by
hand: nearest-rank percentiles, shares of the trial time, stages a trial did not report,
and validation sessions kept out."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from sqlalchemy import update

from kernel.errors import NotFound
from recorder.database import create_engine
from recorder.read_models.steps import TOTAL, StepTrials, load_steps
from recorder.schema import sessions
from recorder.store import Store
from tests.recorder.read_models.seed import Outcome, seed_run


def outcome(v: int, n: int) -> Outcome:
    if v == 1 and n == 3:
        return ("env_setup_failure", None, 1, 4, 0)
    if v == 1 and n == 4:
        return (None, None, 1, 4, 0)  # still running
    return ("completed", 1.0, 1, 4, 0)


def stage_times(v: int, n: int) -> Mapping[str, float] | None:
    if v == 0:  # sandbox 1..5 s, execution 10..50 s, verification 2 s on every other trial
        times = {"sandbox_setup": n + 1.0, "agent_execution": 10.0 * (n + 1)}
        return {**times, "verification": 2.0} if n % 2 == 0 else times
    if n == 4:
        return None  # reported no stage times
    return {"sandbox_setup": 2.0, "agent_execution": 100.0, "other": 1.0}


def row(scope: StepTrials, stage: str) -> tuple[int, float, float, float, float, float | None]:
    stats = scope.stage(stage)
    assert stats is not None, stage
    return (stats.trials, stats.mean, stats.p50, stats.p90, stats.p99, stats.share)


async def test_stage_times_per_step_and_over_the_run(database_url: str, store: Store) -> None:
    run = await seed_run(
        database_url,
        versions=2,
        groups_per_version=1,
        group_size=5,
        plan=outcome,
        stages=stage_times,
        validation=lambda v: [("completed", 1.0), ("max_turns", 0.0)],
    )
    # Validation trials report stage times too; a training step's numbers leave them out.
    engine = create_engine(database_url)
    async with engine.begin() as conn:
        await conn.execute(
            update(sessions)
            .where(sessions.c.purpose == "validation")
            .values(stages={"sandbox_setup": 999.0, "agent_execution": 999.0})
        )
    await engine.dispose()

    steps = await load_steps(store, run.id)
    first, second = steps.versions
    assert (first.version, second.version) == run.versions
    # v000: sandbox 1..5, execution 10..50, verification 2 x3; totals 13 22 35 44 57 (171).
    assert first.timed == 5
    assert [s.stage for s in first.stages] == [
        "sandbox_setup",
        "agent_execution",
        "verification",
        TOTAL,
    ]
    assert row(first, "sandbox_setup") == pytest.approx((5, 3.0, 3.0, 5.0, 5.0, 15 / 171))
    assert row(first, "agent_execution") == pytest.approx((5, 30.0, 30.0, 50.0, 50.0, 150 / 171))
    assert row(first, "verification") == pytest.approx((3, 2.0, 2.0, 2.0, 2.0, 6 / 171))
    assert row(first, TOTAL) == pytest.approx((5, 34.2, 35.0, 57.0, 57.0, 1.0))
    # v001: four trials of 2 + 100 + 1 s; the fifth reported nothing.
    assert second.timed == 4
    assert row(second, "other") == pytest.approx((4, 1.0, 1.0, 1.0, 1.0, 4 / 412))
    assert row(second, TOTAL) == pytest.approx((4, 103.0, 103.0, 103.0, 103.0, 1.0))
    assert second.stage("verification") is None
    # The whole run: sandbox [1 2 2 2 2 2 3 4 5]: p50 the 5th, p90 and p99 the 9th.
    whole = steps.whole_run
    assert whole.timed == 9
    assert row(whole, "sandbox_setup") == pytest.approx((9, 23 / 9, 2.0, 5.0, 5.0, 23 / 583))
    assert row(whole, TOTAL) == pytest.approx((9, 583 / 9, 57.0, 103.0, 103.0, 1.0))
    assert sum(s.share or 0 for s in whole.stages if s.stage != TOTAL) == pytest.approx(1.0)


async def test_terminations_per_step_count_training_sessions(
    database_url: str, store: Store
) -> None:
    run = await seed_run(
        database_url,
        versions=2,
        groups_per_version=1,
        group_size=5,
        plan=outcome,
        validation=lambda v: [("completed", 1.0), ("agent_timeout", None)],
    )
    steps = await load_steps(store, run.id)
    first, second = steps.versions
    assert dict(first.terminations) == {"completed": 5}
    assert dict(second.terminations) == {"completed": 3, "env_setup_failure": 1, "active": 1}
    assert dict(steps.whole_run.terminations) == {
        "completed": 8,
        "env_setup_failure": 1,
        "active": 1,
    }
    assert steps.termination_reasons == ("active", "completed", "env_setup_failure")
    assert "agent_timeout" not in steps.termination_reasons  # a validation session's
    assert first.timed == 0
    assert first.stages == ()


async def test_an_unknown_run_is_not_found(store: Store) -> None:
    with pytest.raises(NotFound):
        await load_steps(store, "nope")
