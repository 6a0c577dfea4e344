"""Fault soak: a streaming multi-turn load over two replicas on Postgres, under faults.

Starts, each in its own process on loopback: a throwaway Postgres cluster (its own, since
it is stopped), a zero-compute engine, and two ``lego-proxy serve`` replicas. Sessions
run streamed multi-turn conversations, each turn to the replica its key hashes to; a
turn that fails (HTTP error, in-band error, dropped connection) is sent again, as a
harness does. Meanwhile, on a fixed schedule within ``--duration``:

1. Postgres is stopped for ``--outage`` seconds (turns are spooled and replayed);
2. replica 0's disk refuses every write (journal and spool): its file-size limit is set
   to 0 with ``prlimit``, which needs no privilege (a small tmpfs or loop device would
   need root); during it Postgres is stopped for a few seconds too, so some turns have
   nowhere durable to go and must fail rather than be answered; replica 0 is then
   SIGKILLed while its disk is still refusing, and restarted;
3. replica 1 is SIGKILLed mid-stream and restarted on its data directory (its journal
   is replayed);
4. the engine is SIGKILLed and restarted (failed turns are recorded as failed).

Then every session is finished (group size 1) and every group claimed and acked. The
report counts, by turn id (the ``chatcmpl-<turn id>`` of each answer): turns clients
received in full, how many of them are recorded ``completed``, how many are exported,
and duplicates. The target: every turn a client received in full is recorded and
exported exactly once. Exit status 1 when it is missed.

    python -m bench.soak [--sessions 16] [--turns 6] [--duration 60]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import resource
import signal
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from engine.tiny import ensure_tiny_model
from kernel.paths import default_model_dir
from kernel.process import python_module, start_server
from kernel.threaded import free_port
from recorder.migrate import upgrade_database
from recorder.scratch_postgres import PostgresServer, running_postgres

ADMIN_KEY = "soak-admin-key-of-enough-length"
RETRY_S = 0.3


@dataclass
class Tally:
    received: list[str] = field(default_factory=list)  # turn ids answered in full
    failures: Counter[str] = field(default_factory=Counter)  # by kind
    sessions: list[dict[str, Any]] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)


class Process:
    """A server child that can be SIGKILLed and started again with the same command."""

    def __init__(self, cmd: list[str], env: dict[str, str], health: str, log: Path) -> None:
        self._cmd, self._env, self._health, self._log = cmd, env, health, log
        self.process = start_server(cmd, env, health, log)

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def restart(self) -> None:
        self.process = start_server(self._cmd, self._env, self._health, self._log)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=60)

    def refuse_writes(self, refuse: bool) -> None:
        """Every file write of the process fails (EFBIG) while ``refuse``: a full disk."""
        _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        limit = (0, hard) if refuse else (hard, hard)
        resource.prlimit(self.process.pid, resource.RLIMIT_FSIZE, limit)


def replica_for(key: str, replicas: int) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest()) % replicas


async def one_turn(
    client: httpx.AsyncClient, url: str, key: str, messages: list[dict[str, Any]]
) -> tuple[str, str] | str:
    """(turn id, reply) for a turn received in full, else the kind of failure."""
    body = {"model": "soak", "messages": messages, "max_tokens": 16, "stream": True}
    headers = {"authorization": f"Bearer {key}"}
    parts: list[str] = []
    turn_id, finished, done = "", False, False
    try:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            if response.status_code != 200:
                await response.aread()
                return f"http {response.status_code}"
            async for line in response.aiter_lines():
                if line.strip() == "data: [DONE]":
                    done = True
                    continue
                if not line.startswith("data:"):
                    continue
                chunk = json.loads(line[5:])
                if "error" in chunk:
                    return f"in-band {chunk['error'].get('code')}"
                turn_id = str(chunk["id"]).removeprefix("chatcmpl-")
                for choice in chunk.get("choices", []):
                    parts.append(choice.get("delta", {}).get("content") or "")
                    finished = finished or choice.get("finish_reason") is not None
    except httpx.HTTPError as exc:
        return f"transport {type(exc).__name__}"
    if not (finished and done):
        return "stream cut"
    return turn_id, "".join(parts)


async def conversation(
    client: httpx.AsyncClient,
    proxies: list[str],
    run_id: str,
    index: int,
    args: argparse.Namespace,
    tally: Tally,
    until: float,
) -> None:
    while time.monotonic() < until:
        session = await _create(client, proxies[0], run_id, index, len(tally.sessions))
        if session is None:
            await asyncio.sleep(RETRY_S)
            continue
        tally.sessions.append(session)
        url = f"{proxies[replica_for(session['key'], len(proxies))]}/v1/chat/completions"
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": f"Task {session['id'][:8]}: list the files."},
        ]
        turns = 0
        while turns < args.turns and time.monotonic() < until:
            outcome = await one_turn(client, url, session["key"], messages)
            if isinstance(outcome, str):
                tally.failures[outcome] += 1
                await asyncio.sleep(RETRY_S)
                continue
            turn_id, reply = outcome
            tally.received.append(turn_id)
            turns += 1
            messages += [
                {"role": "assistant", "content": reply},
                {"role": "user", "content": f"Now step {turns + 1}."},
            ]


async def _create(
    client: httpx.AsyncClient, proxy: str, run_id: str, index: int, serial: int
) -> dict[str, Any] | None:
    body = {"task_id": f"t{index}", "group_id": f"g{index}-{serial}", "group_size": 1}
    try:
        response = await client.post(
            f"{proxy}/api/v1/runs/{run_id}/sessions", json=body, headers=_admin()
        )
    except httpx.HTTPError:
        return None
    return dict(response.json()) if response.status_code == 200 else None


def _admin() -> dict[str, str]:
    return {"authorization": f"Bearer {ADMIN_KEY}"}


async def faults(
    args: argparse.Namespace,
    postgres: PostgresServer,
    replicas: list[Process],
    engine: Process,
    tally: Tally,
) -> None:
    step = args.duration / 6

    async def note(what: str) -> None:
        tally.faults.append(f"{time.monotonic() - began:6.1f}s {what}")

    began = time.monotonic()
    await asyncio.sleep(step)
    await note("postgres stopped")
    await asyncio.to_thread(postgres.stop)
    await asyncio.sleep(args.outage)
    await asyncio.to_thread(postgres.start)
    await note("postgres started")
    await asyncio.sleep(step / 2)
    replicas[0].refuse_writes(True)
    await note("replica 0: its disk refuses every write")
    await asyncio.sleep(step / 3)
    await asyncio.to_thread(postgres.stop)
    await note("postgres stopped (replica 0 has no durable place now)")
    await asyncio.sleep(min(3.0, step / 3))
    await asyncio.to_thread(postgres.start)
    await note("postgres started")
    await asyncio.sleep(step / 3)
    replicas[0].kill()
    await note("replica 0 SIGKILLed (disk still refusing)")
    await asyncio.to_thread(replicas[0].restart)
    await note("replica 0 restarted")
    await asyncio.sleep(step / 2)
    replicas[1].kill()
    await note("replica 1 SIGKILLed mid-stream")
    await asyncio.to_thread(replicas[1].restart)
    await note("replica 1 restarted")
    await asyncio.sleep(step / 2)
    engine.kill()
    await note("engine SIGKILLed")
    await asyncio.sleep(1.0)
    await asyncio.to_thread(engine.restart)
    await note("engine restarted")


async def drive(
    args: argparse.Namespace,
    postgres: PostgresServer,
    proxies: list[str],
    replicas: list[Process],
    engine: Process,
) -> dict[str, Any]:
    tally = Tally()
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=args.sessions * 2)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        runs = f"{proxies[0]}/api/v1/runs"
        run = await client.post(runs, json={"name": "soak"}, headers=_admin())
        run_id = run.raise_for_status().json()["id"]
        until = time.monotonic() + args.duration
        await asyncio.gather(
            faults(args, postgres, replicas, engine, tally),
            *(
                conversation(client, proxies, run_id, i, args, tally, until)
                for i in range(args.sessions)
            ),
        )
        recorded = await _recorded(args.database_url, set(tally.received))
        exported = await _finish_and_export(client, proxies, tally, run_id)
    received = Counter(tally.received)
    report = {
        "duration_s": args.duration,
        "sessions": len(tally.sessions),
        "faults": tally.faults,
        "turns_received_in_full": len(received),
        "received_recorded": sum(1 for t in received if t in recorded),
        "received_exported": sum(1 for t in received if exported[t] == 1),
        "exported_twice": sum(1 for count in exported.values() if count > 1),
        "received_twice": sum(1 for count in received.values() if count > 1),
        "missing_from_database": sorted(t for t in received if t not in recorded)[:5],
        "missing_from_export": sorted(t for t in received if exported[t] != 1)[:5],
        "failed_attempts_by_kind": dict(tally.failures),
    }
    report["target_met"] = (
        report["received_recorded"] == report["received_exported"] == len(received)
        and not report["exported_twice"]
        and not report["received_twice"]
    )
    return report


async def _recorded(database_url: str, wanted: set[str]) -> set[str]:
    """Completed turn ids in the database, polled while the writers catch up (spools)."""
    engine = create_async_engine(database_url)
    try:
        deadline = time.monotonic() + 60
        while True:
            async with engine.connect() as conn:
                rows = await conn.execute(text("SELECT id FROM turns WHERE status = 'completed'"))
                found = {str(row[0]) for row in rows}
            if wanted <= found or time.monotonic() > deadline:
                return found
            await asyncio.sleep(0.5)
    finally:
        await engine.dispose()


async def _finish_and_export(
    client: httpx.AsyncClient, proxies: list[str], tally: Tally, run_id: str
) -> Counter[str]:
    for session in tally.sessions:
        body = {"termination": "completed", "reward": 1.0}
        finish = f"{proxies[0]}/api/v1/sessions/{session['id']}/finish"
        (await client.post(finish, json=body, headers=_admin())).raise_for_status()
    exported: Counter[str] = Counter()
    while True:
        claim = await client.post(
            f"{proxies[1]}/api/v1/runs/{run_id}/claims", json={"groups": 200}, headers=_admin()
        )
        batch = claim.raise_for_status().json()
        if not batch["groups"]:
            return exported
        for group in batch["groups"]:
            for sample in group["samples"]:
                for segment in sample["segments"]:
                    exported.update(segment["turn_ids"])
        ack = f"{proxies[1]}/api/v1/batches/{batch['batch_id']}/ack"
        (await client.post(ack, headers=_admin())).raise_for_status()


def run(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="lego-soak-"))
    model = ensure_tiny_model(default_model_dir(root))
    with ExitStack() as stack:
        postgres = stack.enter_context(running_postgres(own=True))
        args.database_url = asyncio.run(postgres.create_database("lego_soak"))
        asyncio.run(upgrade_database(args.database_url))
        env = {k: v for k, v in os.environ.items() if not k.startswith("LEGO_")}
        env["LEGO_DATA_DIR"] = str(root)
        port = free_port()
        engine_url = f"http://127.0.0.1:{port}"
        engine = Process(
            python_module("engine", "--model", str(model), "--port", str(port), "--zero-compute"),
            env,
            f"{engine_url}/health",
            root / "engine.log",
        )
        stack.callback(engine.stop)
        replicas, proxies = [], []
        for index in range(2):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            replica = Process(
                python_module("cli.main", "serve", "--log-level", "warning"),
                env
                | {
                    "LEGO_DATA_DIR": str(root / f"replica-{index}"),
                    "LEGO_DATABASE_URL": args.database_url,
                    "LEGO_BACKEND_URL": engine_url,
                    "LEGO_TOKENIZER_PATH": str(model),
                    "LEGO_ADMIN_KEY": ADMIN_KEY,
                    "LEGO_PORT": str(port),
                },
                f"{url}/healthz",
                root / f"proxy-{index}.log",
            )
            stack.callback(replica.stop)
            replicas.append(replica)
            proxies.append(url)
        report = asyncio.run(drive(args, postgres, proxies, replicas, engine))
    report["logs"] = str(root)
    print(json.dumps(report, indent=2))
    if not report["target_met"]:
        raise SystemExit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=16, help="concurrent conversations")
    parser.add_argument("--turns", type=int, default=6, help="turns per conversation")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load")
    parser.add_argument("--outage", type=float, default=8.0, help="seconds Postgres is down")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
