"""SessionCache (issue 16, item 10): a flood of unknown keys never holds up a valid one,
and a session finished by another replica takes no new turn here."""

from __future__ import annotations

import asyncio

import pytest

from kernel.errors import AuthenticationFailed, Conflict
from proxy.sessions import SessionCache
from recorder.records import SessionInfo, SessionSpec, SessionStatus
from recorder.store import Store

KNOWN = SessionInfo(
    id="s1",
    key="lego-sk-known",
    spec=SessionSpec(run_id="r", task_id="t", group_id="g", sample_index=0, harness="h"),
    status=SessionStatus.ACTIVE,
    created_at=0.0,
)


class SlowForUnknownKeys(Store):
    """The database's edge: unknown keys answer only once ``release`` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.finished: str | None = None

    async def get_session_by_key(self, key: str) -> SessionInfo | None:
        if key == KNOWN.key:
            return KNOWN
        await self.release.wait()
        return None

    async def finished_termination(self, session_id: str) -> str | None:
        return self.finished


async def test_unknown_keys_do_not_hold_up_a_valid_one() -> None:
    store = SlowForUnknownKeys()
    cache = SessionCache(store)
    flood = [asyncio.create_task(cache.active(f"lego-sk-guess-{n}")) for n in range(50)]
    await asyncio.sleep(0)  # every guess is waiting on the database now
    # Before the fix the lookups were serialized behind one lock: this never returned.
    assert (await asyncio.wait_for(cache.active(KNOWN.key), timeout=5)).id == KNOWN.id
    store.release.set()
    for guess in flood:
        with pytest.raises(AuthenticationFailed):
            await guess
    with pytest.raises(AuthenticationFailed):
        await cache.active("lego-sk-\x00")  # never sent to the database


async def test_a_session_finished_elsewhere_takes_no_turn() -> None:
    store = SlowForUnknownKeys()
    cache = SessionCache(store)
    assert (await cache.active(KNOWN.key)).status is SessionStatus.ACTIVE
    store.finished = "completed"  # another replica finished it
    with pytest.raises(Conflict):
        await cache.active(KNOWN.key)


class HangingStatus(SlowForUnknownKeys):
    """A database that stopped answering status reads (the cached key lookup still works)."""

    async def finished_termination(self, session_id: str) -> str | None:
        await asyncio.Event().wait()
        raise AssertionError("never answers")


async def test_a_hanging_status_read_is_bounded_and_the_cached_status_stands() -> None:
    cache = SessionCache(HangingStatus(), status_wait_s=0.2)
    assert (await cache.active(KNOWN.key)).id == KNOWN.id  # first use: the key lookup
    loop = asyncio.get_running_loop()
    began = loop.time()
    admission = asyncio.create_task(cache.active(KNOWN.key))
    await asyncio.sleep(0.05)  # the status read is pending now
    # Bounded in the admission's own task: no task per turn (wait_for made one).
    assert asyncio.all_tasks() == {asyncio.current_task(), admission}
    session = await asyncio.wait_for(admission, timeout=5)
    assert session.status is SessionStatus.ACTIVE
    assert 0.15 < loop.time() - began < 2.0  # waited for the status, but only so long
