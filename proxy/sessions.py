"""Session lookup by key for the inference path, with an in-process cache.

Owns: resolving a session key to an active session.
Sessions created or finished through this process update the cache directly; a miss reads
the database once (a replica restarted, or another replica created the session). The
cache can always be rebuilt from the database.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from kernel.errors import AuthenticationFailed, Conflict
from recorder.records import SessionInfo, SessionStatus
from recorder.store import Store


class SessionCache:
    def __init__(self, store: Store) -> None:
        self._store = store
        self._by_key: dict[str, SessionInfo] = {}
        self._lock = asyncio.Lock()

    def put(self, session: SessionInfo) -> None:
        self._by_key[session.key] = session

    async def active(self, key: str | None) -> SessionInfo:
        """The active session for ``key``; raises when unknown or finished."""
        if not key:
            raise AuthenticationFailed(
                "no session key: send it as 'Authorization: Bearer <key>', 'x-api-key', "
                "or in the path /s/<key>/v1/..."
            )
        session = self._by_key.get(key)
        if session is None:
            async with self._lock:
                session = self._by_key.get(key) or await self._store.get_session_by_key(key)
                if session is None:
                    raise AuthenticationFailed("unknown session key")
                self.put(session)
        if session.status is SessionStatus.FINISHED:
            raise Conflict(f"session {session.id} is finished ({session.termination})")
        return session

    def finished(self, session: SessionInfo) -> None:
        self._by_key[session.key] = replace(session, status=SessionStatus.FINISHED)
