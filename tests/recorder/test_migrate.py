"""upgrade_database: empty -> head, idempotent, safe under concurrent callers."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import insert, inspect, select
from sqlalchemy.engine import Connection

from kernel.errors import InvalidRequest, RecorderError
from recorder.database import create_engine
from recorder.migrate import alembic_config, upgrade_database
from recorder.records import SessionInfo, SessionSpec, SessionStatus
from recorder.rows import encode_turn, session_values
from recorder.schema import metadata, sessions, turns
from recorder.scratch_postgres import PostgresServer
from recorder.store import Store
from tests.recorder.builders import make_turn

# The newest migration shipped in the package; every upgrade must land there.
HEAD = ScriptDirectory.from_config(alembic_config()).get_current_head()


async def current_revision(url: str) -> str | None:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            return await conn.run_sync(
                lambda sync: MigrationContext.configure(sync).get_current_revision()
            )
    finally:
        await engine.dispose()


async def schema_differences(url: str) -> list[object]:
    def compare(sync: Connection) -> list[object]:
        return list(compare_metadata(MigrationContext.configure(sync), metadata))

    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            return await conn.run_sync(compare)
    finally:
        await engine.dispose()


async def table_names(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            return set(await conn.run_sync(lambda sync: inspect(sync).get_table_names()))
    finally:
        await engine.dispose()


async def test_migrated_database_matches_schema_module(database_url: str) -> None:
    assert await current_revision(database_url) == HEAD
    assert await schema_differences(database_url) == []


async def test_upgrade_twice_is_a_no_op(database_url: str) -> None:
    await upgrade_database(database_url)
    await upgrade_database(database_url)
    assert await current_revision(database_url) == HEAD
    assert {"runs", "sessions", "turns"} <= await table_names(database_url)


async def test_upgrade_brings_an_older_database_to_head(database_url: str) -> None:
    def downgrade(sync: Connection) -> None:
        command.downgrade(alembic_config(sync), "base")

    engine = create_engine(database_url)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(downgrade)
    finally:
        await engine.dispose()
    assert "turns" not in await table_names(database_url)

    await upgrade_database(database_url)

    assert await current_revision(database_url) == HEAD
    assert await schema_differences(database_url) == []


async def test_concurrent_upgrades_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'nested' / 'dir' / 'lego.sqlite3'}"
    # Connections opened at once on a fresh file race to switch it to WAL (CI saw it).
    await asyncio.gather(*(upgrade_database(url) for _ in range(8)))
    assert await current_revision(url) == HEAD
    assert await schema_differences(url) == []


@pytest.mark.postgres
async def test_concurrent_upgrades_on_postgres(postgres_server: PostgresServer) -> None:
    url = await postgres_server.create_database()
    try:
        await asyncio.gather(*(upgrade_database(url) for _ in range(4)))
        assert await current_revision(url) == HEAD
        assert await schema_differences(url) == []
    finally:
        await postgres_server.drop_database(url)


async def test_unsupported_driver_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="unsupported database driver"):
        await upgrade_database("mysql+aiomysql://localhost/lego")


async def test_unreachable_postgres_raises_recorder_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(RecorderError, match="migration failed"):
        await upgrade_database(f"postgresql+asyncpg://nobody@127.0.0.1:{port}/none")


async def migrate_down_to(url: str, revision: str) -> None:
    def downgrade(sync: Connection) -> None:
        command.downgrade(alembic_config(sync), revision)

    engine = create_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(downgrade)
    finally:
        await engine.dispose()


async def test_requests_stored_before_0005_stay_readable_and_downgrade_rebuilds_new_ones(
    database_url: str,
) -> None:
    system = {"role": "system", "content": "Be brief."}
    user = {"role": "user", "content": "Fix it."}
    answer: dict[str, Any] = {"reasoning": None, "content": "Done.", "tool_calls": []}
    echoed = {**answer, "role": "assistant", "tool_calls": [], "tool_call_id": None, "name": None}
    follow = {"role": "user", "content": "Thanks."}
    root_request = {"adapter": "openai_chat", "model": "m", "messages": [system, user]}
    await migrate_down_to(database_url, "0004")
    store = await Store.open(database_url)
    try:
        run = await store.create_run(f"run-{uuid.uuid4().hex[:8]}")
        spec = SessionSpec(run_id=run.id, task_id="t", group_id="g", sample_index=0, harness="h")
        info = SessionInfo(uuid.uuid4().hex, "k-" + uuid.uuid4().hex, spec, SessionStatus.ACTIVE, 0)
        session = info.id
        async with store.engine.begin() as conn:  # the 0004 schema has no prompt groups
            await conn.execute(insert(sessions).values(**values_before_0010(info)))
        old = [
            dataclasses.replace(
                make_turn(session, 0),
                request_messages=orjson.dumps(root_request),
                response_message=orjson.dumps(answer),
            )
        ]
        rows = [dict(encode_turn(record).row) for record in old]
        for row in rows:  # the 0004 schema has neither column
            del row["messages_inherited"]
            del row["side_requests"]
        async with store.engine.begin() as conn:
            await conn.execute(insert(turns), rows)
    finally:
        await store.close()

    await upgrade_database(database_url)
    new = dataclasses.replace(
        make_turn(session, 1),
        request_messages=orjson.dumps({"messages": [follow]}),
        messages_inherited=3,
        parent_turn_id=old[0].id,
        response_message=orjson.dumps(answer),
    )
    expected = {
        old[0].id: root_request,
        new.id: {**root_request, "messages": [system, user, echoed, follow]},
    }
    store = await Store.open(database_url)
    try:
        (stored,) = await store.list_turns(session)
        assert stored.messages_inherited is None
        assert stored.request_messages == old[0].request_messages
        await store.write_turns([new])
        rebuilt = await store.conversations(session)
        assert {k: orjson.loads(v.request_json()) for k, v in rebuilt.items()} == expected
    finally:
        await store.close()

    await migrate_down_to(database_url, "0004")
    engine = create_engine(database_url)
    try:
        async with engine.connect() as conn:
            result = await conn.execute(
                select(turns.c.id, turns.c.request_messages).where(turns.c.session_id == session)
            )
            whole = {row.id: bytes(row.request_messages) for row in result}
    finally:
        await engine.dispose()
    assert whole[old[0].id] == old[0].request_messages  # untouched
    assert {k: orjson.loads(v) for k, v in whole.items()} == expected
    await upgrade_database(database_url)
    assert await schema_differences(database_url) == []


def values_before_0010(info: SessionInfo) -> dict[str, object]:
    """A new session's row as an earlier schema holds it: no ``purpose`` column yet."""
    values = session_values(info)
    del values["purpose"]
    return values


