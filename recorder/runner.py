"""Where the store's per-turn statements run: the cheapest way to the database each has.

A turn costs the store two transactions (its admission's status read, and its share of the
writer's batch: ``recorder.per_turn``). Issued statement by statement through SQLAlchemy's
async engine, each DBAPI call (cursor, execute, fetch, commit) is a trip through a
greenlet and, on SQLite, through aiosqlite's thread and back to the event loop: 1.4 ms of
CPU for a one-row read on the development machine, ten times the statement itself. So
the store writes these
transactions as one synchronous function of a ``Connection`` (a "body"), and a runner
runs the whole body in one go:

- ``OnThread`` (a SQLite file): on a small thread pool, over a synchronous ``sqlite3``
  engine with the same pragmas (``recorder.database.create_sqlite_file_engine``). The
  same library on the same file as aiosqlite, in one thread hop per transaction.
- ``InGreenlet`` (an in-memory SQLite, or a store built on an engine alone):
  ``AsyncConnection.run_sync`` in one greenlet, on the store's own async engine and pool.
  (``Store.open`` runs a Postgres store's per-turn operations on asyncpg directly:
  ``recorder.postgres_turns``.)

Contract: ``await runner.run(body, action)`` runs ``body(conn)`` in one transaction,
commits when it returns, rolls back when it raises; ``read`` runs a body of one read
statement without a transaction of its own (Postgres: autocommit). Both raise database
failures as the project's errors naming ``action`` (``recorder.database.translated``);
``LegoError``s the body raises pass through. Cancelling the await (a writer's write
timeout) does not stop a body already running on a thread: it commits or fails there,
which is why every body the store runs this way is idempotent or read-only. ``close()``
waits for running bodies, then closes the runner's connections; a closed runner refuses
more with ``RecorderError``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol, TypeVar

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncEngine

from kernel.errors import RecorderError
from recorder.database import (
    autocommit,
    create_sqlite_file_engine,
    sync_transaction,
    transaction,
)

T = TypeVar("T")
# Two threads: a batch's write (which may wait on SQLite's file lock) never queues the
# next turn's status read behind it.
SQLITE_THREADS = 2

Body = Callable[[Connection], T]


class Runner(Protocol):
    async def run(self, body: Body[T], action: str) -> T: ...

    async def read(self, body: Body[T], action: str) -> T: ...

    async def close(self) -> None: ...


class InGreenlet:
    """A body run by ``AsyncConnection.run_sync`` on an async engine's pool."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def run(self, body: Body[T], action: str) -> T:
        async with transaction(self._engine, action) as conn:
            return await conn.run_sync(body)

    async def read(self, body: Body[T], action: str) -> T:
        # No BEGIN and COMMIT around one read: two round trips fewer on Postgres.
        async with autocommit(self._engine, action) as conn:
            return await conn.run_sync(body)

    async def close(self) -> None:
        """The engine belongs to the store, which disposes of it."""


class OnThread:
    """A body run on a thread over a synchronous engine (SQLite files)."""

    def __init__(self, engine: Engine, threads: int = SQLITE_THREADS) -> None:
        self._engine = engine
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="lego-sqlite")
        self._closed = False

    async def run(self, body: Body[T], action: str) -> T:
        if self._closed:
            raise RecorderError(f"cannot {action}: the store is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._in_transaction, body, action)

    async def read(self, body: Body[T], action: str) -> T:
        # sqlite3 opens no transaction for a read: the commit is a no-op.
        return await self.run(body, action)

    def _in_transaction(self, body: Body[T], action: str) -> T:
        with sync_transaction(self._engine, action) as conn:
            return body(conn)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await asyncio.to_thread(self._shut_down)

    def _shut_down(self) -> None:
        self._pool.shutdown(wait=True)
        self._engine.dispose()


def runner_for(url: str, engine: AsyncEngine) -> Runner:
    """``OnThread`` for a SQLite file, else ``InGreenlet`` on ``engine``."""
    sqlite_file = create_sqlite_file_engine(url)
    return InGreenlet(engine) if sqlite_file is None else OnThread(sqlite_file)
