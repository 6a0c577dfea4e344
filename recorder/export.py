"""Storage of the export API: weight versions, group claims with leases, acks, alignment.

Contract:
- ``announce_version(run, v)`` appends ``v`` to the run's announced order (``index`` 0, 1,
  ...); announcing a version again returns its existing entry. Staleness is measured in
  this order; a version never announced has index -1 (older than everything).
- ``claim(run, groups, max_staleness, lease_s)`` leases up to ``groups`` COMPLETE prompt
  groups (every session finished, and as many sessions as the group's declared size:
  ``recorder.groups``) to a new batch, in the order the groups were created.
  A group is never handed to two live leases: on Postgres the lease rows are taken with
  ``SELECT ... FOR UPDATE SKIP LOCKED`` and new ones with ``INSERT ... ON CONFLICT DO
  NOTHING``; on SQLite the whole claim is one ``BEGIN IMMEDIATE`` transaction. Sessions
  whose termination is excluded (environment failures) are left out of a group's
  samples; a group with only excluded sessions is marked ``skipped`` and never delivered.
  A group whose staleness (current announced index minus the index of the oldest version
  any of its sampled tokens came from) exceeds ``max_staleness`` is not delivered now and
  stays in the pool (it is counted in ``Claim.stale_groups``; a later claim with a larger
  bound may take it). ``zero_variance_groups`` counts delivered groups whose samples all
  have the same reward (all-fail / all-pass carry no GRPO signal).
- ``ack(batch)`` commits a batch for good (idempotent). Once a lease expired, the next
  claim may hand its groups out again; acking such a batch raises ``Conflict``. An
  expired lease whose groups nobody took yet can still be acked.
- ``set_broken(batch, group, reason)``: a leased group one of whose sessions cannot be
  read into a sample (its recorded turns do not chain) leaves the batch for good (state
  ``broken``, never delivered), so one broken session never blocks a run's export.
  ``abandon(batch)`` hands a batch's groups back to the pool at once (a claim whose body
  could not be completed).
- ``record_alignment``/``list_alignment``: the trainer's per-step alignment reports
  (posting a step again replaces it).
- ``set_worker_exclusions(exclude, include)`` / ``worker_exclusions()``: backend workers a
  trainer took out of rotation (url -> why) after a failed weight sync to a plain worker
  list; every replica polls them with the paused runs (``Store.pause_state``, on the
  per-turn path) and routes no turn to them.

Unknown runs and batches raise ``NotFound``; database failures ``RecorderError``.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import case, delete, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from kernel.errors import Conflict, NotFound
from recorder import groups as prompt_group
from recorder.database import create_engine, is_sqlite, parse_url, transaction
from recorder.records import EXCLUDED_TERMINATIONS, SessionStatus, TurnStatus
from recorder.rows import Reward, reward_of
from recorder.schema import (
    alignment_reports,
    batches,
    group_leases,
    runs,
    sessions,
    turns,
    weight_versions,
    worker_exclusions,
)

log = logging.getLogger(__name__)

LEASED, ACKED, SKIPPED, BROKEN = "leased", "acked", "skipped", "broken"


@dataclass(frozen=True, slots=True)
class WeightVersion:
    run_id: str
    version: str
    index: int
    created_at: float


@dataclass(frozen=True, slots=True)
class ClaimedGroup:
    group_id: str
    task_id: str
    session_ids: tuple[str, ...]  # the non-excluded sessions, by sample index
    staleness: int


@dataclass(frozen=True, slots=True)
class Claim:
    batch_id: str | None  # None when nothing was ready (no batch was created)
    lease_expires_at: float | None
    groups: tuple[ClaimedGroup, ...]
    zero_variance_groups: int
    stale_groups: int
    reclaimed_groups: int = 0  # taken over from leases that expired unacked


@dataclass(frozen=True, slots=True)
class AlignmentReport:
    run_id: str
    step: int
    weight_version: str
    metrics: Mapping[str, float | None]
    flagged: bool
    created_at: float
    reasons: tuple[str, ...] = ()  # the trainer's, in words, when flagged


class ExportStore:
    def __init__(self, engine: AsyncEngine, *, sqlite_dialect: bool) -> None:
        self._engine = engine
        self._sqlite = sqlite_dialect

    @classmethod
    def open(cls, url: str) -> ExportStore:
        # SQLite: BEGIN IMMEDIATE serializes claims across processes (read-then-write).
        return cls(
            create_engine(url, serialize_sqlite_transactions=True),
            sqlite_dialect=is_sqlite(parse_url(url)),
        )

    async def close(self) -> None:
        await self._engine.dispose()

    # -- weight versions --------------------------------------------------------
    async def announce_version(self, run_id: str, version: str) -> WeightVersion:
        async with transaction(self._engine, f"announce weight version of run {run_id}") as conn:
            await _require_run(conn, run_id)
            known = await _versions(conn, run_id)
            for entry in known:
                if entry.version == version:
                    return entry
            entry = WeightVersion(run_id, version, len(known), time.time())
            await conn.execute(
                weight_versions.insert().values(
                    run_id=run_id, idx=entry.index, version=version, created_at=entry.created_at
                )
            )
        return entry

    async def list_versions(self, run_id: str) -> list[WeightVersion]:
        async with transaction(self._engine, f"list weight versions of run {run_id}") as conn:
            await _require_run(conn, run_id)
            return await _versions(conn, run_id)

    # -- pause ------------------------------------------------------------------------
    async def set_paused(self, run_id: str, paused: bool) -> None:
        async with transaction(self._engine, f"pause run {run_id}") as conn:
            await _require_run(conn, run_id)
            await conn.execute(update(runs).where(runs.c.id == run_id).values(paused=paused))

    async def paused_runs(self) -> frozenset[str]:
        async with transaction(self._engine, "list paused runs") as conn:
            result = await conn.execute(select(runs.c.id).where(runs.c.paused.is_(True)))
            return frozenset(str(row[0]) for row in result)

    # -- worker exclusions ------------------------------------------------------------
    async def set_worker_exclusions(
        self, exclude: Mapping[str, str], include: Iterable[str]
    ) -> dict[str, str]:
        """Take the ``exclude`` workers (url -> why) out of rotation and put ``include``
        back; the exclusions in force afterwards. Excluding one again replaces its reason."""
        urls = [url.rstrip("/") for url in exclude]
        async with transaction(self._engine, "set worker exclusions") as conn:
            back = [url.rstrip("/") for url in include]
            if urls or back:
                await conn.execute(
                    delete(worker_exclusions).where(worker_exclusions.c.url.in_([*urls, *back]))
                )
            if urls:
                now = time.time()
                await conn.execute(
                    worker_exclusions.insert(),
                    [
                        {"url": url, "reason": reason, "created_at": now}
                        for url, reason in zip(urls, exclude.values(), strict=True)
                    ],
                )
            return await _exclusions(conn)

    async def worker_exclusions(self) -> dict[str, str]:
        async with transaction(self._engine, "list worker exclusions") as conn:
            return await _exclusions(conn)

    # -- claims -------------------------------------------------------------------
    async def claim(
        self,
        run_id: str,
        groups: int,
        max_staleness: int | None,
        lease_s: float,
        *,
        read_grace_s: float = 0.0,
    ) -> Claim:
        """``read_grace_s`` extends the lease while the caller reads the samples; it then
        starts the lease proper with ``start_lease`` (``Claim.lease_expires_at`` is the
        lease without the grace, a lower bound of the real one)."""
        now = time.time()
        batch_id = uuid.uuid4().hex
        expires = now + lease_s + read_grace_s
        claimed: list[ClaimedGroup] = []
        rewards: list[list[Reward]] = []
        stale = 0
        reclaimed = 0
        async with transaction(self._engine, f"claim groups of run {run_id}") as conn:
            await _require_run(conn, run_id)
            versions = await _versions(conn, run_id)
            index = {v.version: v.index for v in versions}
            current = versions[-1].index if versions else -1
            for group_id in await self._candidates(conn, run_id, now):
                if len(claimed) >= groups:
                    break
                # A session joining the group now waits for this transaction, or went first
                # and is read below (recorder.groups).
                await prompt_group.lock(conn, run_id, group_id)
                members = (
                    await conn.execute(
                        select(
                            sessions.c.id,
                            sessions.c.task_id,
                            sessions.c.termination,
                            sessions.c.reward,
                            sessions.c.reward_vector,
                            sessions.c.status,
                        )
                        .where(sessions.c.run_id == run_id, sessions.c.group_id == group_id)
                        .order_by(sessions.c.sample_index, sessions.c.id)
                    )
                ).all()
                if any(m.status != SessionStatus.FINISHED.value for m in members):
                    continue  # a sample joined after the candidates were read
                kept = [m for m in members if m.termination not in EXCLUDED_TERMINATIONS]
                if not kept:
                    await self._skip(conn, run_id, group_id, now)
                    continue
                staleness = current - await _oldest_index(conn, [m.id for m in kept], index)
                if max_staleness is not None and staleness > max_staleness:
                    stale += 1
                    continue
                lease = await self._lease(conn, run_id, group_id, batch_id, expires, now)
                if lease is None:
                    continue  # another claimer holds it right now
                reclaimed += lease == "reclaimed"
                claimed.append(
                    ClaimedGroup(group_id, kept[0].task_id, tuple(m.id for m in kept), staleness)
                )
                rewards.append([reward_of(m.reward, m.reward_vector) for m in kept])
            if claimed:
                await conn.execute(
                    batches.insert().values(
                        id=batch_id,
                        run_id=run_id,
                        created_at=now,
                        lease_expires_at=expires,
                        group_count=len(claimed),
                    )
                )
        zero_variance = sum(1 for values in rewards if all(v == values[0] for v in values))
        return Claim(
            batch_id=batch_id if claimed else None,
            lease_expires_at=now + lease_s if claimed else None,
            groups=tuple(claimed),
            zero_variance_groups=zero_variance,
            stale_groups=stale,
            reclaimed_groups=reclaimed,
        )

    async def _candidates(self, conn: AsyncConnection, run_id: str, now: float) -> list[str]:
        unfinished = func.sum(case((sessions.c.status != SessionStatus.FINISHED.value, 1), else_=0))
        taken = select(group_leases.c.group_id).where(
            group_leases.c.run_id == run_id,
            (group_leases.c.state != LEASED) | (group_leases.c.lease_expires_at > now),
        )
        rows = await conn.execute(
            select(sessions.c.group_id)
            .where(sessions.c.run_id == run_id, sessions.c.group_id.not_in(taken))
            .where(~prompt_group.below_size(run_id))
            # A group holding any validation session is never a training group.
            .having(func.max(case((sessions.c.purpose != "train", 1), else_=0)) == 0)
            .group_by(sessions.c.group_id)
            .having(unfinished == 0)
            .order_by(func.min(sessions.c.created_at), sessions.c.group_id)
        )
        return [row.group_id for row in rows]

    async def _lease(
        self,
        conn: AsyncConnection,
        run_id: str,
        group_id: str,
        batch_id: str,
        expires: float,
        now: float,
    ) -> str | None:
        """Lease the group: "new", "reclaimed" (its earlier lease expired), or None (held)."""
        key = (group_leases.c.run_id == run_id, group_leases.c.group_id == group_id)
        expired = await conn.scalar(
            select(group_leases.c.group_id)
            .where(*key, group_leases.c.state == LEASED, group_leases.c.lease_expires_at <= now)
            .with_for_update(skip_locked=True)
        )
        if expired is not None:
            result = await conn.execute(
                update(group_leases)
                .where(*key, group_leases.c.state == LEASED, group_leases.c.lease_expires_at <= now)
                .values(batch_id=batch_id, lease_expires_at=expires, updated_at=now)
            )
            return "reclaimed" if result.rowcount == 1 else None
        insert = (sqlite if self._sqlite else postgresql).insert(group_leases)
        result = await conn.execute(
            insert.values(
                run_id=run_id,
                group_id=group_id,
                state=LEASED,
                batch_id=batch_id,
                lease_expires_at=expires,
                updated_at=now,
            )
            .on_conflict_do_nothing(index_elements=["run_id", "group_id"])
            .returning(group_leases.c.group_id)
        )
        return "new" if result.first() is not None else None

    async def _skip(self, conn: AsyncConnection, run_id: str, group_id: str, now: float) -> None:
        insert = (sqlite if self._sqlite else postgresql).insert(group_leases)
        await conn.execute(
            insert.values(
                run_id=run_id, group_id=group_id, state=SKIPPED, updated_at=now
            ).on_conflict_do_nothing(index_elements=["run_id", "group_id"])
        )

    async def set_broken(self, batch_id: str, group_id: str, reason: str) -> None:
        async with transaction(self._engine, f"set group {group_id!r} broken") as conn:
            result = await conn.execute(
                update(group_leases)
                .where(group_leases.c.batch_id == batch_id, group_leases.c.group_id == group_id)
                .values(state=BROKEN, batch_id=None, lease_expires_at=None, updated_at=time.time())
            )
            if result.rowcount:
                await conn.execute(
                    update(batches)
                    .where(batches.c.id == batch_id)
                    .values(group_count=batches.c.group_count - result.rowcount)
                )
        log.error("export: group %s left out of batch %s for good: %s", group_id, batch_id, reason)

    async def abandon(self, batch_id: str) -> None:
        async with transaction(self._engine, f"abandon batch {batch_id}") as conn:
            await conn.execute(
                delete(group_leases).where(
                    group_leases.c.batch_id == batch_id, group_leases.c.state == LEASED
                )
            )
            await conn.execute(
                update(batches).where(batches.c.id == batch_id).values(lease_expires_at=0.0)
            )

    async def start_lease(self, batch_id: str, lease_s: float) -> float:
        """Start the batch's lease now (once its samples are read): its new expiry."""
        expires = time.time() + lease_s
        async with transaction(self._engine, f"start the lease of batch {batch_id}") as conn:
            await conn.execute(
                update(batches).where(batches.c.id == batch_id).values(lease_expires_at=expires)
            )
            await conn.execute(
                update(group_leases)
                .where(group_leases.c.batch_id == batch_id, group_leases.c.state == LEASED)
                .values(lease_expires_at=expires)
            )
        return expires

    async def ack(self, batch_id: str) -> None:
        async with transaction(self._engine, f"ack batch {batch_id}") as conn:
            batch = (await conn.execute(select(batches).where(batches.c.id == batch_id))).first()
            if batch is None:
                raise NotFound(f"batch {batch_id!r} not found")
            if batch.acked_at is not None:
                return
            result = await conn.execute(
                update(group_leases)
                .where(group_leases.c.batch_id == batch_id, group_leases.c.state == LEASED)
                .values(state=ACKED, updated_at=time.time())
            )
            if result.rowcount != batch.group_count:
                # Raising rolls the partial update back: the groups stay with their new lease.
                raise Conflict(
                    f"batch {batch_id!r}: its lease expired and "
                    f"{batch.group_count - result.rowcount} of its groups were handed out again"
                )
            await conn.execute(
                update(batches).where(batches.c.id == batch_id).values(acked_at=time.time())
            )

    # -- alignment ------------------------------------------------------------------
    async def record_alignment(self, report: AlignmentReport) -> None:
        key = (
            alignment_reports.c.run_id == report.run_id,
            alignment_reports.c.step == report.step,
        )
        async with transaction(self._engine, f"record alignment of run {report.run_id}") as conn:
            await _require_run(conn, report.run_id)
            await conn.execute(delete(alignment_reports).where(*key))
            await conn.execute(
                alignment_reports.insert().values(
                    run_id=report.run_id,
                    step=report.step,
                    weight_version=report.weight_version,
                    metrics=dict(report.metrics),
                    flagged=int(report.flagged),
                    created_at=report.created_at,
                    reasons=list(report.reasons) or None,
                )
            )

    async def list_alignment(self, run_id: str) -> list[AlignmentReport]:
        async with transaction(self._engine, f"list alignment of run {run_id}") as conn:
            await _require_run(conn, run_id)
            rows = await conn.execute(
                select(alignment_reports)
                .where(alignment_reports.c.run_id == run_id)
                .order_by(alignment_reports.c.step)
            )
            return [
                AlignmentReport(
                    run_id=row.run_id,
                    step=row.step,
                    weight_version=row.weight_version,
                    metrics=row.metrics,
                    flagged=bool(row.flagged),
                    created_at=row.created_at,
                    reasons=tuple(str(reason) for reason in row.reasons or ()),
                )
                for row in rows
            ]


