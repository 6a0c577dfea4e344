"""recorder.database: the Postgres engine pings a pooled connection only after it sat idle
(issue 21)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import text

from recorder import database
from recorder.database import create_engine
from recorder.migrate import upgrade_database
from recorder.scratch_postgres import PostgresServer
from recorder.store import Store
from tests.recorder.test_store import new_session


@pytest.mark.postgres
async def test_postgres_pings_only_an_idle_connection(
    postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection of the engine in steady use is not pinged (three round trips a
    checkout); one idle past PING_IDLE_S is, and a dead one is replaced before the
    statement needs it. (The per-turn statements have a pool of their own:
    tests/recorder/test_postgres_turns.py.)"""
    monkeypatch.setattr(database, "PING_IDLE_S", 0.3)
    url = await postgres_server.create_database()
    await upgrade_database(url)
    store = await Store.open(url)
    pings = 0
    dialect = store.engine.sync_engine.dialect
    real_ping = dialect.do_ping

    def counted(dbapi_connection: Any) -> bool:
        nonlocal pings
        pings += 1
        return real_ping(dbapi_connection)

    monkeypatch.setattr(dialect, "do_ping", counted)
    killer = create_engine(url)
    try:
        session = await new_session(store)
        pings = 0
        for _ in range(10):
            await store.get_session(session.id)
        assert pings == 0

        # The server closes every connection of the store's pool while it is idle.
        async with killer.connect() as conn:
            await conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            )
        await asyncio.sleep(0.5)
        assert (await store.get_session(session.id)).id == session.id  # no error
        assert pings >= 1
    finally:
        await killer.dispose()
        await store.close()
        await postgres_server.drop_database(url)
