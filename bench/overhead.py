"""Proxy overhead: the same turns sent straight to the engine and through the proxy.

The engine runs in zero-compute mode (fixed reply, no forward pass) so that what is
measured is the proxy: parsing, rendering, the backend round trip it adds, output parsing,
streaming and recording. Engine and proxy each run in their own process, as deployed; the
load generator is this process. Both paths are measured in the same run, interleaved in
rounds, and the result is printed as ratios and differences against the direct baseline.

    python -m bench.overhead [--requests 300] [--concurrency 1 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

from engine.tiny import ensure_tiny_model
from kernel.paths import default_model_dir
from kernel.process import python_module, start_server
from kernel.threaded import free_port

ADMIN_KEY = "bench-admin-key"
MESSAGES = [
    {"role": "system", "content": "You are a coding agent. Use the shell tool when useful."},
    {"role": "user", "content": "List the files in the repository and summarise them."},
]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def measure(
    call: Callable[[httpx.AsyncClient], Awaitable[None]], requests: int, concurrency: int
) -> tuple[list[float], float]:
    latencies: list[float] = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        for _ in range(min(concurrency, 8)):  # warm connections and caches
            await call(client)
        queue = iter(range(requests))

        async def worker() -> None:
            for _ in queue:
                began = time.perf_counter()
                await call(client)
                latencies.append(time.perf_counter() - began)

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - began
    return latencies, requests / elapsed


def run(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="lego-bench-"))
    model = ensure_tiny_model(default_model_dir(root))
    engine_port, proxy_port = free_port(), free_port()
    engine_url = f"http://127.0.0.1:{engine_port}"
    proxy_url = f"http://127.0.0.1:{proxy_port}"
    env = {**os.environ, "LEGO_DATA_DIR": str(root)}
    engine = start_server(
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
        f"{engine_url}/health",
        root / "engine.log",
    )
    proxy_env = {
        **env,
        "LEGO_BACKEND_URL": engine_url,
        "LEGO_TOKENIZER_PATH": str(model),
        "LEGO_ADMIN_KEY": ADMIN_KEY,
        "LEGO_PORT": str(proxy_port),
    }
    proxy = start_server(
        python_module("cli.main", "serve", "--log-level", "warning"),
        proxy_env,
        f"{proxy_url}/healthz",
        root / "proxy.log",
    )
    try:
        admin = {"authorization": f"Bearer {ADMIN_KEY}"}
        run_id = httpx.post(
            f"{proxy_url}/api/v1/runs", json={"name": "bench"}, headers=admin
        ).json()["id"]
        key = httpx.post(
            f"{proxy_url}/api/v1/runs/{run_id}/sessions",
            json={"task_id": "bench", "group_id": "g"},
            headers=admin,
        ).json()["key"]
        chat_body = {"model": "bench", "messages": MESSAGES, "max_tokens": 16}
        # The direct path sends exactly what the proxy sends the engine for this turn.
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(model))
        prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
        generate_body = {
            "input_ids": tokenizer.encode(prompt, add_special_tokens=False),
            "sampling_params": {
                "max_new_tokens": 16,
                "skip_special_tokens": False,
                "no_stop_trim": True,
                "spaces_between_special_tokens": False,
            },
            "stream": True,
            "return_logprob": True,
            "return_routed_experts": True,
            "routed_experts_start_len": 0,
        }

        asyncio.run(compare(args, engine_url, proxy_url, key, chat_body, generate_body))
    finally:
        for process in (proxy, engine):
            process.terminate()
            process.wait(timeout=30)


async def compare(
    args: argparse.Namespace,
    engine_url: str,
    proxy_url: str,
    key: str,
    chat_body: dict[str, object],
    generate_body: dict[str, object],
) -> None:

    async def direct(client: httpx.AsyncClient) -> None:
        async with client.stream("POST", f"{engine_url}/generate", json=generate_body) as response:
            async for _ in response.aiter_lines():
                pass
            response.raise_for_status()

    async def through_proxy(client: httpx.AsyncClient) -> None:
        response = await client.post(
            f"{proxy_url}/v1/chat/completions",
            json=chat_body,
            headers={"authorization": f"Bearer {key}"},
        )
        response.raise_for_status()

    results: dict[str, object] = {}
    for concurrency in args.concurrency:
        direct_lat: list[float] = []
        proxy_lat: list[float] = []
        direct_rps: list[float] = []
        proxy_rps: list[float] = []
        per_round = max(args.requests // args.rounds, concurrency)
        for _ in range(args.rounds):  # interleaved, so machine noise hits both alike
            lat, rps = await measure(direct, per_round, concurrency)
            direct_lat += lat
            direct_rps.append(rps)
            lat, rps = await measure(through_proxy, per_round, concurrency)
            proxy_lat += lat
            proxy_rps.append(rps)
        row = {
            "direct_p50_ms": 1e3 * percentile(direct_lat, 0.5),
            "direct_p99_ms": 1e3 * percentile(direct_lat, 0.99),
            "proxy_p50_ms": 1e3 * percentile(proxy_lat, 0.5),
            "proxy_p99_ms": 1e3 * percentile(proxy_lat, 0.99),
            "direct_rps": statistics.median(direct_rps),
            "proxy_rps": statistics.median(proxy_rps),
        }
        row["added_p50_ms"] = row["proxy_p50_ms"] - row["direct_p50_ms"]
        row["added_p99_ms"] = row["proxy_p99_ms"] - row["direct_p99_ms"]
        row["throughput_ratio"] = row["proxy_rps"] / row["direct_rps"]
        results[f"concurrency_{concurrency}"] = row
        print(
            f"concurrency {concurrency:>3}: added latency p50 {row['added_p50_ms']:.2f} ms, "
            f"p99 {row['added_p99_ms']:.2f} ms (direct p50 {row['direct_p50_ms']:.2f} ms, "
            f"proxy p50 {row['proxy_p50_ms']:.2f} ms); throughput proxy/direct "
            f"{row['throughput_ratio']:.2f} ({row['proxy_rps']:.0f} vs "
            f"{row['direct_rps']:.0f} req/s)"
        )
    print(json.dumps(results, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    run(parser.parse_args())


if __name__ == "__main__":
    main()
