"""Recorder throughput: ingest into Postgres, bytes stored per token, export vs loopback.

Synthetic agent sessions (each turn continues the previous one: a new prompt tail plus
sampled tokens, with one 48 x 8 routed-experts row per new token, as SGLang returns for
Qwen3-30B-A3B) go through the production write path (``TurnWriter`` -> ``Store``, with a
spool). Then every group is claimed through the real export route served by uvicorn on
loopback, by the trainer's own client code, in each compact wire form (``b64v1`` base64
JSON; ``binv1`` raw bytes streamed behind JSON headers, what ``trainer_bridge`` uses),
and the same number of bytes is fetched from a plain route on the same server. Each claim
is timed from the request to the body's last byte (the whole HTTP export: database reads,
segment assembly, encoding, transfer), and again to arrays decoded by ``decode_claim``
(``recorder.export_wire``).
Claims take a short lease, so each repeat claims the same groups again; every timing is
the median of ``--repeats`` (raw and export runs interleaved), after one untimed warm-up of
each path.

Reported: ingest tokens/s and MB/s (raw bytes as SGLang sends them: int32 ids, float32
logprobs, int32 experts), stored bytes per new token (the ``turns`` table's size growth)
against the raw compact array bytes (int32 ids, float32 logprobs, uint8 experts), and
export throughput (array bytes delivered per second) against the raw loopback transfer.

    python -m bench.recording [--sessions 24] [--turns 8] [--tokens 1024] [--repeats 3]
                             [--database-url URL]

Targets (issue 5): stored <= 1.3x raw, export >= 50% of raw loopback, ingest >= 200k tok/s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import numpy as np
from fastapi import FastAPI
from fastapi.responses import Response

from kernel.threaded import serve
from proxy.adapters.openai_chat import OpenAIChatAdapter
from proxy.gate import RunGate
from proxy.metrics import Metrics
from proxy.routes import export
from proxy.settings import Settings
from recorder.export import ExportStore
from recorder.export_wire import ClaimedBatch, Segment, decode_claim
from recorder.migrate import upgrade_database
from recorder.records import RoutedExperts, SessionSpec, TurnRecord, TurnStatus
from recorder.scratch_postgres import running_postgres
from recorder.spool import Spool
from recorder.store import Store
from recorder.writer import TurnWriter

LAYERS, TOP_K, EXPERTS = 48, 8, 128
ADMIN_KEY = "bench-admin-key"
GROUP_SIZE = 8
WIRE_FORMATS = ("b64v1", "binv1")  # binv1 is what trainer_bridge asks for
EXPERT_BYTES = 1  # EXPERTS <= 256: stored, and sent, as uint8
LEASE_S = 0.3


def synthetic_turns(
    session_id: str, turns: int, tokens: int, pool: np.ndarray, rng: np.random.Generator
) -> list[TurnRecord]:
    records: list[TurnRecord] = []
    prompt: tuple[int, ...] = tuple(rng.integers(0, 150_000, tokens // 2).tolist())
    parent: TurnRecord | None = None
    for seq in range(turns):
        output = tuple(rng.integers(0, 150_000, tokens // 2).tolist())
        reused = len(parent.prompt_ids) + len(parent.output_ids) if parent else 0
        start = max(0, reused - 1)
        rows = len(prompt) + len(output) - start
        offset = int(rng.integers(0, len(pool) - rows))
        turn = TurnRecord(
            id=uuid.uuid4().hex,
            session_id=session_id,
            seq=seq,
            adapter="openai_chat",
            requested_model="bench",
            status=TurnStatus.COMPLETED,
            prompt_ids=prompt,
            output_ids=output,
            logprobs=tuple(rng.normal(-1.0, 0.5, len(output)).tolist()),
            routed_experts=RoutedExperts(start=start, rows=pool[offset : offset + rows]),
            finish_reason="stop",
            weight_version="v0",
            parent_turn_id=parent.id if parent else None,
            classification="extend" if parent else "root",
            reused_prefix_len=reused,
        )
        records.append(turn)
        parent = turn
        prompt = prompt + output + tuple(rng.integers(0, 150_000, tokens // 2).tolist())
    return records


def new_tokens(turn: TurnRecord) -> int:
    return len(turn.prompt_ids) - turn.reused_prefix_len + len(turn.output_ids)


@contextlib.contextmanager
def database(url: str | None) -> Iterator[str | None]:
    if url:
        yield url
        return
    with running_postgres() as server:
        yield asyncio.run(server.create_database("lego_bench"))


async def table_bytes(store: Store) -> int:
    async with store.engine.connect() as conn:
        value = await conn.exec_driver_sql("SELECT pg_total_relation_size('turns')")
        return int(value.scalar_one())


async def ingest(
    url: str, args: argparse.Namespace, spool_dir: Path
) -> tuple[str, dict[str, float | int | str]]:
    await upgrade_database(url)
    store = await Store.open(url)
    run = await store.create_run(f"bench-{uuid.uuid4().hex[:6]}")
    rng = np.random.default_rng(0)
    pool = rng.integers(0, EXPERTS, (args.tokens * args.turns * 2, LAYERS, TOP_K), dtype=np.int32)
    records: list[TurnRecord] = []
    sessions = []
    for n in range(args.sessions):
        spec = SessionSpec(run.id, f"task{n // GROUP_SIZE}", f"g{n // GROUP_SIZE}", n, "bench")
        session = await store.create_session(spec)
        sessions.append(session.id)
        records += synthetic_turns(session.id, args.turns, args.tokens, pool, rng)
    before = await table_bytes(store)
    writer = TurnWriter(store, spool=Spool.open(spool_dir), max_batch=64, write_timeout_s=30.0)
    writer.start()
    began = time.perf_counter()
    for record in records:
        writer.submit(record)
    await writer.flush()
    elapsed = time.perf_counter() - began
    await writer.close()
    async with store.engine.connect() as conn:  # settle visibility-map/TOAST bookkeeping
        await conn.exec_driver_sql("CHECKPOINT")
    stored = await table_bytes(store) - before
    for session_id in sessions:
        await store.finish_session(session_id, "completed", float(rng.integers(0, 2)), None)
    await store.close()

    tokens = sum(new_tokens(r) for r in records)
    outputs = sum(len(r.output_ids) for r in records)
    rows = sum(r.routed_experts.num_rows for r in records if r.routed_experts is not None)
    wire_raw = 4 * tokens + 4 * outputs + rows * LAYERS * TOP_K * 4  # int32 as SGLang sends
    compact_raw = 4 * tokens + 4 * outputs + rows * LAYERS * TOP_K  # uint8 experts
    return run.id, {
        "turns": len(records),
        "new tokens": tokens,
        "ingest s": elapsed,
        "ingest tokens/s": tokens / elapsed,
        "ingest MB/s (SGLang int32 bytes)": wire_raw / elapsed / 1e6,
        "stored bytes/token": stored / tokens,
        "raw compact bytes/token": compact_raw / tokens,
        "stored / raw compact": stored / compact_raw,
        "stored / raw SGLang int32": stored / wire_raw,
        "spooled turns": writer.spooled,
    }


def export_vs_loopback(
    url: str, run_id: str, groups: int, repeats: int, wire_formats: Sequence[str]
) -> dict[str, float | int | str]:
    settings = Settings(admin_key=ADMIN_KEY, database_url=url)
    app = FastAPI()
    app.include_router(export.build_router(settings, OpenAIChatAdapter().error_response))
    blob = bytearray()

    @app.get("/raw")
    async def raw_bytes() -> Response:
        return Response(bytes(blob), media_type="application/octet-stream")

    with serve(app) as base, httpx.Client(base_url=base, timeout=600) as client:
        # The routes' database engines must live on the server's event loop: build them
        # there, through a one-off route.
        @app.post("/bench-setup")
        async def setup() -> Response:
            store = await Store.open(url)
            state = export.ExportState(
                store, ExportStore.open(url), TurnWriter(store), RunGate(), Metrics()
            )
            app.state.lego_export = state
            return Response(b"{}")

        client.post("/bench-setup").raise_for_status()

        def claim(wire: str) -> tuple[httpx.Response, float, float, ClaimedBatch]:
            """One claim of every group, timed to the last byte, then to decoded arrays.

            A short lease: once it expired, the next claim gets the same groups again.
            """
            time.sleep(LEASE_S)
            began = time.perf_counter()
            response = client.post(
                f"/api/v1/runs/{run_id}/claims?format={wire}",
                json={"groups": groups, "lease_s": LEASE_S},
                headers={"authorization": f"Bearer {ADMIN_KEY}"},
            )
            received = time.perf_counter()
            response.raise_for_status()
            batch = decode_claim(response.content)
            decoded = time.perf_counter()
            assert len(batch.groups) == groups, "every group is claimed each time"
            return response, received - began, decoded - began, batch

        def fetch_raw() -> float:
            began = time.perf_counter()
            raw = client.get("/raw")
            elapsed = time.perf_counter() - began
            assert len(raw.content) == array_bytes
            return elapsed

        # Warm both paths (connections, statement caches) before timing either.
        array_bytes = _array_bytes(claim(wire_formats[0])[3])
        blob.extend(np.random.default_rng(1).bytes(array_bytes))
        fetch_raw()
        # Interleaved, so that a busy machine slows every path alike.
        raw_times: list[float] = []
        runs: dict[str, list[tuple[httpx.Response, float, float, ClaimedBatch]]] = {
            wire: [] for wire in wire_formats
        }
        for _ in range(repeats):
            raw_times.append(fetch_raw())
            for wire in wire_formats:
                runs[wire].append(claim(wire))
        _assert_same_arrays(*(timed[0][3] for timed in runs.values()))
    raw_s = statistics.median(raw_times)
    results: dict[str, float | int | str] = {
        "export groups": groups,
        "export array MB": array_bytes / 1e6,
        "timing": f"median of {repeats} (after one warm-up)",
        "raw loopback MB/s": array_bytes / raw_s / 1e6,
    }
    for wire, timed in runs.items():
        export_s = statistics.median(t[1] for t in timed)
        decoded_s = statistics.median(t[2] for t in timed)
        results |= {
            f"{wire}: response MB": len(timed[0][0].content) / 1e6,
            f"{wire}: export MB/s (array bytes)": array_bytes / export_s / 1e6,
            f"{wire}: export / raw loopback": raw_s / export_s,
            f"{wire}: export+decode / raw loopback": raw_s / decoded_s,
        }
    return results


def _array_bytes(batch: ClaimedBatch) -> int:
    """Bytes of the arrays a claim carries, in their compact dtypes: int32 tokens, uint8
    loss mask, float32 logprobs, uint8 routed experts."""
    total = 0
    for seg in _segments(batch):
        total += seg.tokens.size * (4 + 1 + 4)
        if seg.routed_experts is not None:
            total += seg.routed_experts.size * EXPERT_BYTES
    return total


def _assert_same_arrays(*batches: ClaimedBatch) -> None:
    """Every wire form delivered the same arrays, bit for bit."""
    first, *others = batches
    for other in others:
        for a, b in zip(_segments(first), _segments(other), strict=True):
            for key in ("tokens", "loss_mask", "logprobs", "routed_experts"):
                np.testing.assert_array_equal(getattr(a, key), getattr(b, key))


def _segments(batch: ClaimedBatch) -> Iterator[Segment]:
    for group in batch.groups:
        for sample in group.samples:
            yield from sample.segments


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=24)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=1024, help="new tokens per turn")
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--repeats", type=int, default=3, help="timed claims per wire form")
    parser.add_argument(
        "--formats", default=",".join(WIRE_FORMATS), help="wire forms to measure, in order"
    )
    args = parser.parse_args()
    with database(args.database_url) as url, tempfile.TemporaryDirectory() as tmp:
        assert url is not None
        run_id, results = asyncio.run(ingest(url, args, Path(tmp) / "spool"))
        groups = -(-args.sessions // GROUP_SIZE)
        wire_formats = args.formats.split(",")
        results |= export_vs_loopback(url, run_id, groups, args.repeats, wire_formats)
    width = max(len(k) for k in results)
    for key, value in results.items():
        print(
            f"{key:<{width}}  {value:,.3f}"
            if isinstance(value, float)
            else f"{key:<{width}}  {value}"
        )


if __name__ == "__main__":
    main()
