"""Scale-out load: concurrent streaming sessions spread over several proxy replicas.

Starts, each in its own process: a zero-compute engine (instant fixed replies, so the
proxy is what is measured), N ``lego-proxy serve`` replicas on one Postgres (the one in
``LEGO_TEST_POSTGRES_URL``, else a throwaway cluster), and drives S sessions at once, each
a T-turn streamed conversation whose every turn goes to the replica its key hashes to (as
the nginx gateway of deploy/ does). The same number of concurrent streams is also sent
straight to the engine in the same run, for the baseline of the added latency.

Reports turns/s, per-turn latency p50/p99 through the proxies and direct, the added
latency, errors (HTTP or in-band; must be zero) and whether every completed turn is in
the database exactly once (the turn rows, counted per session, against what the clients
received).

    python -m bench.load [--sessions 1000] [--turns 3] [--replicas 3]   # from the repo root
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import subprocess
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from engine.tiny import ensure_tiny_model
from kernel.heap import long_lived_frozen
from kernel.paths import default_model_dir
from kernel.process import python_module, start_server
from kernel.threaded import free_port
from recorder.migrate import upgrade_database
from recorder.scratch_postgres import running_postgres

ADMIN_KEY = "bench-admin-key"
SYSTEM = "You are a coding agent. Use the shell tool when useful."


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    completed: dict[str, int] = field(default_factory=dict)  # session id -> turns received


def _stop_all(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        process.terminate()
        process.wait(timeout=60)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def replica_for(key: str, replicas: int) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest()) % replicas


async def stream_turn(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str]
) -> tuple[str, str | None]:
    """One streamed turn; returns (assistant text, error or None)."""
    parts: list[str] = []
    async with client.stream("POST", url, json=body, headers=headers) as response:
        if response.status_code != 200:
            await response.aread()
            return "", f"HTTP {response.status_code}: {response.text[:200]}"
        async for line in response.aiter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if "error" in chunk:
                return "", f"in-band: {chunk['error']}"
            for choice in chunk.get("choices", []):
                parts.append(choice.get("delta", {}).get("content") or "")
    return "".join(parts), None


async def session_loop(
    client: httpx.AsyncClient,
    proxies: list[str],
    session: dict[str, Any],
    turns: int,
    tally: Tally,
    go: asyncio.Event,
) -> None:
    key = session["key"]
    url = f"{proxies[replica_for(key, len(proxies))]}/v1/chat/completions"
    headers = {"authorization": f"Bearer {key}"}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Task {session['id'][:8]}: list the files."},
    ]
    await go.wait()
    for turn in range(turns):
        body = {"model": "bench", "messages": messages, "max_tokens": 16, "stream": True}
        began = time.perf_counter()
        try:
            reply, error = await stream_turn(client, url, body, headers)
        except httpx.HTTPError as exc:
            reply, error = "", f"transport: {exc!r}"
        if error is not None:
            tally.errors.append(error)
            return
        tally.latencies.append(time.perf_counter() - began)
        tally.completed[session["id"]] = tally.completed.get(session["id"], 0) + 1
        messages += [
            {"role": "assistant", "content": reply},
            {"role": "user", "content": f"Now step {turn + 2}."},
        ]


async def direct_loop(
    client: httpx.AsyncClient, engine: str, body: dict[str, Any], turns: int, tally: Tally
) -> None:
    for _ in range(turns):
        began = time.perf_counter()
        try:
            async with client.stream("POST", f"{engine}/generate", json=body) as response:
                async for _ in response.aiter_lines():
                    pass
                if response.status_code != 200:
                    tally.errors.append(f"direct HTTP {response.status_code}")
                    return
        except httpx.HTTPError as exc:
            tally.errors.append(f"direct transport: {exc!r}")
            return
        tally.latencies.append(time.perf_counter() - began)


async def count_recorded(database_url: str, expected: dict[str, int]) -> dict[str, int]:
    """Completed turn rows per session, polled until the writers have caught up."""
    engine = create_async_engine(database_url)
    try:
        deadline = time.monotonic() + 60
        while True:
            async with engine.connect() as conn:
                rows = await conn.execute(
                    text(
                        "SELECT session_id, count(*), count(DISTINCT id) FROM turns "
                        "WHERE status = 'completed' GROUP BY session_id"
                    )
                )
                found = {}
                for session_id, count, distinct in rows:
                    if count != distinct:
                        raise SystemExit(f"session {session_id}: duplicate turn ids")
                    found[str(session_id)] = int(count)
            if found == expected or time.monotonic() > deadline:
                return found
            await asyncio.sleep(0.5)
    finally:
        await engine.dispose()


async def drive(args: argparse.Namespace, proxies: list[str], engine: str, model: Path) -> None:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=args.sessions)
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        run = (
            await client.post(f"{proxies[0]}/api/v1/runs", json={"name": "load"}, headers=admin)
        ).json()
        semaphore = asyncio.Semaphore(64)

        async def create(index: int) -> dict[str, Any]:
            async with semaphore:
                body = {
                    "task_id": f"t{index}",
                    "group_id": f"g{index // 8}",
                    "sample_index": index % 8,
                }
                response = await client.post(
                    f"{proxies[index % len(proxies)]}/api/v1/runs/{run['id']}/sessions",
                    json=body,
                    headers=admin,
                )
                return dict(response.raise_for_status().json())

        sessions = await asyncio.gather(*(create(i) for i in range(args.sessions)))

        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(model))
        prompt = tokenizer.apply_chat_template(
            [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": "Task: list the files."},
            ],
            add_generation_prompt=True,
            tokenize=False,
        )
        direct_body = {
            "input_ids": tokenizer.encode(prompt, add_special_tokens=False),
            "sampling_params": {
                "max_new_tokens": 16,
                "skip_special_tokens": False,
                "no_stop_trim": True,
            },
            "stream": True,
            "return_logprob": True,
            "return_routed_experts": True,
            "routed_experts_start_len": 0,
        }

        # This client's heap frozen while it measures (bench.overhead.measure says why).
        with long_lived_frozen() as collections:
            direct = Tally()
            began = time.perf_counter()
            await asyncio.gather(
                *(direct_loop(client, engine, direct_body, args.turns, direct) for _ in sessions)
            )
            direct_s = time.perf_counter() - began

            through = Tally()
            go = asyncio.Event()
            tasks = [
                asyncio.create_task(session_loop(client, proxies, s, args.turns, through, go))
                for s in sessions
            ]
            await asyncio.sleep(0.1)
            began = time.perf_counter()
            go.set()
            await asyncio.gather(*tasks)
            proxy_s = time.perf_counter() - began

    recorded = await count_recorded(args.database_url, through.completed)
    turns = len(through.latencies)
    exactly_once = recorded == through.completed
    report = {
        "sessions": args.sessions,
        "replicas": len(proxies),
        "turns_per_session": args.turns,
        "completed_turns": turns,
        "turns_per_s": turns / proxy_s,
        "direct_turns_per_s": len(direct.latencies) / direct_s,
        "proxy_p50_ms": 1e3 * percentile(through.latencies, 0.5),
        "proxy_p99_ms": 1e3 * percentile(through.latencies, 0.99),
        "direct_p50_ms": 1e3 * percentile(direct.latencies, 0.5),
        "direct_p99_ms": 1e3 * percentile(direct.latencies, 0.99),
        "errors": len(through.errors) + len(direct.errors),
        "error_samples": (through.errors + direct.errors)[:5],
        "recorded_turns": sum(recorded.values()),
        "recorded_exactly_once": exactly_once,
        "cpus": os.cpu_count(),
        "client_gc_longest_ms": 1e3 * collections.longest_s,
    }
    report["added_p50_ms"] = report["proxy_p50_ms"] - report["direct_p50_ms"]
    report["added_p99_ms"] = report["proxy_p99_ms"] - report["direct_p99_ms"]
    print(json.dumps(report, indent=2))
    if report["errors"] or not exactly_once:
        raise SystemExit(1)


def run(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="lego-load-"))
    model = ensure_tiny_model(default_model_dir(root))
    with ExitStack() as stack:
        server = stack.enter_context(running_postgres())
        args.database_url = asyncio.run(server.create_database("lego_load"))
        asyncio.run(upgrade_database(args.database_url))
        processes: list[subprocess.Popen[bytes]] = []
        stack.callback(_stop_all, processes)
        env = {**os.environ, "LEGO_DATA_DIR": str(root)}
        engine_port = free_port()
        engine = f"http://127.0.0.1:{engine_port}"
        processes.append(
            start_server(
                python_module(
                    "engine",
                    "--model",
                    str(model),
                    "--port",
                    str(engine_port),
                    "--zero-compute",
                    "--enable-return-routed-experts",
                ),
                env,
                f"{engine}/health",
                root / "engine.log",
            )
        )
        proxies = []
        for index in range(args.replicas):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            replica_env = {
                **env,
                "LEGO_DATA_DIR": str(root / f"replica-{index}"),
                "LEGO_DATABASE_URL": args.database_url,
                "LEGO_BACKEND_URL": engine,
                "LEGO_TOKENIZER_PATH": str(model),
                "LEGO_ADMIN_KEY": ADMIN_KEY,
                "LEGO_PORT": str(port),
            }
            processes.append(
                start_server(
                    python_module("cli.main", "serve", "--log-level", "warning"),
                    replica_env,
                    f"{url}/readyz",
                    root / f"proxy-{index}.log",
                )
            )
            proxies.append(url)
        asyncio.run(drive(args, proxies, engine, model))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=3)
    run(parser.parse_args())


if __name__ == "__main__":
    main()
