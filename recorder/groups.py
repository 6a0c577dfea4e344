"""Prompt groups: when a group is complete, and what may still join it.

A prompt group is the set of sessions (samples) of one prompt that GRPO compares; the
export hands a group to a trainer only when it is complete, and only once. Owns the
``prompt_groups`` rows and the rules, for ``Store.create_session`` and the export:

- The orchestrator declares a group's ``size`` when it creates a session (any of them; a
  later session may repeat it, a different size is ``Conflict``), or closes the group
  (``close``) once every sample is created. A group is **complete** when every one of its
  sessions is finished and, if a size was declared, it has that many sessions.
- A group with neither a size nor a close is taken as complete when all the sessions it
  has are finished (the rule before sizes existed). Either way nothing joins a group that
  is full, closed, or already handed out (``Conflict``), so a late sample is refused when
  it is created, never silently left out of the group the trainer got.
- ``join(conn, run_id, group_id, size)`` runs inside the session's creating transaction
  and takes the group row's lock first (SQLite: its write lock), so a claim deciding the
  group is complete and a session joining it never interleave.
- ``below_size(run_id)`` is the condition on ``sessions.group_id`` that leaves out groups
  whose declared size is not reached yet (for the export's candidates query).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import ColumnElement, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from kernel.errors import Conflict, NotFound
from recorder.schema import group_leases, prompt_groups, sessions


@dataclass(frozen=True, slots=True)
class GroupInfo:
    run_id: str
    group_id: str
    size: int | None
    closed: bool
    sessions: int
    exported: bool


async def join(
    conn: AsyncConnection, run_id: str, group_id: str, size: int | None, *, sqlite_dialect: bool
) -> None:
    """Check that one more session may join the group (creating its row if new)."""
    insert = (sqlite if sqlite_dialect else postgresql).insert(prompt_groups)
    await conn.execute(
        insert.values(
            run_id=run_id, group_id=group_id, size=size, created_at=time.time()
        ).on_conflict_do_nothing(index_elements=["run_id", "group_id"])
    )
    info = await _info(conn, run_id, group_id, lock=True)
    assert info is not None  # inserted above, or there already
    where = f"group {group_id!r}"
    if info.exported:
        raise Conflict(
            f"{where} was already handed to a trainer; a late sample would never reach it. "
            "Declare 'group_size' when creating a group's sessions, or close the group",
            param="group_id",
        )
    if info.closed:
        raise Conflict(f"{where} is closed: it takes no more sessions", param="group_id")
    if size is not None and info.size is not None and size != info.size:
        raise Conflict(f"{where} was declared of size {info.size}, not {size}", param="group_size")
    if size is not None and info.size is None:
        await conn.execute(
            update(prompt_groups)
            .where(prompt_groups.c.run_id == run_id, prompt_groups.c.group_id == group_id)
            .values(size=size)
        )
    declared = size if size is not None else info.size
    if declared is not None and info.sessions >= declared:
        raise Conflict(f"{where} already has its {declared} sessions", param="group_id")


async def close(conn: AsyncConnection, run_id: str, group_id: str) -> GroupInfo:
    """Close the group (idempotent): it takes no more sessions and is complete once all of
    them are finished. An unknown group raises ``NotFound``."""
    info = await _info(conn, run_id, group_id, lock=True)
    if info is None:
        raise NotFound(f"group {group_id!r} of run {run_id!r} not found")
    if not info.closed:
        await conn.execute(
            update(prompt_groups)
            .where(prompt_groups.c.run_id == run_id, prompt_groups.c.group_id == group_id)
            .values(closed_at=time.time())
        )
    return GroupInfo(run_id, group_id, info.size, True, info.sessions, info.exported)


async def lock(conn: AsyncConnection, run_id: str, group_id: str) -> None:
    """Lock the group row for the rest of the transaction (the export, before it decides)."""
    await conn.execute(
        select(prompt_groups.c.group_id)
        .where(prompt_groups.c.run_id == run_id, prompt_groups.c.group_id == group_id)
        .with_for_update()
    )


def below_size(run_id: str) -> ColumnElement[bool]:
    """``sessions.group_id`` names a group of ``run_id`` whose declared size is not reached."""
    members = (
        select(func.count())
        .select_from(sessions)
        .where(sessions.c.run_id == run_id, sessions.c.group_id == prompt_groups.c.group_id)
        .scalar_subquery()
    )
    short = select(prompt_groups.c.group_id).where(
        prompt_groups.c.run_id == run_id,
        prompt_groups.c.size.is_not(None),
        members < prompt_groups.c.size,
    )
    return sessions.c.group_id.in_(short)


async def _info(
    conn: AsyncConnection, run_id: str, group_id: str, *, lock: bool
) -> GroupInfo | None:
    query = select(prompt_groups).where(
        prompt_groups.c.run_id == run_id, prompt_groups.c.group_id == group_id
    )
    row = (await conn.execute(query.with_for_update() if lock else query)).first()
    if row is None:
        return None
    count = await conn.scalar(
        select(func.count())
        .select_from(sessions)
        .where(sessions.c.run_id == run_id, sessions.c.group_id == group_id)
    )
    exported = await conn.scalar(
        select(group_leases.c.group_id).where(
            group_leases.c.run_id == run_id, group_leases.c.group_id == group_id
        )
    )
    return GroupInfo(
        run_id, group_id, row.size, row.closed_at is not None, int(count or 0), exported is not None
    )