_EXCLUSIONS = select(worker_exclusions).order_by(worker_exclusions.c.url)


async def _exclusions(conn: AsyncConnection) -> dict[str, str]:
    rows = await conn.execute(_EXCLUSIONS)
    return {str(row.url): str(row.reason) for row in rows}


async def _require_run(conn: AsyncConnection, run_id: str) -> None:
    if await conn.scalar(select(runs.c.id).where(runs.c.id == run_id)) is None:
        raise NotFound(f"run {run_id!r} not found")


async def _versions(conn: AsyncConnection, run_id: str) -> list[WeightVersion]:
    rows = await conn.execute(
        select(weight_versions)
        .where(weight_versions.c.run_id == run_id)
        .order_by(weight_versions.c.idx)
    )
    return [WeightVersion(r.run_id, r.version, r.idx, r.created_at) for r in rows]


async def _oldest_index(
    conn: AsyncConnection, session_ids: Sequence[str], index: Mapping[str, int]
) -> int:
    """Announced index of the oldest policy that sampled any token of these sessions."""
    rows = await conn.execute(
        select(turns.c.weight_version, turns.c.weight_version_spans).where(
            turns.c.session_id.in_(list(session_ids)),
            turns.c.status == TurnStatus.COMPLETED.value,
        )
    )
    used: set[str] = set()
    for row in rows:
        spans = row.weight_version_spans
        if spans:
            used.update(str(span[0]) for span in spans)
        else:
            used.add(row.weight_version)
    if not used:
        return max(index.values(), default=-1)  # nothing sampled: as fresh as it gets
    return min(index.get(version, -1) for version in used)
