"""Session lookup by key for the inference path, with an in-process cache.

Owns: resolving a session key to an active session.
Sessions created or finished through this process update the cache directly; a miss reads
the database once (a replica restarted, or another replica created the session). The
cache can always be rebuilt from the database.

Finish is a barrier on every replica: each turn's admission reads the session's status
from the database (one indexed lookup), so a session another replica finished takes no
new turn here. The database is waited on for at most ``status_wait_s``; when it is slow
or down the cached status stands (no finish can be recorded then either, and a turn that
reaches the database after its session's finish is stored failed: ``recorder.store``).
Misses are not serialized: a flood of unknown keys never delays a valid one.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from kernel.errors import AuthenticationFailed, Conflict, LegoError
from recorder.records import SessionInfo, SessionStatus
from recorder.store import Store


class SessionCache:
    def __init__(self, store: Store, *, status_wait_s: float = 1.0) -> None:
        self._store = store
        self._status_wait_s = status_wait_s
        self._by_key: dict[str, SessionInfo] = {}

    def put(self, session: SessionInfo) -> None:
        self._by_key[session.key] = session

    async def active(self, key: str | None) -> SessionInfo:
        """The active session for ``key``; raises when unknown or finished."""
        if not key:
            raise AuthenticationFailed(
                "no session key: send it as 'Authorization: Bearer <key>', 'x-api-key', "
                "or in the path /s/<key>/v1/..."
            )
        if "\x00" in key or len(key) > 512:
            raise AuthenticationFailed("unknown session key")  # no key looks like that
        session = self._by_key.get(key)
        if session is None:
            session = await self._store.get_session_by_key(key)
            if session is None:
                raise AuthenticationFailed("unknown session key")
            self.put(session)
        elif session.status is SessionStatus.ACTIVE:
            session = await self._current(session)
        if session.status is SessionStatus.FINISHED:
            raise Conflict(f"session {session.id} is finished ({session.termination})")
        return session

    async def _current(self, session: SessionInfo) -> SessionInfo:
        """The cached session, or its finished state when another replica finished it."""
        try:
            # asyncio.timeout, not wait_for: no task of its own on every turn's admission.
            async with asyncio.timeout(self._status_wait_s):
                finished = await self._store.finished_termination(session.id)
        except (TimeoutError, LegoError):
            # Deliberately swallowed: the database is away, the cached status stands.
            return session
        if finished is None:
            return session
        done = replace(session, status=SessionStatus.FINISHED, termination=finished)
        self._by_key[session.key] = done
        return done

    def finished(self, session: SessionInfo) -> None:
        self._by_key[session.key] = replace(session, status=SessionStatus.FINISHED)
