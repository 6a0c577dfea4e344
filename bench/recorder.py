"""Recorder throughput: ingest into Postgres, bytes stored per token, export vs loopback.

Synthetic agent sessions (each turn continues the previous one: a new prompt tail plus
sampled tokens, with one 48 x 8 routed-experts row per new token, as SGLang returns for
Qwen3-30B-A3B) go through the production write path (``TurnWriter`` -> ``Store``, with a
spool). Then every group is claimed through the real export route served by uvicorn on
loopback, and the same number of bytes is fetched from a plain route on the same server.

Reported: ingest tokens/s and MB/s (raw bytes as SGLang sends them: int32 ids, float32
logprobs, int32 experts), stored bytes per new token (the ``turns`` table's size growth)
against the raw compact array bytes (int32 ids, float32 logprobs, uint8 experts), and
export throughput (array bytes delivered per second) against the raw loopback transfer.

    python -m bench.recorder [--sessions 24] [--turns 8] [--tokens 1024] [--database-url URL]

(Run it as a module: as a script, its own directory would come first on ``sys.path`` and
this file would shadow the ``recorder`` package it measures.)

Targets (issue 5): stored <= 1.3x raw, export >= 50% of raw loopback, ingest >= 200k tok/s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
from fastapi import FastAPI
from fastapi.responses import Response

from proxy.adapters.openai_chat import OpenAIChatAdapter
from proxy.gate import RunGate
from proxy.metrics import Metrics
from proxy.routes import export
from proxy.settings import Settings
from proxy.threaded import serve
from recorder.export import ExportStore
from recorder.migrate import upgrade_database
from recorder.records import RoutedExperts, SessionSpec, TurnRecord, TurnStatus
from recorder.spool import Spool
from recorder.store import Store
from recorder.writer import TurnWriter
from tests.support.postgres import running_postgres

LAYERS, TOP_K, EXPERTS = 48, 8, 128
ADMIN_KEY = "bench-admin-key"
GROUP_SIZE = 8


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
) -> tuple[str, dict[str, float]]:
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


def export_vs_loopback(url: str, run_id: str, groups: int) -> dict[str, float]:
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
        headers = {"authorization": f"Bearer {ADMIN_KEY}"}
        began = time.perf_counter()
        response = client.post(
            f"/api/v1/runs/{run_id}/claims?format=b64v1",
            json={"groups": groups},
            headers=headers,
        )
        export_s = time.perf_counter() - began
        response.raise_for_status()
        body = response.json()
        array_bytes = 0
        for group in body["groups"]:
            for sample in group["samples"]:
                for seg in sample["segments"]:
                    for key in ("tokens", "loss_mask", "logprobs", "routed_experts"):
                        if seg[key] is not None:
                            shape = seg[key]["shape"]
                            itemsize = np.dtype(seg[key]["dtype"]).itemsize
                            array_bytes += int(np.prod(shape)) * itemsize
        blob.extend(np.random.default_rng(1).bytes(array_bytes))
        client.get("/raw").raise_for_status()  # warm the path
        began = time.perf_counter()
        raw = client.get("/raw")
        raw_s = time.perf_counter() - began
        assert len(raw.content) == array_bytes
    return {
        "export groups": len(body["groups"]),
        "export array MB": array_bytes / 1e6,
        "export response MB (b64v1 JSON)": len(response.content) / 1e6,
        "export MB/s (array bytes)": array_bytes / export_s / 1e6,
        "raw loopback MB/s": array_bytes / raw_s / 1e6,
        "export / raw loopback": raw_s / export_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=24)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=1024, help="new tokens per turn")
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()
    with database(args.database_url) as url, tempfile.TemporaryDirectory() as tmp:
        assert url is not None
        run_id, results = asyncio.run(ingest(url, args, Path(tmp) / "spool"))
        results |= export_vs_loopback(url, run_id, groups=args.sessions // GROUP_SIZE + 1)
    width = max(len(k) for k in results)
    for key, value in results.items():
        print(
            f"{key:<{width}}  {value:,.3f}"
            if isinstance(value, float)
            else f"{key:<{width}}  {value}"
        )


if __name__ == "__main__":
    main()
