"""The stopwatch times named stages and leaves the rest of the wall time to ``other``;
the summary turns trials into counts by termination and Table 4's rows."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from rollouts.stages import Stage, Stages, Stopwatch
from rollouts.summary import Summary, percentile


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_named_stages_add_up_and_other_holds_the_rest() -> None:
    clock = FakeClock()
    watch = Stopwatch(clock)
    clock.now += 0.5  # before any stage: other
    with watch.stage(Stage.SANDBOX_SETUP):
        clock.now += 2.0
    with watch.stage(Stage.AGENT_EXECUTION):
        clock.now += 10.0
    with watch.stage(Stage.SANDBOX_SETUP):  # entered again: adds up
        clock.now += 1.0
    clock.now += 0.25
    stages = watch.stages()
    assert stages == Stages(sandbox_setup=3.0, agent_execution=10.0, other=0.75)
    assert stages.total == pytest.approx(13.75)
    assert stages.as_json() == {
        "sandbox_setup": 3.0,
        "agent_setup": 0.0,
        "agent_execution": 10.0,
        "verification": 0.0,
        "other": 0.75,
    }


def test_a_stage_that_raises_is_still_timed() -> None:
    clock = FakeClock()
    watch = Stopwatch(clock)

    def grade() -> None:
        with watch.stage(Stage.VERIFICATION):
            clock.now += 4.0
            raise RuntimeError("grader blew up")

    with pytest.raises(RuntimeError, match="blew up"):
        grade()
    assert watch.stages().verification == 4.0


def test_other_is_not_timed_by_hand() -> None:
    with pytest.raises(ValueError, match="other"), Stopwatch().stage(Stage.OTHER):
        pass


def test_percentiles_interpolate_like_numpy() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 50) == 2.5
    assert percentile(values, 90) == pytest.approx(3.7)
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError, match="nothing"):
        percentile([], 50)


@dataclass(frozen=True)
class Done:
    termination: str
    stages: Stages


def test_the_summary_counts_terminations_and_shares_time() -> None:
    trials = [
        Done("completed", Stages(sandbox_setup=1.0, agent_execution=8.0, verification=1.0)),
        Done("completed", Stages(sandbox_setup=3.0, agent_execution=4.0, verification=3.0)),
        Done("agent_timeout", Stages(sandbox_setup=2.0, agent_execution=18.0)),
        Done("env_setup_failure", Stages(sandbox_setup=1.0)),
    ]
    summary = Summary.of(trials)
    assert summary.trials == 4
    assert summary.by_termination == {"completed": 2, "agent_timeout": 1, "env_setup_failure": 1}
    rows = {row.stage: row for row in summary.rows}
    assert rows[Stage.SANDBOX_SETUP].mean == pytest.approx(1.75)
    assert rows[Stage.SANDBOX_SETUP].p50 == pytest.approx(1.5)
    assert rows[Stage.AGENT_EXECUTION].share == pytest.approx(30.0 / 41.0)
    assert sum(row.share for row in summary.rows) == pytest.approx(1.0)
    text = summary.render()
    assert text.splitlines()[0] == "trials: 4  completed=2 agent_timeout=1 env_setup_failure=1"
    assert "agent_execution" in text
    assert "73.2%" in text


def test_an_empty_rollout_summarises_to_zeros() -> None:
    summary = Summary.of([])
    assert summary.trials == 0
    assert all(row.mean == 0.0 and row.share == 0.0 for row in summary.rows)
