"""recorder.runner and the Postgres idle ping: the store's per-turn transactions run whole
on SQLite's threads or in one greenlet, keep the store's error mapping, and a pooled
Postgres connection is pinged only after it sat idle (issue 21)."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Connection

from kernel.errors import Conflict, RecorderError
from recorder import database, rows
from recorder.database import create_engine
from recorder.migrate import upgrade_database
from recorder.runner import InGreenlet, OnThread, runner_for
from recorder.scratch_postgres import PostgresServer
from recorder.store import Store
from tests.recorder.builders import make_turn
from tests.recorder.test_store import new_session


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite+aiosqlite:///{tmp_path / 'lego.sqlite3'}"


async def test_each_database_gets_its_runner(tmp_path: Path) -> None:
    file_url = sqlite_url(tmp_path)
    memory_url = "sqlite+aiosqlite:///:memory:"
    postgres_url = "postgresql+asyncpg://u:p@127.0.0.1:1/db"  # never connected to
    engines = [create_engine(url) for url in (file_url, memory_url, postgres_url)]
    try:
        runners = [
            runner_for(url, engine)
            for url, engine in zip((file_url, memory_url, postgres_url), engines, strict=True)
        ]
        # A second engine on an in-memory database would see another, empty database.
        assert [type(r) for r in runners] == [OnThread, InGreenlet, InGreenlet]
        for runner in runners:
            await runner.close()
    finally:
        for engine in engines:
            await engine.dispose()


async def test_a_status_read_does_not_wait_behind_a_blocked_write(tmp_path: Path) -> None:
    """A batch's write waiting on SQLite's file lock (another process writing) must not
    hold up the next turn's admission: the runner has a thread for each."""
    url = sqlite_url(tmp_path)
    await upgrade_database(url)
    store = await Store.open(url)
    try:
        session = await new_session(store)
        locker = sqlite3.connect(tmp_path / "lego.sqlite3", isolation_level=None)
        locker.execute("BEGIN IMMEDIATE")  # holds the write lock
        try:
            write = asyncio.create_task(
                store.write_rows([rows.encode_turn(make_turn(session.id, 0))])
            )
            await asyncio.sleep(0.3)
            assert not write.done()  # waiting on the lock (busy timeout)
            started = time.monotonic()
            assert await asyncio.wait_for(store.finished_termination(session.id), 5) is None
            assert time.monotonic() - started < 2.0  # not behind the write
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        assert await asyncio.wait_for(write, 15) == set()
        assert [t.seq for t in await store.list_turns(session.id)] == [0]
    finally:
        await store.close()


async def test_failures_on_the_thread_are_the_stores_errors(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    await upgrade_database(url)
    store = await Store.open(url)
    try:
        session = await new_session(store)
        await store.write_rows([rows.encode_turn(make_turn(session.id, 0))])
        # A turn of no session: the foreign key refuses it (sqlite3's IntegrityError).
        with pytest.raises(Conflict, match="cannot write 1 turns"):
            await store.write_rows([rows.encode_turn(make_turn("no-such-session", 0))])
        # Nothing of the refused transaction stays: the next write goes through.
        await store.write_rows([rows.encode_turn(make_turn(session.id, 1))])
        assert [t.seq for t in await store.list_turns(session.id)] == [0, 1]
    finally:
        await store.close()
    with pytest.raises(RecorderError, match="closed"):
        await store.finished_termination(session.id)


async def test_a_body_runs_in_one_transaction(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    await upgrade_database(url)
    engine = create_engine(url)
    runner = runner_for(url, engine)

    def half_then_fail(conn: Connection) -> None:
        conn.execute(text("INSERT INTO runs (id, name, created_at) VALUES ('r1', 'one', 0)"))
        raise Conflict("refused after the first statement")

    try:
        with pytest.raises(Conflict, match="refused after"):
            await runner.run(half_then_fail, "insert a run")
        count = await runner.read(
            lambda conn: conn.execute(text("SELECT count(*) FROM runs")).scalar_one(),
            "count runs",
        )
        assert count == 0  # rolled back
    finally:
        await runner.close()
        await engine.dispose()


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


async def test_both_engines_on_a_sqlite_file_sync_every_commit(tmp_path: Path) -> None:
    """The writer skips the journal for a turn the database took, which is only as safe
    as the database's commit: synchronous=FULL (2) on the async and the thread's engine."""
    url = sqlite_url(tmp_path)
    await upgrade_database(url)
    engine = create_engine(url)
    runner = runner_for(url, engine)
    try:
        async with engine.connect() as conn:
            pragmas = (await conn.exec_driver_sql("PRAGMA synchronous")).scalar_one()
        on_thread = await runner.read(
            lambda conn: conn.exec_driver_sql("PRAGMA synchronous").scalar_one(), "pragma"
        )
        mode = await runner.read(
            lambda conn: conn.exec_driver_sql("PRAGMA journal_mode").scalar_one(), "pragma"
        )
        assert (pragmas, on_thread, mode) == (2, 2, "wal")
    finally:
        await runner.close()
        await engine.dispose()
