"""The Live UI's paginated lists: runs, tasks of a run, sessions of a run.

Contract: every function runs a fixed number of SQL statements, sorts and pages in SQL
(``LIMIT``/``OFFSET``), and returns a ``Page`` holding one page of frozen rows plus the
total row count. ``sort`` is one of the listed keys (``TASK_SORTS``, ``SESSION_SORTS``; a
leading ``-`` sorts descending, ties go by id) and anything else raises
``InvalidRequest``. ``load_tasks`` compares each task's solve rate at the first and at
the latest weight version it was sampled with, over training sessions (validation
sessions are held-out evaluations, not training samples). ``load_sessions`` lists every
session of the run that passes a ``SessionFilter`` (all of its conditions): task,
termination (``ACTIVE`` for unfinished), purpose, excluded (finished with an
environment failure) or not, forked (``FORK_ANY``, ``FORK_NONE`` or one fork reason:
a session with a turn stored as that fork) and a scalar reward range (a reward bound
leaves out sessions without a scalar reward). ``load_session_choices`` lists what the
filters can take in that run. A session's ``reward`` reads as the recorder's reward rule
says (``recorder.rows.reward_of``: a vector as a tuple); the tasks' solve rates and the
reward filter and sort are scalar-only, as the overview's numbers are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sqlalchemy import ColumnElement, Subquery, and_, case, exists, func, literal, select, union_all

from kernel.errors import InvalidRequest, NotFound
from recorder.read_models.facts import ACTIVE, TRAIN, session_facts, version_order
from recorder.rows import Reward, reward_of
from recorder.schema import runs, sessions, turns
from recorder.store import Store

PAGE_SIZE = 50
TASK_SORTS = ("task", "samples", "first", "latest", "change")
SESSION_SORTS = ("created", "task", "termination", "reward", "turns", "tokens", "forks")
FORK_ANY, FORK_NONE = "any", "none"  # SessionFilter.fork besides a fork reason
_R = TypeVar("_R")


@dataclass(frozen=True, slots=True)
class Page(Generic[_R]):
    rows: tuple[_R, ...]
    total: int
    page: int
    size: int

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.size))


@dataclass(frozen=True, slots=True)
class RunRow:
    id: str
    name: str
    created_at: float
    sessions: int


@dataclass(frozen=True, slots=True)
class TaskRow:
    task_id: str
    samples: int
    first_version: str | None
    latest_version: str | None
    first_rate: float | None
    latest_rate: float | None

    @property
    def change(self) -> float | None:
        if self.first_rate is None or self.latest_rate is None:
            return None
        return self.latest_rate - self.first_rate


@dataclass(frozen=True, slots=True)
class SessionRow:
    id: str
    task_id: str
    group_id: str
    sample_index: int
    status: str
    termination: str | None
    reward: Reward
    version: str | None
    turns: int
    output_tokens: int
    malformed: int
    purpose: str = TRAIN
    forks: int = 0
    excluded: bool = False


@dataclass(frozen=True, slots=True)
class SessionFilter:
    """Which sessions ``load_sessions`` lists; None leaves a condition out."""

    task: str | None = None
    termination: str | None = None  # ACTIVE: not finished yet
    purpose: str | None = None
    excluded: bool | None = None
    fork: str | None = None  # FORK_ANY, FORK_NONE or a fork reason
    min_reward: float | None = None
    max_reward: float | None = None


@dataclass(frozen=True, slots=True)
class SessionChoices:
    """What a run's sessions hold, for the filters: sorted, each once."""

    terminations: tuple[str, ...]  # ACTIVE included while one runs
    purposes: tuple[str, ...]
    fork_reasons: tuple[str, ...]


def _offset(page: int, size: int) -> int:
    if page < 1:
        raise InvalidRequest("page must be 1 or more", param="page")
    return (page - 1) * size


