"""Engine construction for the recorder: one place that knows the two supported backends.

Owns the dialect policy shared by the store and the migrator:

- ``postgresql+asyncpg://...``: a pooled engine that pings a connection idle for longer than
  ``PING_IDLE_S`` before handing it out, so connections broken by a database restart (or
  closed by an idle timeout) are replaced instead of failing the next write. Not every
  checkout: SQLAlchemy's ``pool_pre_ping`` costs three round trips each time (BEGIN, the
  ping, ROLLBACK), as much CPU as the statement it guards on a turn's hot path, and a
  connection in steady use is known to work. One that broke within the last second fails
  its statement; the driver marks the pool's connections stale, so the retry (the writer
  retries every batch) gets a new one.
- ``sqlite+aiosqlite:///path``: the file's parent directory is created; every connection
  runs in WAL mode (readers never block the writer), syncing every commit, with a busy
  timeout (a writer waits for the file lock instead of failing at once) and enforced
  foreign keys (SQLite's default is off, Postgres always enforces them; both must refuse
  the same writes). ``sqlite_pragmas`` sets them on any connection to the file
  (``recorder.sqlite_turns`` opens its own).

Both hide statement parameters from error messages: they hold harness conversations.
Any other driver is refused with ``InvalidRequest``. ``transaction(engine, action)`` is
the one place database failures become the project's errors (``translated``): a clash
with an existing row is ``Conflict``; a value the database refuses to hold (SQLSTATE
class 22, "data exception": NUL in text, an integer over its column's range, ...) is
``InvalidRequest``, since sending it again can never succeed; a database that cannot be
reached (refused or lost connections, SQLSTATE classes 08 and 57: shutting down,
starting up) is ``RecorderUnavailable`` (503: retry later); anything else it raises is
``RecorderError``. Each names the action. ``translated_asyncpg`` and
``translated_sqlite`` apply the same rule to the drivers' own exceptions, for the
statements run on them without SQLAlchemy (``recorder.postgres_turns``,
``recorder.sqlite_turns``).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
from sqlalchemy import event
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import (
    DBAPIError,
    DisconnectionError,
    IntegrityError,
    SQLAlchemyError,
    StatementError,
)
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from kernel.errors import Conflict, InvalidRequest, LegoError, RecorderError, RecorderUnavailable

SQLITE_BUSY_TIMEOUT_MS = 10_000
DESCRIBED_CHARS = 300
PING_IDLE_S = 1.0  # a pooled Postgres connection idle this long is pinged before use
POSTGRES_DRIVER = "postgresql+asyncpg"
SQLITE_DRIVER = "sqlite+aiosqlite"


def parse_url(url: str) -> URL:
    """Parse and check a database URL; raise ``InvalidRequest`` for unsupported drivers."""
    try:
        parsed = make_url(url)
    except Exception as exc:  # sqlalchemy raises ArgumentError or ValueError by case
        raise InvalidRequest(f"invalid database URL: {exc}") from None
    if parsed.drivername not in (POSTGRES_DRIVER, SQLITE_DRIVER):
        raise InvalidRequest(
            f"unsupported database driver {parsed.drivername!r}: use "
            f"'{POSTGRES_DRIVER}://...' or '{SQLITE_DRIVER}:///path'"
        )
    return parsed


def display_url(url: str) -> str:
    """``url`` as it may be printed: the password hidden."""
    return parse_url(url).render_as_string(hide_password=True)


def describe_error(exc: BaseException) -> str:
    """One line for a database failure: the driver's message without SQL or parameters
    (cut short: asyncpg's message for a value it cannot encode quotes the value)."""
    cause = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    lines = str(cause).strip().splitlines()
    first = lines[0] if lines else ""
    if len(first) > DESCRIBED_CHARS:
        first = first[:DESCRIBED_CHARS] + "..."
    return f"{type(cause).__name__}: {first}"


@asynccontextmanager
async def transaction(engine: AsyncEngine, action: str) -> AsyncIterator[AsyncConnection]:
    """A connection in a transaction; database failures raised as the project's errors."""
    try:
        async with engine.begin() as conn:
            yield conn
    except LegoError:
        raise
    except (SQLAlchemyError, OSError) as exc:
        raise translated(exc, action) from exc


@asynccontextmanager
async def autocommit(engine: AsyncEngine, action: str) -> AsyncIterator[AsyncConnection]:
    """A connection outside any transaction (each statement commits by itself), for a
    single read; failures raised as in ``transaction``."""
    try:
        async with engine.connect() as conn:
            yield await conn.execution_options(isolation_level="AUTOCOMMIT")
    except LegoError:
        raise
    except (SQLAlchemyError, OSError) as exc:
        raise translated(exc, action) from exc


# Each kind of failure, and what its message says before the driver's own line.
_SAYS: dict[type[LegoError], str] = {
    Conflict: "",
    InvalidRequest: "the database refused a value: ",
    RecorderUnavailable: "the database is unavailable: ",
    RecorderError: "database error: ",
}


def _failure(kind: type[LegoError], exc: BaseException, action: str) -> LegoError:
    return kind(f"cannot {action}: {_SAYS[kind]}{describe_error(exc)}")


def translated(exc: SQLAlchemyError | OSError, action: str) -> LegoError:
    """The project's error for a database failure while doing ``action``."""
    kind: type[LegoError] = RecorderError
    if isinstance(exc, IntegrityError):
        kind = Conflict
    elif isinstance(exc, StatementError):
        if _refused_value(exc):
            kind = InvalidRequest
        elif _unreachable(exc):
            kind = RecorderUnavailable
    elif isinstance(exc, OSError):
        kind = RecorderUnavailable  # asyncpg reports refused/reset connections as such
    return _failure(kind, exc, action)


def translated_sqlite(exc: Exception, action: str) -> LegoError:
    """``translated`` for what ``sqlite3`` raises itself (``recorder.sqlite_turns`` runs
    it without SQLAlchemy): the same classes as through SQLAlchemy."""
    kind: type[LegoError] = RecorderError
    if isinstance(exc, sqlite3.IntegrityError):
        kind = Conflict
    elif isinstance(exc, OverflowError):  # an integer past 64 bits
        kind = InvalidRequest
    elif isinstance(exc, OSError):
        kind = RecorderUnavailable
    return _failure(kind, exc, action)


def translated_asyncpg(exc: Exception, action: str) -> LegoError:
    """``translated`` for what asyncpg raises itself (``recorder.postgres_turns`` runs it
    without SQLAlchemy): the same classes, by SQLSTATE."""
    sqlstate = getattr(exc, "sqlstate", None)
    cls = sqlstate[:2] if isinstance(sqlstate, str) else ""
    closed = isinstance(exc, asyncpg.InterfaceError) and "connection is closed" in str(exc)
    kind: type[LegoError] = RecorderError
    if cls == "23":
        kind = Conflict
    elif cls == "22":  # also asyncpg's DataError for a value it cannot encode
        kind = InvalidRequest
    elif cls in ("08", "57") or closed or isinstance(exc, OSError | TimeoutError):
        kind = RecorderUnavailable
    return _failure(kind, exc, action)


def _refused_value(exc: StatementError) -> bool:
    # asyncpg's errors carry the server's SQLSTATE (also for its client-side range checks);
    # sqlite3 raises OverflowError for an integer past 64 bits.
    sqlstate = getattr(exc.orig, "sqlstate", None)
    return (isinstance(sqlstate, str) and sqlstate.startswith("22")) or isinstance(
        exc.orig, OverflowError
    )


def _unreachable(exc: StatementError) -> bool:
    sqlstate = getattr(exc.orig, "sqlstate", None)
    lost = isinstance(exc, DBAPIError) and exc.connection_invalidated
    return (
        lost
        or isinstance(exc.orig, OSError)
        or (isinstance(sqlstate, str) and sqlstate[:2] in ("08", "57"))
    )


def is_sqlite(url: URL) -> bool:
    return url.drivername == SQLITE_DRIVER


def create_engine(url: str, *, serialize_sqlite_transactions: bool = False) -> AsyncEngine:
    """Build a pooled ``AsyncEngine`` with the dialect policy above.

    ``serialize_sqlite_transactions`` makes every SQLite transaction start with
    ``BEGIN IMMEDIATE``: the write lock is taken before the first read, so two processes
    that both read-then-write (the migrator checking the schema version) run one after the
    other instead of racing. The store leaves it off; its writes are single statements.
    """
    parsed = parse_url(url)
    if not is_sqlite(parsed):
        engine = create_async_engine(parsed, pool_size=10, max_overflow=10, hide_parameters=True)
        _ping_idle_connections(engine.sync_engine)
        return engine
    database = parsed.database
    if database and database != ":memory:":
        Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_async_engine(parsed, hide_parameters=True)
    _install_sqlite_pragmas(engine.sync_engine, serialize_sqlite_transactions)
    return engine


def _ping_idle_connections(engine: Engine) -> None:
    # SQLAlchemy's documented custom pessimistic ping: DisconnectionError from a checkout
    # listener makes the pool drop that connection and check out another one.
    checked_in = "lego_checked_in"

    def on_checkin(_dbapi_connection: Any, record: Any) -> None:
        record.info[checked_in] = time.monotonic()

    def on_checkout(dbapi_connection: Any, record: Any, _proxy: object) -> None:
        now = time.monotonic()
        if now - record.info.get(checked_in, now) <= PING_IDLE_S:
            return  # new, or in steady use
        try:
            engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:  # whatever the driver raises for a dead connection
            raise DisconnectionError(f"an idle pooled connection is dead: {exc!r}") from exc

    event.listen(engine, "checkin", on_checkin)
    event.listen(engine, "checkout", on_checkout)


def sqlite_pragmas(cursor: Any) -> None:
    """Every connection to a SQLite file: the engine's, and ``recorder.sqlite_turns``'s
    (a ``sqlite3`` cursor, or SQLAlchemy's aiosqlite adapter of one: untyped)."""
    # The timeout first: switching a new file to WAL needs a lock another connection may
    # hold at that moment.
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    _switch_to_wal(cursor)
    # Every commit synced (SQLite's usual default, pinned here): a turn the database took
    # needs no journal entry of the proxy's own (recorder.writer).
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _install_sqlite_pragmas(engine: Engine, serialize: bool) -> None:
    def on_connect(dbapi_connection: Any, _record: object) -> None:
        if serialize:
            # Python's sqlite3 would otherwise open transactions implicitly (and not for
            # DDL); with autocommit at the driver level the "begin" hook below decides.
            dbapi_connection.isolation_level = None
        sqlite_pragmas(dbapi_connection.cursor())

    event.listen(engine, "connect", on_connect)
    if serialize:

        def on_begin(connection: Any) -> None:
            connection.exec_driver_sql("BEGIN IMMEDIATE")

        event.listen(engine, "begin", on_begin)


def _switch_to_wal(cursor: Any) -> None:
    """WAL mode belongs to the file and persists; switching a fresh file ignores the busy
    timeout, so of several connections opened at once (replicas starting together) the
    ones that find it locked go on: another connection is switching it, or the next one
    will, and the rollback journal in the meantime is only slower, not wrong."""
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
    except Exception as exc:  # the adapter re-raises sqlite3's OperationalError
        # Deliberately swallowed when locked (see above); anything else is a real error.
        if "locked" not in str(exc):
            raise
