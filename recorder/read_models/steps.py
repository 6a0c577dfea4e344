"""Where a run's trials spend their time and how they end, per trainer step.

This is LEGO-RL's Table 4 (seconds per stage: mean, p50, p90, p99 and share of the trial
time) and Figure 4 (sessions by termination reason), computed per weight version (one
per trainer step) and over the whole run, for training sessions only: a validation trial
is a held-out evaluation and does not move a training step's numbers.

Contract: ``load_steps(store, run_id)`` raises ``NotFound`` for an unknown run and
otherwise returns ``Steps`` in four statements whatever the run's size. Stage seconds
come from what each trial reported at finish (``sessions.stages``, ``STAGES``); a trial
that reported none is not a timed trial, and a stage a trial did not report is left out
of that stage's numbers. A trial's ``total`` is the sum of the stages it reported, and a
stage's ``share`` is its summed seconds over the summed totals of the same trials scope,
so the shares of a scope add up to 1. Percentiles are nearest-rank: ``pN`` is the
smallest value with at least N% of the scope's values at or below it (of 10 values, p50
is the 5th smallest, p90 the 9th, p99 the 10th). Terminations are counted per version,
an unfinished session as ``ACTIVE``; sessions without turns count under ``NO_VERSION``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import (
    Float,
    Subquery,
    Text,
    case,
    cast,
    func,
    literal,
    null,
    or_,
    select,
    union_all,
)

from kernel.errors import NotFound
from recorder.read_models.facts import TRAIN, session_facts, termination_counts, version_order
from recorder.read_models.overview import NO_VERSION
from recorder.records import STAGES
from recorder.schema import runs, sessions
from recorder.store import Store

TOTAL = "total"  # the stage name of a trial's summed time
PERCENTILES = (50, 90, 99)


@dataclass(frozen=True, slots=True)
class StageStats:
    stage: str  # one of STAGES, or TOTAL
    trials: int  # trials that reported this stage
    mean: float
    p50: float
    p90: float
    p99: float
    share: float | None  # of the scope's trial time; None when that time is zero


@dataclass(frozen=True, slots=True)
class StepTrials:
    """One scope's numbers: one weight version, or the whole run."""

    version: str
    timed: int  # trials that reported stage times
    stages: tuple[StageStats, ...]  # in STAGES order, reported stages only, then TOTAL
    terminations: Mapping[str, int] = field(default_factory=dict)

    @property
    def sessions(self) -> int:
        return sum(self.terminations.values())

    def stage(self, name: str) -> StageStats | None:
        return next((s for s in self.stages if s.stage == name), None)


@dataclass(frozen=True, slots=True)
class Steps:
    run_id: str
    run_name: str
    whole_run: StepTrials  # version "" : every training session of the run
    versions: tuple[StepTrials, ...]  # in policy order
    termination_reasons: tuple[str, ...]


async def load_steps(store: Store, run_id: str) -> Steps:
    async with store.engine.connect() as conn:
        run = (await conn.execute(select(runs.c.name).where(runs.c.id == run_id))).first()
        if run is None:
            raise NotFound(f"no run {run_id!r}")
        order = await version_order(conn, run_id)
        facts = session_facts(run_id, order, TRAIN)
        stage_rows = (await conn.execute(_stage_query(facts))).all()
        counts = {_version(v): c for v, c in (await termination_counts(conn, facts)).items()}

    # (whole run?, version) -> stage -> (trials, summed seconds, p50, p90, p99)
    raw: dict[tuple[int, str], dict[str, tuple[int, float, float, float, float]]] = {}
    for row in stage_rows:
        scope = (1, "") if row.whole else (0, _version(row.version))
        raw.setdefault(scope, {})[str(row.stage)] = (
            int(row.n),
            float(row.total_s),
            float(row.p50),
            float(row.p90),
            float(row.p99),
        )
    versions = set(counts) | {v for whole, v in raw if not whole}
    rank = {v: i for i, v in enumerate(order)}

    def scope_of(whole: int, version: str, terminations: Mapping[str, int]) -> StepTrials:
        stages = raw.get((whole, version), {})
        trials, time_s = stages.get(TOTAL, (0, 0.0))[:2]
        stats = tuple(
            StageStats(name, n, sum_s / n, p50, p90, p99, sum_s / time_s if time_s else None)
            for name in (*STAGES, TOTAL)
            if name in stages
            for n, sum_s, p50, p90, p99 in (stages[name],)
        )
        return StepTrials(version, int(trials), stats, terminations)

    everything: dict[str, int] = {}
    for per_version in counts.values():
        for reason, n in per_version.items():
            everything[reason] = everything.get(reason, 0) + n
    return Steps(
        run_id=run_id,
        run_name=str(run.name),
        whole_run=scope_of(1, "", everything),
        versions=tuple(
            scope_of(0, v, counts.get(v, {}))
            for v in sorted(versions, key=lambda v: rank.get(v, len(rank)))
        ),
        termination_reasons=tuple(sorted(everything)),
    )


def _version(value: str | None) -> str:
    return value if value else NO_VERSION


def _stage_query(facts: Subquery) -> Any:
    """(whole, version, stage, n, total_s, p50, p90, p99): one row per scope and stage."""
    timed = (
        select(facts.c.version, sessions.c.stages)
        .join(sessions, sessions.c.id == facts.c.id)
        .where(sessions.c.stages.is_not(None))
        .subquery("timed")
    )
    seconds = {name: timed.c.stages[name].as_float() for name in STAGES}
    per_stage = [
        select(timed.c.version, literal(name).label("stage"), value.label("seconds")).where(
            value.is_not(None)
        )
        for name, value in seconds.items()
    ]
    total = sum((func.coalesce(value, 0.0) for value in seconds.values()), literal(0.0, Float))
    # A trial finished without stage times holds SQL NULL, or JSON null (what a JSON column
    # makes of None): either way no stage reads back, and it is not a timed trial.
    reported = or_(*(value.is_not(None) for value in seconds.values()))
    per_stage.append(
        select(timed.c.version, literal(TOTAL).label("stage"), total.label("seconds")).where(
            reported
        )
    )
    values = union_all(*per_stage).subquery("stage_values")
    # Each value twice: once in its version's scope, once in the whole run's.
    scoped = union_all(
        select(literal(0).label("whole"), values.c.version, values.c.stage, values.c.seconds),
        select(
            literal(1).label("whole"),
            cast(null(), Text).label("version"),
            values.c.stage,
            values.c.seconds,
        ),
    ).subquery("scoped")
    scope = (scoped.c.whole, scoped.c.version, scoped.c.stage)
    ranked = select(
        scoped,
        func.row_number().over(partition_by=scope, order_by=scoped.c.seconds).label("r"),
        func.count().over(partition_by=scope).label("n"),
    ).subquery("ranked")

    def nearest_rank(percent: int) -> Any:
        # The smallest rank r with r >= percent% of n, in integers (no CEIL in SQLite).
        reached = ranked.c.r * 100 >= percent * ranked.c.n
        return func.min(case((reached, ranked.c.seconds), else_=None))

    return select(
        ranked.c.whole,
        ranked.c.version,
        ranked.c.stage,
        func.count().label("n"),
        func.sum(ranked.c.seconds).label("total_s"),
        *(nearest_rank(p).label(f"p{p}") for p in PERCENTILES),
    ).group_by(ranked.c.whole, ranked.c.version, ranked.c.stage)