async def load_runs(store: Store, page: int = 1, size: int = PAGE_SIZE) -> Page[RunRow]:
    counts = (
        select(sessions.c.run_id, func.count().label("n"))
        .group_by(sessions.c.run_id)
        .subquery("counts")
    )
    query = (
        select(runs.c.id, runs.c.name, runs.c.created_at, func.coalesce(counts.c.n, 0).label("n"))
        .outerjoin(counts, counts.c.run_id == runs.c.id)
        .order_by(runs.c.created_at.desc(), runs.c.id)
        .limit(size)
        .offset(_offset(page, size))
    )
    async with store.engine.connect() as conn:
        total = int(await conn.scalar(select(func.count()).select_from(runs)) or 0)
        rows = tuple(
            RunRow(str(r.id), str(r.name), float(r.created_at), int(r.n))
            for r in await conn.execute(query)
        )
    return Page(rows, total, page, size)


async def _require_run(store: Store, run_id: str) -> list[str]:
    async with store.engine.connect() as conn:
        if await conn.scalar(select(runs.c.id).where(runs.c.id == run_id)) is None:
            raise NotFound(f"no run {run_id!r}")
        return await version_order(conn, run_id)


async def load_tasks(
    store: Store, run_id: str, sort: str = "task", page: int = 1, size: int = PAGE_SIZE
) -> Page[TaskRow]:
    key = _sort_key(sort, TASK_SORTS)
    order = await _require_run(store, run_id)
    facts = session_facts(run_id, order, TRAIN)
    graded = facts.c.included == 1
    bounds = (
        select(
            facts.c.task_id,
            func.count().label("samples"),
            func.min(facts.c.rank).label("first_rank"),
            func.max(facts.c.rank).label("latest_rank"),
        )
        .where(graded)
        .group_by(facts.c.task_id)
        .subquery("bounds")
    )

    def rate(rank: ColumnElement[Any]) -> ColumnElement[Any]:
        at = and_(graded, facts.c.rank == rank)
        solved = func.sum(case((at, facts.c.solved), else_=0))
        tried = func.sum(case((at, 1), else_=0))
        return case((tried > 0, solved * 1.0 / tried), else_=None)

    first_rate = rate(bounds.c.first_rank)
    latest_rate = rate(bounds.c.latest_rank)
    per_task = (
        select(
            bounds.c.task_id,
            bounds.c.samples,
            bounds.c.first_rank,
            bounds.c.latest_rank,
            first_rate.label("first_rate"),
            latest_rate.label("latest_rate"),
        )
        .join(facts, facts.c.task_id == bounds.c.task_id)
        .group_by(bounds.c.task_id, bounds.c.samples, bounds.c.first_rank, bounds.c.latest_rank)
        .subquery("per_task")
    )
    columns = {
        "task": per_task.c.task_id,
        "samples": per_task.c.samples,
        "first": per_task.c.first_rate,
        "latest": per_task.c.latest_rate,
        "change": per_task.c.latest_rate - per_task.c.first_rate,
    }
    column = columns[key]
    direction = column.desc() if sort.startswith("-") else column.asc()
    query = (
        select(per_task)
        .order_by(direction.nulls_last(), per_task.c.task_id)
        .limit(size)
        .offset(_offset(page, size))
    )
    async with store.engine.connect() as conn:
        total = int(await conn.scalar(select(func.count()).select_from(per_task)) or 0)
        rows = tuple(
            TaskRow(
                task_id=str(r.task_id),
                samples=int(r.samples),
                first_version=order[r.first_rank] if r.first_rank is not None else None,
                latest_version=order[r.latest_rank] if r.latest_rank is not None else None,
                first_rate=None if r.first_rate is None else float(r.first_rate),
                latest_rate=None if r.latest_rate is None else float(r.latest_rate),
            )
            for r in await conn.execute(query)
        )
    return Page(rows, total, page, size)


def _sort_key(sort: str, keys: tuple[str, ...]) -> str:
    key = sort.removeprefix("-")
    if key not in keys:
        raise InvalidRequest(f"sort must be one of {', '.join(keys)}", param="sort")
    return key


