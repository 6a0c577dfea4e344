"""recorder.postgres_turns: the per-turn operations on asyncpg directly write what the
SQLAlchemy path writes, keep the finish barrier and the store's error mapping, and
recover from connections a restart broke (issue 21)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
from sqlalchemy import Text, cast, select, text

from kernel.errors import Conflict, InvalidRequest, RecorderUnavailable
from recorder import database, rows
from recorder.database import create_engine
from recorder.migrate import upgrade_database
from recorder.per_turn import LATE_ERROR, OverSqlAlchemy
from recorder.postgres_turns import PostgresTurns
from recorder.records import SessionStatus, TurnStatus
from recorder.schema import turns
from recorder.scratch_postgres import PostgresServer
from recorder.store import Store
from tests.recorder.builders import experts, make_turn, rich_turn
from tests.recorder.test_store import new_session

pytestmark = pytest.mark.postgres

JSON_COLUMNS = ("sampling_params", "ignored_fields", "weight_version_spans", "side_requests")


@pytest.fixture
async def url(postgres_server: PostgresServer) -> AsyncIterator[str]:
    created = await postgres_server.create_database()
    await upgrade_database(created)
    yield created
    await postgres_server.drop_database(created)


def row_of(turn_id: str, session_id: str, seq: int) -> dict[str, object]:
    return dict(rows.encode_turn(make_turn(session_id, seq, turn_id=turn_id)).row)


async def stored_columns(store: Store, turn_id: str) -> dict[str, object]:
    """A stored row as the database holds it: JSON columns as their text, so SQL NULL
    and JSON null differ."""
    columns = [c for c in turns.columns if c.name not in JSON_COLUMNS]
    json_text = [cast(turns.c[name], Text).label(name) for name in JSON_COLUMNS]
    async with store.engine.connect() as conn:
        row = (await conn.execute(select(*columns, *json_text).where(turns.c.id == turn_id))).one()
    return dict(row._mapping)


async def test_the_store_runs_a_turns_operations_on_asyncpg(url: str) -> None:
    store = await Store.open(url)
    try:
        assert isinstance(store._per_turn, PostgresTurns)
    finally:
        await store.close()


async def test_rows_are_stored_the_same_whichever_path_wrote_them(url: str) -> None:
    store = await Store.open(url)
    try:
        await assert_stored_the_same_by_both_paths(store, sqlite_dialect=False)
    finally:
        await store.close()


async def assert_stored_the_same_by_both_paths(store: Store, *, sqlite_dialect: bool) -> None:
    """Turns written by the store's own per-turn path and by ``OverSqlAlchemy`` on its
    engine are stored alike, column by column (also the sqlite_turns tests)."""
    over_sqlalchemy = OverSqlAlchemy(store.engine, sqlite_dialect=sqlite_dialect)
    session = await new_session(store)
    routed = experts(1, [[[3, 7]], [[1, 2]]])
    lean = make_turn(session.id, 0)  # JSON columns None, no experts
    rich = replace(rich_turn(session.id, 1, routed), side_requests=())
    old = dict(rows.encode_turn(make_turn(session.id, 2)).row)
    for spooled_before_the_column in ("classification", "reused_prefix_len", "prompt_offset"):
        del old[spooled_before_the_column]
    originals = [dict(rows.encode_turn(lean).row), dict(rows.encode_turn(rich).row), old]
    pairs = []
    batch = []  # the same rows again, written in one batch (Postgres: unnest, not VALUES)
    for original in originals:
        copy = {**original, "id": uuid.uuid4().hex, "seq": int(str(original["seq"])) + 10}
        await over_sqlalchemy.write([original], [], "write by SQLAlchemy")
        await store.write_rows([rows.StoredTurn(id=str(copy["id"]), row=copy)])
        pairs.append((str(original["id"]), str(copy["id"])))
        batched = {**original, "id": uuid.uuid4().hex, "seq": int(str(original["seq"])) + 20}
        batch.append(rows.StoredTurn(id=str(batched["id"]), row=batched))
        pairs.append((str(original["id"]), str(batched["id"])))
    await store.write_rows(batch)
    for by_sqlalchemy, by_driver in pairs:
        want = await stored_columns(store, by_sqlalchemy)
        got = await stored_columns(store, by_driver)
        for name in ("id", "seq", "created_at"):
            del want[name], got[name]
        assert got == want
    for _, by_driver in pairs[:2]:  # the lean turn, alone and in the batch
        lean_json = await stored_columns(store, by_driver)
        assert lean_json["weight_version_spans"] == "null"  # JSON null, as SQLAlchemy binds
    for _, by_driver in pairs[4:]:  # the old row, alone and in the batch
        assert (await stored_columns(store, by_driver))["classification"] == "root"


async def test_a_batch_is_idempotent_by_id_and_returns_only_its_late_turns(url: str) -> None:
    store = await Store.open(url)
    try:
        open_session, finished = await new_session(store), await new_session(store)
        await store.finish_session(finished.id, "completed", 1.0, None)
        on_time = [make_turn(open_session.id, seq) for seq in range(30)]
        late = make_turn(finished.id, 0)
        failed = make_turn(finished.id, 1, status=TurnStatus.FAILED)
        batch = [rows.encode_turn(t) for t in [*on_time, late, failed]]
        assert await store.write_rows(batch) == {late.id}
        assert await store.write_rows(batch) == set()  # written again: nothing changes
        stored = {t.id: t for t in await store.list_turns(finished.id)}
        assert (stored[late.id].status, stored[late.id].error) == (TurnStatus.FAILED, LATE_ERROR)
        assert stored[failed.id].error is None  # a failed turn keeps its own error
        assert await store.count_completed_turns(open_session.id) == 30
    finally:
        await store.close()


async def test_a_write_waits_for_a_finish_in_flight_and_sees_it(url: str) -> None:
    """The barrier: the session row is locked FOR SHARE, so a finish whose transaction is
    still open holds the write back, and the turn goes in late once it commits."""
    store = await Store.open(url)
    finisher = create_engine(url)
    try:
        session = await new_session(store)
        turn = make_turn(session.id, 0)
        async with finisher.connect() as conn:
            transaction = await conn.begin()
            await conn.execute(
                text("UPDATE sessions SET status = :s, termination = 'completed' WHERE id = :i"),
                {"s": SessionStatus.FINISHED.value, "i": session.id},
            )
            write = asyncio.create_task(store.write_rows([rows.encode_turn(turn)]))
            await asyncio.sleep(0.5)
            assert not write.done()  # waiting on the finish's row lock
            await transaction.commit()
        assert await asyncio.wait_for(write, 10) == {turn.id}
        assert await store.finished_termination(session.id) == "completed"
    finally:
        await finisher.dispose()
        await store.close()


async def test_refused_writes_keep_the_stores_errors(url: str) -> None:
    store = await Store.open(url)
    try:
        session = await new_session(store)
        with pytest.raises(Conflict, match="cannot write 1 turns"):  # no such session
            await store.write_rows([rows.encode_turn(make_turn("no-such-session", 0))])
        nul = {**row_of(uuid.uuid4().hex, session.id, 1), "requested_model": "m\x00"}
        with pytest.raises(InvalidRequest, match="refused a value"):
            await store.write_rows([rows.StoredTurn(id=str(nul["id"]), row=nul)])
        huge = {**row_of(uuid.uuid4().hex, session.id, 2), "seq": 2**70}
        with pytest.raises(InvalidRequest, match="refused a value") as refused:
            await store.write_rows([rows.StoredTurn(id=str(huge["id"]), row=huge)])
        # asyncpg quotes what it could not encode; the message stays one short line.
        assert len(refused.value.message) < database.DESCRIBED_CHARS + 200
        assert await store.list_turns(session.id) == []
        assert await store.finished_termination(session.id) is None
        assert await store.finished_termination("no-such-session") is None
    finally:
        await store.close()


class Relay:
    """A TCP relay on loopback to the database. It counts what clients send (``sent``:
    one read of the socket each, and a request goes out in one send), and it can break
    every connection relayed so far the way a lost network path does: the client learns
    it only when it next sends (the relay resets it then). Connections made afterwards
    are relayed as usual."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self.sent = 0
        self.sent_bytes = 0
        self._live: list[asyncio.StreamWriter] = []
        self._broken: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    def break_all(self) -> None:
        self._broken.update(self._live)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in self._live:
            writer.transport.abort()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self._target)
        self._live.append(writer)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, up: bool) -> None:
            while data := await src.read(65536):
                self.sent += up
                self.sent_bytes += len(data) if up else 0
                if up and writer in self._broken:
                    writer.transport.abort()  # a reset, as from a path that is gone
                    up_writer.transport.abort()
                    return
                dst.write(data)
                await dst.drain()
            dst.close()  # one side closed: so does the other

        await asyncio.gather(
            pump(reader, up_writer, True), pump(up_reader, writer, False), return_exceptions=True
        )


