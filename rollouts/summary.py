"""The end-of-rollout summary: trials by termination, and stage times as Table 4.

``Summary.of(trials)`` takes anything with a ``termination`` and ``stages``; ``render()``
is the text the command prints:

    trials: 8  completed=6 agent_timeout=1 env_setup_failure=1
    stage              mean s    p50 s    p90 s    p99 s   share
    sandbox_setup        0.41     0.38     0.60     0.63   3.1%
    ...

Percentiles interpolate linearly between order statistics (numpy's default); ``share`` is
a stage's total over every stage's total, across all trials.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from rollouts.stages import Stage, Stages


class Timed(Protocol):
    @property
    def termination(self) -> str: ...

    @property
    def stages(self) -> Stages: ...


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of a non-empty sequence, linearly interpolated."""
    if not values:
        raise ValueError("a percentile of nothing")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True, slots=True)
class StageRow:
    stage: Stage
    mean: float
    p50: float
    p90: float
    p99: float
    share: float  # of all stages' seconds, 0..1


@dataclass(frozen=True, slots=True)
class Summary:
    trials: int
    by_termination: dict[str, int]
    rows: tuple[StageRow, ...]

    @classmethod
    def of(cls, trials: Sequence[Timed]) -> Summary:
        counts = dict(Counter(t.termination for t in trials).most_common())
        grand = sum(t.stages.total for t in trials)
        rows = []
        for stage in Stage:
            seconds = [t.stages.get(stage) for t in trials] or [0.0]
            rows.append(
                StageRow(
                    stage=stage,
                    mean=sum(seconds) / len(seconds),
                    p50=percentile(seconds, 50),
                    p90=percentile(seconds, 90),
                    p99=percentile(seconds, 99),
                    share=sum(seconds) / grand if grand > 0 else 0.0,
                )
            )
        return cls(len(trials), counts, tuple(rows))

    def render(self) -> str:
        kinds = " ".join(f"{name}={count}" for name, count in self.by_termination.items())
        lines = [f"trials: {self.trials}  {kinds}".rstrip()]
        lines.append(f"{'stage':<16} {'mean s':>8} {'p50 s':>8} {'p90 s':>8} {'p99 s':>8} share")
        for row in self.rows:
            lines.append(
                f"{row.stage.value:<16} {row.mean:8.2f} {row.p50:8.2f} {row.p90:8.2f} "
                f"{row.p99:8.2f} {row.share:6.1%}"
            )
        return "\n".join(lines)
