"""Collapse early stop (LEGO-RL Table 8, Figure 7b): a rule over the trainer's series.

The trainer posts, with each step, the series a collapsing run shows first: training
reward (``mean_reward``), ``turns_per_trajectory``, ``response_tokens``, ``entropy``,
``kl``, rollout-training agreement (``pearson_r``) and ``grad_norm``
(``trainer_bridge.series``, ``trainer_bridge.train``). A ``CollapseRule`` names one
series, the direction that means trouble, the |t| of the least-squares slope over the run
(``kernel.trend``) that trips it, and the steps it needs first. ``check(rules, steps)``
returns every rule that tripped with the trend that tripped it; the loop then stops or
pauses the run (``--on-collapse``) and says which series it was.

Rules are written ``SERIES:DIRECTION[:T[:MIN_STEPS]]`` (``parse_rule``), e.g.
``mean_reward:falling:3`` or ``entropy:rising``. ``DEFAULT_RULES`` are Table 8's collapse
signature read conservatively: reward and turns per trajectory falling with |t| >= 3 over
at least 5 steps (the paper's collapsed run shows t = -7.5 and -14.8; |t| < 2 is noise).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from kernel.errors import ConfigurationError
from kernel.trend import Trend, trend

SERIES = (
    "mean_reward",
    "turns_per_trajectory",
    "response_tokens",
    "entropy",
    "kl",
    "pearson_r",
    "grad_norm",
)
Direction = Literal["rising", "falling", "either"]
DIRECTIONS: dict[str, Direction] = {"rising": "rising", "falling": "falling", "either": "either"}


@dataclass(frozen=True, slots=True)
class CollapseRule:
    series: str
    direction: Direction
    t: float = 3.0
    min_steps: int = 5

    def __str__(self) -> str:
        return f"{self.series}:{self.direction}:{self.t:g}:{self.min_steps}"

    def trips(self, found: Trend) -> bool:
        if found.t is None or found.points < self.min_steps:
            return False
        if self.direction == "rising":
            return found.t >= self.t
        if self.direction == "falling":
            return found.t <= -self.t
        return abs(found.t) >= self.t


DEFAULT_RULES = (
    CollapseRule("mean_reward", "falling"),
    CollapseRule("turns_per_trajectory", "falling"),
)


@dataclass(frozen=True, slots=True)
class Tripped:
    rule: CollapseRule
    trend: Trend

    def describe(self) -> str:
        t = self.trend
        return (
            f"{t.series} is {t.direction} (t = {t.t:+.2f} over {t.points} steps, "
            f"first {t.first:.4g} -> last {t.last:.4g}; rule {self.rule})"
        )


def parse_rule(text: str) -> CollapseRule:
    parts = text.split(":")
    if len(parts) < 2 or len(parts) > 4:
        raise ConfigurationError(f"--collapse {text!r}: expected SERIES:DIRECTION[:T[:MIN_STEPS]]")
    series, direction = parts[0], parts[1]
    if series not in SERIES:
        raise ConfigurationError(f"--collapse {text!r}: series is one of {', '.join(SERIES)}")
    if direction not in DIRECTIONS:
        raise ConfigurationError(f"--collapse {text!r}: direction is rising, falling or either")
    try:
        t = float(parts[2]) if len(parts) > 2 else 3.0
        min_steps = int(parts[3]) if len(parts) > 3 else 5
    except ValueError:
        raise ConfigurationError(
            f"--collapse {text!r}: T is a number, MIN_STEPS an integer"
        ) from None
    if t <= 0 or min_steps < 3:
        raise ConfigurationError(f"--collapse {text!r}: T must be > 0 and MIN_STEPS >= 3")
    return CollapseRule(series, DIRECTIONS[direction], t, min_steps)


def series_of(steps: Sequence[Mapping[str, float | None]], name: str) -> list[float | None]:
    return [step.get(name) for step in steps]


def check(
    rules: Sequence[CollapseRule], steps: Sequence[Mapping[str, float | None]]
) -> list[Tripped]:
    """The rules that trip over ``steps`` (each step's posted metrics, in step order)."""
    tripped = []
    for rule in rules:
        found = trend(rule.series, series_of(steps, rule.series))
        if rule.trips(found):
            tripped.append(Tripped(rule, found))
    return tripped
