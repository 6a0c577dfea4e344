"""Collapse early stop: rules parsed, tripped by a trend in the right direction only."""

from __future__ import annotations

import pytest

from kernel.errors import ConfigurationError
from loop.collapse import DEFAULT_RULES, CollapseRule, check, parse_rule


def steps(**series: list[float]) -> list[dict[str, float | None]]:
    length = len(next(iter(series.values())))
    return [{name: values[i] for name, values in series.items()} for i in range(length)]


# Table 8's collapsed run, in shape: reward and turns fall, entropy rises (with noise).
COLLAPSING = steps(
    mean_reward=[0.35, 0.33, 0.30, 0.31, 0.22, 0.18, 0.12, 0.08, 0.06, 0.05],
    turns_per_trajectory=[18.9, 18.0, 16.2, 15.0, 12.1, 9.8, 6.0, 3.1, 1.5, 0.96],
    entropy=[0.13, 0.14, 0.14, 0.16, 0.17, 0.19, 0.20, 0.21, 0.22, 0.23],
    grad_norm=[0.31, 0.05, 0.4, 0.02, 0.3, 0.03, 0.35, 0.04, 0.3, 0.034],
)
HEALTHY = steps(
    mean_reward=[0.30, 0.32, 0.31, 0.35, 0.34, 0.37, 0.36, 0.40, 0.39, 0.41],
    turns_per_trajectory=[18.0, 18.5, 17.9, 18.2, 18.8, 18.1, 18.4, 18.6, 18.0, 18.3],
)


def test_the_default_rules_trip_on_a_collapsing_run_and_name_the_series() -> None:
    tripped = check(DEFAULT_RULES, COLLAPSING)
    assert [t.rule.series for t in tripped] == ["mean_reward", "turns_per_trajectory"]
    assert "mean_reward is falling (t = -" in tripped[0].describe()


def test_the_default_rules_leave_a_healthy_run_alone() -> None:
    assert check(DEFAULT_RULES, HEALTHY) == []


def test_direction_matters_and_noise_does_not_trip() -> None:
    assert check([parse_rule("entropy:rising")], COLLAPSING)
    assert not check([parse_rule("entropy:falling")], COLLAPSING)
    assert check([parse_rule("entropy:either")], COLLAPSING)
    assert not check([parse_rule("grad_norm:either:2")], COLLAPSING)  # |t| well under 2


def test_a_rule_waits_for_its_minimum_steps() -> None:
    early = COLLAPSING[:3]  # t = -8.7 over three steps
    assert not check([parse_rule("mean_reward:falling:3:5")], early)
    assert check([parse_rule("mean_reward:falling:3:3")], early)


def test_missing_values_are_skipped() -> None:
    gappy = [dict(s) for s in COLLAPSING]
    gappy[3]["mean_reward"] = None
    assert check([CollapseRule("mean_reward", "falling")], gappy)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("mean_reward", "SERIES:DIRECTION"),
        ("loss:falling", "series is one of"),
        ("mean_reward:down", "direction is"),
        ("mean_reward:falling:x", "T is a number"),
        ("mean_reward:falling:3:2", "MIN_STEPS >= 3"),
    ],
)
def test_bad_rules_are_refused_with_what_to_write(text: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        parse_rule(text)
