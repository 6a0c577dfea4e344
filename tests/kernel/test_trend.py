"""The collapse check: trends over weight versions and trainer steps, flagged when they
move the wrong way, on a seeded run read through the overview read model."""

from __future__ import annotations

import random

import pytest

from kernel.trend import trend
from proxy.ui.pages import Pages, collapse_rows
from recorder.read_models.overview import load_overview
from recorder.store import Store
from tests.recorder.read_models.seed import seed_run


def collapsing_plan(v: int, n: int) -> tuple[str | None, float | None, int, int, int]:
    """Reward falls and responses shrink over versions; turns per trajectory stay flat."""
    rng = random.Random(v * 1000 + n)
    solved = rng.random() < 0.8 - 0.07 * v
    turns = 3 + (n % 3) - 1  # the same spread at every version
    return ("completed", 1.0 if solved else 0.0, turns, 60 - 5 * v + rng.randint(-2, 2), 0)


async def test_collapse_check_flags_falling_reward_and_shrinking_responses(
    database_url: str, store: Store
) -> None:
    rng = random.Random(7)
    alignment: list[dict[str, float | None]] = [
        {
            "pearson_r": 0.999 + rng.uniform(-5e-4, 5e-4),  # flat and noisy
            "entropy": 0.13 + 0.01 * step + rng.uniform(-0.003, 0.003),  # rising
        }
        for step in range(12)
    ]
    run = await seed_run(
        database_url,
        versions=10,
        groups_per_version=4,
        group_size=8,
        plan=collapsing_plan,
        alignment=alignment,
    )
    overview = await load_overview(store, run.id)
    trends = {row.trend.series: row.trend for row in collapse_rows(overview)}

    assert trends["mean reward"].flagged
    assert trends["mean reward"].direction == "falling"
    assert trends["solve rate"].flagged
    assert trends["response length (tokens)"].direction == "falling"
    assert trends["entropy"].direction == "rising"
    assert not trends["turns per trajectory"].flagged
    assert not trends["pearson_r"].flagged
    assert trends["pearson_r"].points == 12
    assert trends["mean reward"].first is not None
    assert trends["mean reward"].last is not None
    assert trends["mean reward"].first > trends["mean reward"].last
    html = Pages().overview(overview)
    assert 'data-series="mean reward" data-flagged="yes"' in html
    assert 'data-series="turns per trajectory" data-flagged="no"' in html


def test_trend_statistics_by_hand() -> None:
    # y = 2x + noise with known residuals: slope and t checked against the textbook formula.
    ys = [0.1, 2.0, 3.9, 6.2, 7.8]
    result = trend("s", ys)
    assert result.slope == pytest.approx(1.96)
    residuals = [y - (0.08 + 1.96 * x) for x, y in enumerate(ys)]
    stderr = (sum(r * r for r in residuals) / 3 / 10) ** 0.5
    assert result.t == pytest.approx(1.96 / stderr)
    assert trend("flat", [1.0, 1.0, 1.0, 1.0]).t == 0.0
    assert not trend("flat", [1.0, 1.0, 1.0, 1.0]).flagged
    assert trend("line", [1.0, 2.0, 3.0]).t == float("inf")
    assert trend("short", [1.0, 5.0]).t is None
    assert trend("gaps", [None, 1.0, None, 2.0, 3.1]).points == 3
