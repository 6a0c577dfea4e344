"""Task selection by pass rate (LEGO-RL Figures 5-6): which tasks still teach anything.

GRPO's advantage is relative within a group: a task whose N samples all fail (0/N) or all
pass (N/N) gives every sample the same advantage, zero, and costs a full group of rollouts
for no gradient. ``Selection`` keeps each task's in-batch success count per epoch (k of N,
``k`` = samples with reward > 0) and, with ``set_aside_after = E``, sets a task aside once
its groups were 0/N or N/N in each of the last ``E`` epochs it was sampled in; ``None`` (the
default) sets nothing aside, as the paper's production runs did not. Excluded samples
(environment failures, reward None) do not count toward N. ``epoch(e)`` gives the in-batch
success histogram and the zero-variance share of epoch ``e`` (Figure 5).

Pure and immutable: ``with_group`` returns a new ``Selection``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GroupOutcome:
    task_id: str
    epoch: int
    successes: int  # k: samples with reward > 0
    graded: int  # N: samples with a reward (excluded ones left out)

    @property
    def zero_variance(self) -> bool:
        return self.graded > 0 and self.successes in (0, self.graded)


@dataclass(frozen=True, slots=True)
class EpochStats:
    epoch: int
    groups: int
    histogram: tuple[tuple[int, int], ...]  # (k successes, groups with k), k ascending
    zero_variance_share: float | None  # None: no graded group this epoch


@dataclass(frozen=True, slots=True)
class Selection:
    set_aside_after: int | None = None
    outcomes: tuple[GroupOutcome, ...] = ()

    def __post_init__(self) -> None:
        if self.set_aside_after is not None and self.set_aside_after < 1:
            raise ValueError("set_aside_after must be at least 1 (or None: set nothing aside)")

    def with_group(self, outcome: GroupOutcome) -> Selection:
        return Selection(self.set_aside_after, (*self.outcomes, outcome))

    def with_groups(self, outcomes: Iterable[GroupOutcome]) -> Selection:
        return Selection(self.set_aside_after, (*self.outcomes, *outcomes))

    def set_aside(self) -> dict[str, str]:
        """task id -> why it is set aside (e.g. ``"8/8 in epochs 1, 2"``)."""
        if self.set_aside_after is None:
            return {}
        by_task: dict[str, list[GroupOutcome]] = {}
        for outcome in sorted(self.outcomes, key=lambda o: o.epoch):
            if outcome.graded:
                by_task.setdefault(outcome.task_id, []).append(outcome)
        aside = {}
        for task_id, history in by_task.items():
            last = history[-self.set_aside_after :]
            if len(last) == self.set_aside_after and all(o.zero_variance for o in last):
                counts = ", ".join(f"{o.successes}/{o.graded}" for o in last)
                epochs = ", ".join(str(o.epoch) for o in last)
                aside[task_id] = f"{counts} in epoch(s) {epochs}"
        return aside

    def keep(self, task_ids: Sequence[str]) -> list[str]:
        aside = self.set_aside()
        return [task_id for task_id in task_ids if task_id not in aside]

    def epoch(self, epoch: int) -> EpochStats:
        graded = [o for o in self.outcomes if o.epoch == epoch and o.graded]
        histogram = Counter(o.successes for o in graded)
        zero = sum(1 for o in graded if o.zero_variance)
        return EpochStats(
            epoch=epoch,
            groups=len(graded),
            histogram=tuple(sorted(histogram.items())),
            zero_variance_share=zero / len(graded) if graded else None,
        )