async def test_sessions_finished_before_0009_read_back_without_a_trial_report(
    database_url: str,
) -> None:
    await migrate_down_to(database_url, "0008")
    spec = SessionSpec(run_id="", task_id="t", group_id="g", sample_index=0, harness="h")
    store = await Store.open(database_url)
    try:
        run = await store.create_run(f"run-{uuid.uuid4().hex[:8]}")
        spec = dataclasses.replace(spec, run_id=run.id)
        info = SessionInfo(uuid.uuid4().hex, "k-" + uuid.uuid4().hex, spec, SessionStatus.ACTIVE, 0)
        old = {
            **values_before_0010(info),
            "status": SessionStatus.FINISHED.value,
            "termination": "completed",
            "reward": 1.0,
            "reward_details": {"tests": 3},
        }
        async with store.engine.begin() as conn:  # the 0008 schema has neither column
            await conn.execute(insert(sessions).values(**old))
    finally:
        await store.close()

    await upgrade_database(database_url)

    store = await Store.open(database_url)
    try:
        got = await store.get_session(info.id)
        assert (got.reward, got.reward_details) == (1.0, {"tests": 3})
        assert (got.stages, got.defense_events) == (None, ())
        assert got.spec.purpose == "train"  # what 0010 makes of every earlier session
    finally:
        await store.close()
