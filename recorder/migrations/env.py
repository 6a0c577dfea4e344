"""Alembic environment for the recorder, driven only by ``recorder.migrate``.

Alembic executes this file when it runs a migration (that is its contract: the work
happens at import). It expects the caller to hand it an open synchronous connection in
``config.attributes["connection"]``; it never builds an engine or reads ``alembic.ini``,
so the same code path serves Postgres and SQLite and the caller owns locking.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from recorder.schema import metadata


def run_migrations() -> None:
    if context.is_offline_mode():
        raise RuntimeError("recorder migrations run online only (use recorder.migrate)")
    connection = context.config.attributes.get("connection")
    if not isinstance(connection, Connection):
        raise RuntimeError("recorder migrations need a connection from recorder.migrate")
    context.configure(
        connection=connection,
        target_metadata=metadata,
        # SQLite cannot ALTER most things in place; batch mode recreates tables instead.
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


run_migrations()