async def relayed_store(url: str) -> tuple[Relay, Store]:
    parsed = database.parse_url(url)
    relay = Relay(str(parsed.host), int(parsed.port or 5432))
    relayed = parsed.set(host="127.0.0.1", port=await relay.start())
    return relay, await Store.open(relayed.render_as_string(hide_password=False))


async def test_a_status_read_and_a_write_are_one_round_trip_each(url: str) -> None:
    """No reset query on release (asyncpg's default pool sends one), no BEGIN/COMMIT."""
    relay, store = await relayed_store(url)
    try:
        session = await new_session(store)
        await store.write_turns([make_turn(session.id, 0)])  # prepares both statements
        await store.finished_termination(session.id)
        before = relay.sent
        for seq in range(1, 11):
            await store.finished_termination(session.id)
            await store.write_turns([make_turn(session.id, seq)])
        assert relay.sent - before == 20
    finally:
        await store.close()
        await relay.close()


async def test_a_lone_turns_write_binds_scalars_not_an_array_per_column(url: str) -> None:
    """A batch of one row (every lone turn's) is inserted from VALUES: 40 one-element
    arrays, each with its own header, cost asyncpg and the server about 100 us of CPU
    more. So one row sends less than half of what two rows in one batch send."""
    relay, store = await relayed_store(url)
    try:
        session = await new_session(store)
        for seq in range(4):  # both statements prepared
            await store.write_turns([make_turn(session.id, seq)])
            await store.write_turns([make_turn(session.id, 10 + 2 * seq + i) for i in range(2)])

        async def bytes_of(*seqs: int) -> int:
            before = relay.sent_bytes
            await store.write_turns([make_turn(session.id, seq) for seq in seqs])
            return relay.sent_bytes - before

        one, two = await bytes_of(100), await bytes_of(101, 102)
        assert one < two / 2
        assert await store.count_completed_turns(session.id) == 15
    finally:
        await store.close()
        await relay.close()


