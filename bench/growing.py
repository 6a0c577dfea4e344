"""One agent session growing turn by turn: what the proxy adds as its context grows.

A harness's session is not one short turn repeated: each turn carries the whole history
back, plus a tool result. This drives one session per round through ``--turns`` chat turns
(default 30), each adding the proxy's previous answer and a ~``--result-tokens`` (2,000)
token result, so the last turn's prompt is about 60k tokens, and reports per turn the
latency the client saw and the proxy process's CPU, for ``default`` (this checkout) and,
with ``--baseline DIR``, another checkout's proxy in the same interleaved rounds (the set-up
of ``bench.overhead``: a zero-compute engine, one ``lego-proxy serve`` each, SQLite and the
journal on). A proxy that re-rendered the whole conversation each turn would grow with the
context; the ledger tokenizes only the new messages, so a turn's cost should stay nearly
flat.

    python -m bench.growing [--turns 30] [--result-tokens 2000] [--rounds 3] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

if not __package__:
    # Run as ``python bench/growing.py``: the repository, not this directory, must be on
    # sys.path for ``bench.overhead`` (a sibling) to import.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from bench.overhead import BASELINE, Proxy, add_baseline_argument, cpu_seconds, stack

WORDS = "the quick brown fox jumps over lazy dogs while tests run and logs scroll by"
REPORTED = (1, 10, 20, 30)
WINDOW = 10  # turns per CPU figure
CONTEXT_LENGTH = 131_072  # the tiny model's


def tool_result(tokens: int, turn: int, count: Callable[[str], int]) -> str:
    """About ``tokens`` tokens of log-like text, different each turn."""
    lines: list[str] = []
    while True:
        lines.append(f"[{turn}:{len(lines)}] {WORDS}")
        text = "\n".join(lines)
        if count(text) >= tokens:
            return text


def one_session(
    proxy: Proxy, turns: int, results: list[str]
) -> tuple[list[float], list[float], int]:
    """Latency and proxy CPU seconds of each turn of a new session, and the last prompt's
    token count."""
    key = proxy.new_session()
    messages: list[dict[str, object]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing test."},
    ]
    latencies: list[float] = []
    cpu: list[float] = []
    prompt_tokens = 0
    with httpx.Client(timeout=120) as client:
        for turn in range(turns):
            began_cpu = cpu_seconds(proxy.process.pid)
            began = time.perf_counter()
            response = client.post(
                f"{proxy.url}/v1/chat/completions",
                json={"model": "bench", "messages": messages, "max_tokens": 16},
                headers={"authorization": f"Bearer {key}"},
            )
            latencies.append(time.perf_counter() - began)
            cpu.append(cpu_seconds(proxy.process.pid) - began_cpu)
            if response.status_code != 200:
                raise SystemExit(f"{proxy.name}, turn {turn + 1}: {response.text[:500]}")
            reply = response.json()
            prompt_tokens = int(reply["usage"]["prompt_tokens"])
            answer = reply["choices"][0]["message"]
            messages.append({"role": "assistant", "content": answer["content"] or ""})
            messages.append({"role": "user", "content": results[turn]})
    return latencies, cpu, prompt_tokens


def run(args: argparse.Namespace) -> None:
    from transformers import AutoTokenizer

    # Room for the whole session (older checkouts capped a prompt at 32k by default).
    os.environ.setdefault("LEGO_CONTEXT_LENGTH", str(CONTEXT_LENGTH))
    with stack("lego-growing-") as ready:
        tokenizer = AutoTokenizer.from_pretrained(str(ready.model))

        def count(text: str) -> int:
            return len(tokenizer.encode(text, add_special_tokens=False))

        results = [tool_result(args.result_tokens, turn, count) for turn in range(args.turns)]
        proxies = [ready.proxy("default")]
        if args.baseline is not None:
            proxies.insert(0, ready.proxy(BASELINE, args.baseline))
        per: dict[str, list[tuple[list[float], list[float], int]]] = {p.name: [] for p in proxies}
        for _ in range(args.rounds):  # interleaved: machine noise hits every proxy alike
            for proxy in proxies:
                per[proxy.name].append(one_session(proxy, args.turns, results))
        for name, sessions in per.items():
            print(f"{name} (last prompt {sessions[-1][2]} tokens):")
            for turn in [t for t in REPORTED if t <= args.turns]:
                latency = statistics.median(s[0][turn - 1] for s in sessions)
                print(f"  turn {turn:3d}: latency {1e3 * latency:7.2f} ms (median of rounds)")
            # /proc counts CPU in 10 ms ticks: per turn only over windows of turns.
            for first in range(0, args.turns, WINDOW):
                last = min(first + WINDOW, args.turns)
                spent = sum(sum(s[1][first:last]) for s in sessions)
                cpu = spent / (len(sessions) * (last - first))
                print(f"  turns {first + 1:3d}-{last:3d}: proxy CPU {1e3 * cpu:7.2f} ms per turn")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--result-tokens", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    add_baseline_argument(parser, "its proxy")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
