"""How long the proxy stops for Python's garbage collector while it holds many sessions.

Each turn the proxy answers leaves a few tracked objects in its ledger and conversation
book (the turn's node, its tokens, its answer and its new messages) for as long as the
session is held (``LEGO_MAX_SESSIONS_HELD``, 4096 by default), and each full pass of the
collector walks all of them while every turn in flight waits. This fills ``--sessions``
sessions with ``--turns`` growing turns each (the last answer and a short tool result
added per turn, ``--concurrency`` clients), then reports, from the proxy's ``/metrics``,
the full passes that ran while it served (how many, the longest, their total), the
proxy's resident memory, and the turns' latency as the clients saw it (p50, p99, p99.9,
max: a full pass stops every turn in flight, a few in a thousand).

The set-up is ``bench.overhead``'s (a zero-compute engine and ``lego-proxy serve`` on
SQLite, each in its own process). With ``--baseline DIR`` another checkout's proxy is
filled the same way in the same rounds, a fresh proxy of each per round, their order
rotated (the first fill of a run was the slowest, whichever proxy it was); a checkout
without ``lego_gc_*`` reports the clients' side only.

    python -m bench.gc_pauses [--sessions 512] [--turns 20] [--concurrency 16]
        [--rounds 2] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass
from pathlib import Path

if not __package__:
    # Run as ``python bench/gc_pauses.py``: the repository, not this directory, must be on
    # sys.path for ``bench.overhead`` (a sibling) to import.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from bench.overhead import BASELINE, Proxy, add_baseline_argument, percentile, rotated, stack
from kernel.heap import long_lived_frozen

RESULT = "ok: 3 passed, 0 failed in 0.41s; see the log for the details of each test run"
METRICS = (
    "lego_gc_full_collections",
    "lego_gc_full_collection_seconds",
    "lego_gc_longest_full_collection_seconds",
    "lego_gc_reclaims",
)


@dataclass(frozen=True)
class Filled:
    """One proxy after its sessions were filled."""

    name: str
    seconds: float
    latencies: list[float]
    metrics: dict[str, float]
    rss_mib: float
    client_gc_longest_s: float  # the load client's own longest full collection meanwhile


async def fill(proxy: Proxy, keys: list[str], turns: int, concurrency: int) -> list[float]:
    """Every session through ``turns`` growing turns; each turn's latency."""
    queue: asyncio.Queue[str] = asyncio.Queue()
    for key in keys:
        queue.put_nowait(key)
    latencies: list[float] = []

    async def client(http: httpx.AsyncClient) -> None:
        while not queue.empty():
            key = queue.get_nowait()
            messages: list[dict[str, object]] = [
                {"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": f"Fix the failing test ({key[:8]})."},
            ]
            for turn in range(turns):
                began = time.perf_counter()
                response = await http.post(
                    f"{proxy.url}/v1/chat/completions",
                    json={"model": "bench", "messages": messages, "max_tokens": 16},
                    headers={"authorization": f"Bearer {key}"},
                )
                latencies.append(time.perf_counter() - began)
                if response.status_code != 200:
                    raise SystemExit(f"{proxy.name}, turn {turn + 1}: {response.text[:500]}")
                answer = response.json()["choices"][0]["message"]
                messages.append({"role": "assistant", "content": answer["content"] or ""})
                messages.append({"role": "user", "content": f"[{turn}] {RESULT}"})

    # Every client made before the first turn: making one (its TLS context) took 35 ms
    # here, and the turns already started waited for all the others, up to 600 ms for the
    # first turns of a fill: they were its p99.9 and max.
    clients = [httpx.AsyncClient(timeout=120) for _ in range(concurrency)]
    try:
        await asyncio.gather(*(client(http) for http in clients))
    finally:
        await asyncio.gather(*(http.aclose() for http in clients))
    return latencies


def scrape(proxy: Proxy) -> dict[str, float]:
    """The ``lego_gc_*`` values of the proxy's ``/metrics`` (none from older checkouts)."""
    text = httpx.get(f"{proxy.url}/metrics", timeout=30).raise_for_status().text
    found: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in METRICS:
            found[name] = float(value)
    return found


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(proxy: Proxy, sessions: int, turns: int, concurrency: int) -> Filled:
    keys = [proxy.new_session() for _ in range(sessions)]
    # The clients' own heap frozen as they fill (bench.overhead.measure says why): their
    # full collections would show in the latencies as the proxy's.
    with long_lived_frozen() as collections:
        began = time.perf_counter()
        latencies = asyncio.run(fill(proxy, keys, turns, concurrency))
        seconds = time.perf_counter() - began
    return Filled(
        proxy.name,
        seconds,
        latencies,
        scrape(proxy),
        rss_mib(proxy.process.pid),
        collections.longest_s,
    )


def report(filled: Filled, round_: int) -> None:
    ms = sorted(1e3 * latency for latency in filled.latencies)
    print(
        f"round {round_ + 1}, {filled.name}: {len(ms)} turns in {filled.seconds:.0f} s; "
        f"latency p50 {percentile(ms, 0.5):.1f} ms, p99 {percentile(ms, 0.99):.1f} ms, "
        f"p99.9 {percentile(ms, 0.999):.1f} ms, "
        f"max {ms[-1]:.1f} ms; proxy RSS {filled.rss_mib:.0f} MiB; the load client's "
        f"longest full collection {1e3 * filled.client_gc_longest_s:.1f} ms"
    )
    if not filled.metrics:
        print("  full collections: not reported by this checkout")
        return
    count = int(filled.metrics["lego_gc_full_collections"])
    total = 1e3 * filled.metrics["lego_gc_full_collection_seconds"]
    longest = 1e3 * filled.metrics["lego_gc_longest_full_collection_seconds"]
    reclaims = int(filled.metrics.get("lego_gc_reclaims", 0))
    print(
        f"  full collections: {count}, the longest {longest:.1f} ms, {total:.1f} ms in all "
        f"({reclaims} of them reclaims of the frozen heap)"
    )


def run(args: argparse.Namespace) -> None:
    with stack("lego-gc-pauses-") as ready:
        names: list[tuple[str, Path | None]] = [("default", None)]
        if args.baseline is not None:
            names.append((BASELINE, args.baseline))
        for round_ in range(args.rounds):
            for name, checkout in rotated(names, round_):
                proxy = ready.proxy(name, checkout)
                report(measure(proxy, args.sessions, args.turns, args.concurrency), round_)
                proxy.process.terminate()
                proxy.process.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=512)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    add_baseline_argument(parser, "its proxy")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
