"""Brings a recorder database to the current schema (alembic ``head``), safely.

Contract: ``await upgrade_database(url)`` works on an empty database, an older one, or
one already at head (then it changes nothing). Several replicas may call it at the same
moment: on Postgres the upgrade runs under a session-level ``pg_advisory_lock``; on SQLite
it runs in one ``BEGIN IMMEDIATE`` transaction, so the file lock serialises it. A second
caller waits, then finds the schema current. Database errors raise ``RecorderError``.

Alembic is configured in code; the migration scripts ship inside the package, so no
``alembic.ini`` or working directory is needed at run time.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import func, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError

from kernel.errors import RecorderError
from recorder.database import create_engine, describe_error, is_sqlite, parse_url

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
# Arbitrary but fixed: every replica must contend for the same advisory lock ("lego" ...).
ADVISORY_LOCK_KEY = 0x6C65_676F_0001


def alembic_config(connection: Connection | None = None) -> Config:
    """An alembic ``Config`` for the packaged migrations, bound to ``connection`` if given."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def _upgrade(connection: Connection) -> None:
    command.upgrade(alembic_config(connection), "head")


async def upgrade_database(url: str) -> None:
    parsed = parse_url(url)
    engine = create_engine(url, serialize_sqlite_transactions=True)
    try:
        async with engine.connect() as conn:
            if is_sqlite(parsed):
                # BEGIN IMMEDIATE (see create_engine) takes the file's write lock before
                # alembic reads the current revision; alembic then runs inside this
                # transaction. Alembic keeps its context in module globals, so it must not
                # be entered before the lock is held, even by callers in one process.
                await conn.begin()
                await conn.run_sync(_upgrade)
                await conn.commit()
                return
            await conn.execute(select(func.pg_advisory_lock(ADVISORY_LOCK_KEY)))
            # The lock belongs to the database session, not the transaction: commit now so
            # alembic starts (and commits) its own transaction while we still hold it.
            await conn.commit()
            try:
                await conn.run_sync(_upgrade)
                await conn.commit()
            finally:
                await conn.rollback()  # a failed upgrade leaves the transaction aborted
                await conn.execute(select(func.pg_advisory_unlock(ADVISORY_LOCK_KEY)))
                await conn.commit()
    except (SQLAlchemyError, OSError) as exc:
        raise RecorderError(f"database migration failed: {describe_error(exc)}") from exc
    finally:
        await engine.dispose()
