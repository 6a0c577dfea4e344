"""How a run's prompt groups fared, per epoch: LEGO-RL's in-batch success histogram.

GRPO learns only from groups whose samples disagree: a group where 0 of N or N of N
succeed has no group-relative advantage (Figure 5 of the paper tracks their share across
epochs). The rollout runner names a group ``<task>.e<epoch>`` (``rollouts.runner``);
``epoch_of`` reads the epoch back from that name, and a group named otherwise counts
under epoch ``None``.

Contract: ``load_epochs(store, run_id)`` raises ``NotFound`` for an unknown run and
otherwise returns ``Epochs`` in two statements whatever the run's size: per epoch (in
order, ``None`` last), how many groups had k successes of N, where N counts a group's
graded samples with a scalar reward (an excluded environment failure is not a sample of
the group, a vector reward has no success threshold) and k those of them solved
(``facts.SOLVED_REWARD``). As in the overview, a group counts once it holds two or more
such samples, and only training sessions count: validation sessions are not groups that
a trainer learns from.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import func, select

from kernel.errors import NotFound
from recorder.read_models.facts import TRAIN, session_facts
from recorder.schema import runs
from recorder.store import Store

_EPOCH = re.compile(r"\.e(\d+)$")


def epoch_of(group_id: str) -> int | None:
    match = _EPOCH.search(group_id)
    return int(match.group(1)) if match else None


@dataclass(frozen=True, slots=True)
class EpochStats:
    epoch: int | None
    histogram: Mapping[tuple[int, int], int]  # (successes k, samples N) -> groups

    @property
    def groups(self) -> int:
        return sum(self.histogram.values())

    @property
    def all_failed(self) -> int:
        return sum(n for (k, _), n in self.histogram.items() if k == 0)

    @property
    def all_solved(self) -> int:
        return sum(n for (k, size), n in self.histogram.items() if k == size)

    @property
    def zero_variance_share(self) -> float | None:
        if not self.groups:
            return None
        return (self.all_failed + self.all_solved) / self.groups


@dataclass(frozen=True, slots=True)
class Epochs:
    run_id: str
    run_name: str
    epochs: tuple[EpochStats, ...]

    def bins(self) -> list[tuple[int, int]]:
        """The histogram's bins, (k, N): every k from 0 to N for the largest N seen, then
        the bins of smaller groups that hold any, larger N first."""
        seen = {b for e in self.epochs for b in e.histogram}
        if not seen:
            return []
        largest = max(size for _, size in seen)
        full = [(k, largest) for k in range(largest + 1)]
        rest = sorted(seen - set(full), key=lambda b: (-b[1], b[0]))
        return full + rest


async def load_epochs(store: Store, run_id: str) -> Epochs:
    async with store.engine.connect() as conn:
        run = (await conn.execute(select(runs.c.name).where(runs.c.id == run_id))).first()
        if run is None:
            raise NotFound(f"no run {run_id!r}")
        facts = session_facts(run_id, (), TRAIN)  # no version order: groups, not versions
        # One row per group, not per session: the epoch is in the group's name.
        per_group = (
            select(facts.c.group_id, func.count().label("n"), func.sum(facts.c.solved).label("k"))
            .where(facts.c.included == 1, facts.c.reward.is_not(None))
            .group_by(facts.c.group_id)
            .having(func.count() >= 2)
        )
        rows = (await conn.execute(per_group)).all()
    histograms: dict[int | None, dict[tuple[int, int], int]] = {}
    for row in rows:
        histogram = histograms.setdefault(epoch_of(str(row.group_id)), {})
        key = (int(row.k or 0), int(row.n))
        histogram[key] = histogram.get(key, 0) + 1
    order = sorted(histograms, key=lambda e: (e is None, e or 0))
    return Epochs(
        run_id=run_id,
        run_name=str(run.name),
        epochs=tuple(EpochStats(e, histograms[e]) for e in order),
    )