def _conditions(facts: Subquery, wanted: SessionFilter) -> list[ColumnElement[bool]]:
    conditions: list[ColumnElement[bool]] = []
    if wanted.task is not None:
        conditions.append(facts.c.task_id == wanted.task)
    if wanted.termination == ACTIVE:
        conditions.append(facts.c.termination.is_(None))
    elif wanted.termination is not None:
        conditions.append(facts.c.termination == wanted.termination)
    if wanted.purpose is not None:
        conditions.append(facts.c.purpose == wanted.purpose)
    if wanted.excluded is not None:
        conditions.append(facts.c.excluded == int(wanted.excluded))
    if wanted.fork == FORK_ANY:
        conditions.append(facts.c.forks > 0)
    elif wanted.fork == FORK_NONE:
        conditions.append(facts.c.forks == 0)
    elif wanted.fork is not None:
        forked = exists().where(
            turns.c.session_id == facts.c.id,
            turns.c.classification == "fork",
            turns.c.fork_reason == wanted.fork,
        )
        conditions.append(forked)
    if wanted.min_reward is not None:
        conditions.append(facts.c.reward >= wanted.min_reward)
    if wanted.max_reward is not None:
        conditions.append(facts.c.reward <= wanted.max_reward)
    return conditions


async def load_sessions(
    store: Store,
    run_id: str,
    page: int = 1,
    size: int = PAGE_SIZE,
    *,
    wanted: SessionFilter = SessionFilter(),
    sort: str = "-created",
) -> Page[SessionRow]:
    key = _sort_key(sort, SESSION_SORTS)
    order = await _require_run(store, run_id)
    facts = session_facts(run_id, order)
    columns = {
        "created": facts.c.created_at,
        "task": facts.c.task_id,
        "termination": facts.c.termination,
        "reward": facts.c.reward,
        "turns": facts.c.turns,
        "tokens": facts.c.output_tokens,
        "forks": facts.c.forks,
    }
    column = columns[key]
    direction = column.desc() if sort.startswith("-") else column.asc()
    conditions = _conditions(facts, wanted)
    query = (
        select(facts)
        .where(*conditions)
        .order_by(direction.nulls_last(), facts.c.id)
        .limit(size)
        .offset(_offset(page, size))
    )
    async with store.engine.connect() as conn:
        counted = select(func.count()).select_from(facts).where(*conditions)
        total = int(await conn.scalar(counted) or 0)
        rows = tuple(
            SessionRow(
                id=str(r.id),
                task_id=str(r.task_id),
                group_id=str(r.group_id),
                sample_index=int(r.sample_index),
                status=str(r.status),
                termination=r.termination,
                reward=reward_of(r.reward, r.reward_vector),
                version=r.version,
                turns=int(r.turns),
                output_tokens=int(r.output_tokens),
                malformed=int(r.malformed),
                purpose=str(r.purpose),
                forks=int(r.forks),
                excluded=bool(r.excluded),
            )
            for r in await conn.execute(query)
        )
    return Page(rows, total, page, size)


def _kind(name: str) -> Any:
    return literal(name).label("kind")


async def load_session_choices(store: Store, run_id: str) -> SessionChoices:
    await _require_run(store, run_id)
    of_run = sessions.c.run_id == run_id
    termination = func.coalesce(sessions.c.termination, ACTIVE)
    query = union_all(
        select(_kind("termination"), termination.label("value")).where(of_run).distinct(),
        select(_kind("purpose"), sessions.c.purpose.label("value")).where(of_run).distinct(),
        select(_kind("fork"), turns.c.fork_reason.label("value"))
        .join(sessions, sessions.c.id == turns.c.session_id)
        .where(of_run, turns.c.classification == "fork", turns.c.fork_reason.is_not(None))
        .distinct(),
    )
    found: dict[str, set[str]] = {"termination": set(), "purpose": set(), "fork": set()}
    async with store.engine.connect() as conn:
        for row in await conn.execute(query):
            found[str(row.kind)].add(str(row.value))
    return SessionChoices(
        terminations=tuple(sorted(found["termination"])),
        purposes=tuple(sorted(found["purpose"])),
        fork_reasons=tuple(sorted(found["fork"])),
    )
