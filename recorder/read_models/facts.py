"""Shared SQL building blocks of the read models: a run's weight-version order and one row
of facts per session, as SQLAlchemy Core selectables that the page queries aggregate over.

Contract:
- ``version_order(conn, run_id)`` lists the run's weight versions in policy order: the
  announced order (``weight_versions.idx``) first, then versions only seen on turns, by
  when they first sampled. One statement.
- ``session_facts(run_id, order, purpose=None)`` is a subquery with one row per session
  of the run (of that ``purpose`` only, when given: ``TRAIN`` for the training numbers, so
  held-out validation sessions never move them): ``id, task_id, group_id, sample_index,
  status, termination, reward, reward_vector, created_at, purpose, version`` (the weight
  version of the session's first turn, NULL without turns), ``rank`` (that version's
  position in ``order``), ``turns``, ``output_tokens``, ``malformed``, ``forks`` (turns
  stored as ``fork``), ``included`` (1 when finished with a termination that counts for
  training), ``excluded`` (1 when finished with one that does not: an environment
  failure) and ``solved`` (1 when included and the scalar ``reward >= SOLVED_REWARD``; a
  vector reward is never a solve). ``reward``/``reward_vector`` are the raw columns: read
  a session's reward with ``recorder.rows.reward_of``.
- ``termination_counts(conn, facts)`` counts the sessions of ``facts`` per (version,
  termination), an unfinished session under ``ACTIVE``; one statement.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Integer, Subquery, and_, case, cast, func, literal, select, union_all
from sqlalchemy.ext.asyncio import AsyncConnection

from recorder.codec import ID_BYTES
from recorder.records import EXCLUDED_TERMINATIONS, PURPOSES
from recorder.schema import sessions, turns, weight_versions

SOLVED_REWARD = 1.0  # a reward at or above this counts as a solve (binary 0/1 graders)
# What the export hands to a trainer; the closed loop's held-out evaluations and its
# validation run (recorder.records.PURPOSES).
TRAIN, VALIDATION, CHECK = PURPOSES
ACTIVE = "active"  # what an unfinished session counts as where terminations are counted


async def version_order(conn: AsyncConnection, run_id: str) -> list[str]:
    announced = select(
        weight_versions.c.version.label("version"),
        literal(0).label("tier"),
        cast(weight_versions.c.idx, Integer).label("pos"),
        literal(0.0).label("seen"),
    ).where(weight_versions.c.run_id == run_id)
    seen = (
        select(
            turns.c.weight_version.label("version"),
            literal(1).label("tier"),
            literal(0).label("pos"),
            func.min(turns.c.created_at).label("seen"),
        )
        .join(sessions, sessions.c.id == turns.c.session_id)
        .where(sessions.c.run_id == run_id, turns.c.weight_version != "")
        .group_by(turns.c.weight_version)
    )
    rows = (await conn.execute(union_all(announced, seen))).all()
    ordered: list[str] = []
    known: set[str] = set()
    for row in sorted(rows, key=lambda r: (r.tier, r.pos, r.seen)):
        if row.version not in known:
            known.add(row.version)
            ordered.append(row.version)
    return ordered


def rank_of(column: Any, order: Sequence[str]) -> Any:
    """SQL expression mapping a version string to its position in ``order`` (NULL if none)."""
    if not order:
        return literal(None, Integer)
    return case({version: index for index, version in enumerate(order)}, value=column)


def session_facts(run_id: str, order: Sequence[str], purpose: str | None = None) -> Subquery:
    stats = (
        select(
            turns.c.session_id,
            func.count().label("turns"),
            func.coalesce(func.sum(func.length(turns.c.output_ids)), 0).label("output_bytes"),
            func.coalesce(func.sum(turns.c.malformed_tool_calls), 0).label("malformed"),
            func.sum(case((turns.c.classification == "fork", 1), else_=0)).label("forks"),
        )
        .group_by(turns.c.session_id)
        .subquery("turn_stats")
    )
    first_version = (
        select(turns.c.weight_version)
        .where(turns.c.session_id == sessions.c.id)
        .order_by(turns.c.seq)
        .limit(1)
        .scalar_subquery()
    )
    included = and_(
        sessions.c.termination.is_not(None),
        sessions.c.termination.not_in(sorted(EXCLUDED_TERMINATIONS)),
    )
    excluded = sessions.c.termination.in_(sorted(EXCLUDED_TERMINATIONS))
    wanted = [sessions.c.run_id == run_id]
    if purpose is not None:
        wanted.append(sessions.c.purpose == purpose)
    inner = (
        select(
            sessions.c.id,
            sessions.c.task_id,
            sessions.c.group_id,
            sessions.c.sample_index,
            sessions.c.status,
            sessions.c.termination,
            sessions.c.reward,
            sessions.c.reward_vector,
            sessions.c.created_at,
            sessions.c.purpose,
            first_version.label("version"),
            func.coalesce(stats.c.turns, 0).label("turns"),
            (func.coalesce(stats.c.output_bytes, 0) / ID_BYTES).label("output_tokens"),
            func.coalesce(stats.c.malformed, 0).label("malformed"),
            func.coalesce(stats.c.forks, 0).label("forks"),
            case((included, 1), else_=0).label("included"),
            case((excluded, 1), else_=0).label("excluded"),
            case(
                (and_(included, sessions.c.reward >= SOLVED_REWARD), 1),
                else_=0,
            ).label("solved"),
        )
        .outerjoin(stats, stats.c.session_id == sessions.c.id)
        .where(*wanted)
        .subquery("inner_facts")
    )
    return select(inner, rank_of(inner.c.version, order).label("rank")).subquery("facts")


async def termination_counts(
    conn: AsyncConnection, facts: Subquery
) -> dict[str | None, dict[str, int]]:
    """{version (None without turns): {termination or ACTIVE: sessions}}."""
    reason = func.coalesce(facts.c.termination, ACTIVE)
    query = select(facts.c.version, reason.label("reason"), func.count().label("n")).group_by(
        facts.c.version, reason
    )
    result: dict[str | None, dict[str, int]] = defaultdict(dict)
    for row in await conn.execute(query):
        result[row.version][str(row.reason)] = int(row.n)
    return dict(result)
