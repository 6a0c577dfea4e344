"""Engine construction for the recorder: one place that knows the two supported backends.

Owns the dialect policy shared by the store and the migrator:

- ``postgresql+asyncpg://...``: a pooled engine with pre-ping, so connections broken by a
  database restart are replaced instead of failing the next write.
- ``sqlite+aiosqlite:///path``: the file's parent directory is created; every connection
  runs in WAL mode (readers never block the writer) with a busy timeout (a writer waits for
  the file lock instead of failing at once) and enforced foreign keys (SQLite's default is
  off, Postgres always enforces them; both must refuse the same writes).

Both hide statement parameters from error messages: they hold harness conversations.
Any other driver is refused with ``InvalidRequest``. ``transaction(engine, action)`` is the
one place database failures become the project's errors: a clash with an existing row is
``Conflict``; a value the database refuses to hold (SQLSTATE class 22, "data exception":
NUL in text, an integer over its column's range, ...) is ``InvalidRequest``, since sending
it again can never succeed; a database that cannot be reached (refused or lost
connections, SQLSTATE classes 08 and 57: shutting down, starting up) is
``RecorderUnavailable`` (503: retry later); anything else it raises is ``RecorderError``.
Each names the action.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError, StatementError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from kernel.errors import Conflict, InvalidRequest, LegoError, RecorderError, RecorderUnavailable

SQLITE_BUSY_TIMEOUT_MS = 10_000
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
    """One line for a database failure: the driver's message without SQL or parameters."""
    cause = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    lines = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {lines[0] if lines else ''}"


@asynccontextmanager
async def transaction(engine: AsyncEngine, action: str) -> AsyncIterator[AsyncConnection]:
    """A connection in a transaction; database failures raised as the project's errors."""
    try:
        async with engine.begin() as conn:
            yield conn
    except LegoError:
        raise
    except IntegrityError as exc:
        raise Conflict(f"cannot {action}: {describe_error(exc)}") from exc
    except StatementError as exc:
        if _refused_value(exc):
            raise InvalidRequest(
                f"cannot {action}: the database refused a value: {describe_error(exc)}"
            ) from exc
        if _unreachable(exc):
            raise RecorderUnavailable(
                f"cannot {action}: the database is unavailable: {describe_error(exc)}"
            ) from exc
        raise RecorderError(f"cannot {action}: database error: {describe_error(exc)}") from exc
    except OSError as exc:
        # asyncpg reports refused/reset connections as plain socket errors.
        raise RecorderUnavailable(
            f"cannot {action}: the database is unavailable: {describe_error(exc)}"
        ) from exc
    except SQLAlchemyError as exc:
        raise RecorderError(f"cannot {action}: database error: {describe_error(exc)}") from exc


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
        return create_async_engine(
            parsed, pool_pre_ping=True, pool_size=10, max_overflow=10, hide_parameters=True
        )
    database = parsed.database
    if database and database != ":memory:":
        Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_async_engine(parsed, hide_parameters=True)
    _install_sqlite_pragmas(engine, serialize_sqlite_transactions)
    return engine


def _install_sqlite_pragmas(engine: AsyncEngine, serialize: bool) -> None:
    # The DBAPI objects here are SQLAlchemy's aiosqlite adapters, which are untyped.
    def on_connect(dbapi_connection: Any, _record: object) -> None:
        if serialize:
            # Python's sqlite3 would otherwise open transactions implicitly (and not for
            # DDL); with autocommit at the driver level the "begin" hook below decides.
            dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        # The timeout first: switching a new file to WAL needs a lock another
        # connection may hold at that moment.
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        _switch_to_wal(cursor)
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    event.listen(engine.sync_engine, "connect", on_connect)
    if serialize:

        def on_begin(connection: Any) -> None:
            connection.exec_driver_sql("BEGIN IMMEDIATE")

        event.listen(engine.sync_engine, "begin", on_begin)


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
