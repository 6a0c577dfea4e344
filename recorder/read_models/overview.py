"""The run overview's numbers, aggregated in SQL with a fixed number of statements.

Contract: ``load_overview(store, run_id)`` raises ``NotFound`` for an unknown run and
otherwise returns an ``Overview``. Its per-version numbers count training sessions only
(``purpose`` ``train``): per weight version (in policy order) the sessions by
termination reason, mean reward and solve rate over sessions that count for training,
turns per trajectory, response length (sampled tokens per trajectory), malformed tool
calls per turn, and the share of zero-variance prompt groups (all failed: 0/N, all
solved: N/N; groups of two or more graded samples, attributed to the version of their
earliest sample). Validation sessions (held-out evaluations of the closed loop) count
apart: ``validation`` holds, per version they were sampled at, their number and mean
reward, which is the validation curve. Then the trainer's alignment reports by step,
with the reasons it gave for a flagged one. The statement count does not depend on the
run's size, so a 1,000-session run costs what a 10-session run does.

The aggregates are scalar-only: a vector reward (``reward_vector``) has no mean with the
scalars and no threshold to solve, so such a session counts as graded (it is in the
solve rate's denominator) but never as a solve, and is left out of the mean reward and of
its group's zero-variance count. The session pages show the vector itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from sqlalchemy import Subquery, and_, case, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from kernel.errors import NotFound
from recorder.read_models.facts import (
    TRAIN,
    VALIDATION,
    session_facts,
    termination_counts,
    version_order,
)
from recorder.schema import alignment_reports, runs, sessions
from recorder.store import Store

NO_VERSION = "(no turns)"
ALIGNMENT_STEPS = 2000  # the most recent steps charted; older ones are summarized away


@dataclass(frozen=True, slots=True)
class VersionStats:
    version: str
    sessions: int
    graded: int  # finished with a termination that counts for training
    mean_reward: float | None
    solve_rate: float | None
    turns_per_trajectory: float | None
    response_tokens: float | None
    malformed_per_turn: float | None
    groups: int = 0
    all_failed_groups: int = 0
    all_solved_groups: int = 0
    terminations: Mapping[str, int] = field(default_factory=dict)

    @property
    def zero_variance_share(self) -> float | None:
        if not self.groups:
            return None
        return (self.all_failed_groups + self.all_solved_groups) / self.groups


@dataclass(frozen=True, slots=True)
class ValidationStats:
    version: str
    sessions: int
    graded: int
    mean_reward: float | None  # over graded sessions with a scalar reward
    solve_rate: float | None


@dataclass(frozen=True, slots=True)
class AlignmentPoint:
    step: int
    weight_version: str
    metrics: Mapping[str, float | None]
    flagged: bool
    reasons: tuple[str, ...] = ()  # the trainer's, in words, when flagged


@dataclass(frozen=True, slots=True)
class Overview:
    run_id: str
    run_name: str
    sessions: int  # every session of the run, validation included
    active: int
    versions: tuple[VersionStats, ...]  # training sessions only
    alignment: tuple[AlignmentPoint, ...]
    termination_reasons: tuple[str, ...]
    validation: tuple[ValidationStats, ...] = ()
    order: tuple[str, ...] = ()  # the run's weight versions in policy order

    @property
    def validation_sessions(self) -> int:
        return sum(v.sessions for v in self.validation)

    def curve_versions(self) -> list[str]:
        """The versions a training curve runs over: those with training or validation
        sessions, in policy order (sessions without turns last)."""
        seen = {v.version for v in self.versions} | {v.version for v in self.validation}
        ordered = [v for v in self.order if v in seen]
        return ordered + sorted(seen - set(ordered))


async def load_overview(store: Store, run_id: str) -> Overview:
    async with store.engine.connect() as conn:
        run = (await conn.execute(select(runs.c.name).where(runs.c.id == run_id))).first()
        if run is None:
            raise NotFound(f"no run {run_id!r}")
        order = await version_order(conn, run_id)
        facts = session_facts(run_id, order, TRAIN)
        per_version = await _per_version(conn, facts)
        terminations = {
            _version(v): counts for v, counts in (await termination_counts(conn, facts)).items()
        }
        groups = await _groups(conn, facts, order)
        validation = await _per_version(conn, session_facts(run_id, order, VALIDATION))
        alignment = await _alignment(conn, run_id)
        unfinished = and_(sessions.c.run_id == run_id, sessions.c.termination.is_(None))
        active = await conn.scalar(select(func.count()).where(unfinished))
    rank = {v: i for i, v in enumerate(order)}
    versions = sorted(per_version, key=lambda v: rank.get(v, len(rank)))
    stats = tuple(
        replace(
            per_version[v],
            terminations=terminations.get(v, {}),
            groups=groups.get(v, (0, 0, 0))[0],
            all_failed_groups=groups.get(v, (0, 0, 0))[1],
            all_solved_groups=groups.get(v, (0, 0, 0))[2],
        )
        for v in versions
    )
    reasons = sorted({r for counts in terminations.values() for r in counts})
    held_out = tuple(
        ValidationStats(v.version, v.sessions, v.graded, v.mean_reward, v.solve_rate)
        for v in sorted(validation.values(), key=lambda v: rank.get(v.version, len(rank)))
    )
    return Overview(
        run_id=run_id,
        run_name=str(run.name),
        sessions=sum(s.sessions for s in stats) + sum(v.sessions for v in held_out),
        active=int(active or 0),
        versions=stats,
        alignment=alignment,
        termination_reasons=tuple(reasons),
        validation=held_out,
        order=tuple(order),
    )


def _ratio(numerator: float | int | None, denominator: float | int | None) -> float | None:
    if not denominator:
        return None
    return float(numerator or 0) / float(denominator)


def _version(value: str | None) -> str:
    return value if value else NO_VERSION


async def _per_version(conn: AsyncConnection, facts: Subquery) -> dict[str, VersionStats]:
    graded = facts.c.included == 1
    query = select(
        facts.c.version,
        func.count().label("sessions"),
        func.sum(facts.c.included).label("graded"),
        func.sum(case((graded, facts.c.reward), else_=0.0)).label("reward_sum"),
        func.sum(case((and_(graded, facts.c.reward.is_not(None)), 1), else_=0)).label("rewarded"),
        func.sum(facts.c.solved).label("solved"),
        func.sum(facts.c.turns).label("turns"),
        func.sum(case((facts.c.turns > 0, 1), else_=0)).label("with_turns"),
        func.sum(facts.c.output_tokens).label("output_tokens"),
        func.sum(facts.c.malformed).label("malformed"),
    ).group_by(facts.c.version)
    result: dict[str, VersionStats] = {}
    for row in await conn.execute(query):
        version = _version(row.version)
        result[version] = VersionStats(
            version=version,
            sessions=int(row.sessions),
            graded=int(row.graded or 0),
            mean_reward=_ratio(row.reward_sum, row.rewarded),
            solve_rate=_ratio(row.solved, row.graded),
            turns_per_trajectory=_ratio(row.turns, row.with_turns),
            response_tokens=_ratio(row.output_tokens, row.with_turns),
            malformed_per_turn=_ratio(row.malformed, row.turns),
        )
    return result


async def _groups(
    conn: AsyncConnection, facts: Subquery, order: list[str]
) -> dict[str, tuple[int, int, int]]:
    """Per version: (groups, all failed, all solved)."""
    graded = facts.c.included == 1
    per_group = (
        select(
            func.count().label("n"),
            func.sum(facts.c.solved).label("solved"),
            func.min(facts.c.rank).label("rank"),
        )
        .where(graded, facts.c.reward.is_not(None))
        .group_by(facts.c.group_id)
        .having(func.count() >= 2)
        .subquery("per_group")
    )
    query = select(
        per_group.c.rank,
        func.count().label("groups"),
        func.sum(case((per_group.c.solved == 0, 1), else_=0)).label("all_failed"),
        func.sum(case((per_group.c.solved == per_group.c.n, 1), else_=0)).label("all_solved"),
    ).group_by(per_group.c.rank)
    result: dict[str, tuple[int, int, int]] = {}
    for row in await conn.execute(query):
        version = order[row.rank] if row.rank is not None else NO_VERSION
        result[version] = (int(row.groups), int(row.all_failed or 0), int(row.all_solved or 0))
    return result


async def _alignment(conn: AsyncConnection, run_id: str) -> tuple[AlignmentPoint, ...]:
    query = (
        select(
            alignment_reports.c.step,
            alignment_reports.c.weight_version,
            alignment_reports.c.metrics,
            alignment_reports.c.flagged,
            alignment_reports.c.reasons,
        )
        .where(alignment_reports.c.run_id == run_id)
        .order_by(alignment_reports.c.step.desc())
        .limit(ALIGNMENT_STEPS)
    )
    points = [
        AlignmentPoint(
            step=int(row.step),
            weight_version=str(row.weight_version),
            metrics={
                str(k): float(v) if isinstance(v, int | float) else None
                for k, v in dict(row.metrics or {}).items()
            },
            flagged=bool(row.flagged),
            reasons=tuple(str(reason) for reason in row.reasons or ()),
        )
        for row in await conn.execute(query)
    ]
    return tuple(reversed(points))
