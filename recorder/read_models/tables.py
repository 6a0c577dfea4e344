"""The Live UI's paginated lists: runs, tasks of a run, sessions of a run.

Contract: every function runs a fixed number of SQL statements, sorts and pages in SQL
(``LIMIT``/``OFFSET``), and returns a ``Page`` holding one page of frozen rows plus the
total row count. ``load_tasks`` compares each task's solve rate at the first and at the
latest weight version it was sampled with; ``sort`` is one of ``TASK_SORTS`` (a leading
``-`` sorts descending) and anything else raises ``InvalidRequest``. A session's
``reward`` reads as the recorder's reward rule says (``recorder.rows.reward_of``: a
vector as a tuple); the tasks' solve rates are scalar-only, as the overview's are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sqlalchemy import ColumnElement, and_, case, func, select

from kernel.errors import InvalidRequest, NotFound
from recorder.read_models.facts import session_facts, version_order
from recorder.rows import Reward, reward_of
from recorder.schema import runs, sessions
from recorder.store import Store

PAGE_SIZE = 50
TASK_SORTS = ("task", "samples", "first", "latest", "change")
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
    key = sort.removeprefix("-")
    if key not in TASK_SORTS:
        raise InvalidRequest(f"sort must be one of {', '.join(TASK_SORTS)}", param="sort")
    order = await _require_run(store, run_id)
    facts = session_facts(run_id, order)
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


async def load_sessions(
    store: Store, run_id: str, page: int = 1, size: int = PAGE_SIZE
) -> Page[SessionRow]:
    order = await _require_run(store, run_id)
    facts = session_facts(run_id, order)
    query = (
        select(facts)
        .order_by(facts.c.created_at.desc(), facts.c.id)
        .limit(size)
        .offset(_offset(page, size))
    )
    async with store.engine.connect() as conn:
        total = int(await conn.scalar(select(func.count()).where(sessions.c.run_id == run_id)) or 0)
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
            )
            for r in await conn.execute(query)
        )
    return Page(rows, total, page, size)