async def test_connections_a_lost_path_broke_are_replaced_without_an_error(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pooled connection that fails on use (its path broke while it sat in the pool)
    costs no turn: the statement runs again on a new connection, and the store drops
    the engine's idle connections too, without waiting for their idle ping."""
    monkeypatch.setattr(database, "PING_IDLE_S", 3600.0)
    relay, store = await relayed_store(url)
    try:
        session = await new_session(store)
        await store.write_turns([make_turn(session.id, 0)])
        assert await store.finished_termination(session.id) is None
        relay.break_all()
        assert await store.finished_termination(session.id) is None  # no error
        await store.write_turns([make_turn(session.id, 1)])
        assert [t.seq for t in await store.list_turns(session.id)] == [0, 1]
    finally:
        await store.close()
        await relay.close()


async def test_a_stopped_database_is_unavailable_until_it_is_back(
    stoppable_postgres: PostgresServer,
) -> None:
    url = await stoppable_postgres.create_database()
    await upgrade_database(url)
    store = await Store.open(url)
    try:
        session = await new_session(store)
        await asyncio.to_thread(stoppable_postgres.stop)
        try:
            with pytest.raises(RecorderUnavailable, match="read status of session"):
                await store.finished_termination(session.id)
            with pytest.raises(RecorderUnavailable, match="write 1 turns"):
                await store.write_turns([make_turn(session.id, 0)])
        finally:
            await asyncio.to_thread(stoppable_postgres.start)
        await store.write_turns([make_turn(session.id, 0)])
        assert await store.count_completed_turns(session.id) == 1
    finally:
        await store.close()
        await stoppable_postgres.drop_database(url)


async def test_statements_one_at_a_time_take_no_pooled_connection(url: str) -> None:
    """The lane: a turn alone in flight pays no pool checkout and return."""
    store = await Store.open(url)
    try:
        per_turn = store._per_turn
        assert isinstance(per_turn, PostgresTurns)
        session = await new_session(store)
        for seq in range(5):
            assert await store.finished_termination(session.id) is None
            await store.write_turns([make_turn(session.id, seq)])
        assert per_turn._pool.get_size() == 0  # the pool connects on first use: never
        assert await store.count_completed_turns(session.id) == 5
    finally:
        await store.close()


async def test_a_statement_finds_the_lane_busy_and_takes_a_pooled_connection(url: str) -> None:
    """A write held on the lane by a finish's row lock does not hold up a status read;
    cancelled there, it drops the lane, and the next statements run on a new one."""
    store = await Store.open(url)
    finisher = create_engine(url)
    try:
        per_turn = store._per_turn
        assert isinstance(per_turn, PostgresTurns)
        session = await new_session(store)
        async with finisher.connect() as conn:
            transaction = await conn.begin()
            await conn.execute(
                text("UPDATE sessions SET task_id = 'locked' WHERE id = :i"), {"i": session.id}
            )
            write = asyncio.create_task(
                store.write_rows([rows.encode_turn(make_turn(session.id, 0))])
            )
            await asyncio.sleep(0.3)
            assert not write.done()  # on the lane, waiting on the row lock
            assert await asyncio.wait_for(store.finished_termination(session.id), 5) is None
            assert per_turn._pool.get_size() == 1  # the read took a pooled connection
            write.cancel()
            with pytest.raises(asyncio.CancelledError):
                await write
            await transaction.rollback()
        await store.write_turns([make_turn(session.id, 1)])
        assert await store.finished_termination(session.id) is None
        # The cancelled write may still have committed on the server, as with any driver.
        assert {t.seq for t in await store.list_turns(session.id)} in ({1}, {0, 1})
    finally:
        await finisher.dispose()
        await store.close()
