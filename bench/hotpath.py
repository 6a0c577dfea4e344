"""Where a proxied turn's CPU goes: py-spy on the proxy process under a closed-loop load.

The set-up is ``bench.overhead``'s (a zero-compute engine and one ``lego-proxy serve``
variant, each in its own process, the load from this one). While ``--concurrency``
clients send short chat turns for ``--seconds``, py-spy samples the proxy at ``--rate``
Hz without pausing it. Each busy sample is charged to the layer of its innermost frame that
belongs to one (``LAYERS``; a frame of the standard library or of a library no layer names
is charged to the caller that is; the loop's own frames and the stacks below them to
"event loop, sockets and stdlib"), so the table says which layer of the proxy to cut, and
the list of hottest functions (self time) says where in it. Needs py-spy (``pip install
py-spy``) and permission to trace the child (root, or ``kernel.yama.ptrace_scope`` 0);
without them it says so and exits 2. ``docs/performance.md`` says how to read the list
where SQLAlchemy's async engine runs (greenlets).

    python -m bench.hotpath [--concurrency 16] [--seconds 10] [--variant default] [--raw FILE]
        [--database sqlite|postgres] [--stream]
        [--reply-tokens N --token-ms MS [--incremental-streaming]]

``--reply-tokens``/``--token-ms`` (``bench.overhead``'s) profile long generations: what each
chunk of a decoding engine's stream costs; with ``--stream`` (``bench.overhead``'s too) the
harness streams them on, a frame per chunk.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import shutil
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

if not __package__:
    # Run as ``python bench/hotpath.py``: the repository, not this directory, must be on
    # sys.path for ``bench.overhead`` (a sibling) to import.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from bench.overhead import (
    MESSAGES,
    REPLY_TOKENS,
    VARIANTS,
    Proxy,
    add_engine_arguments,
    cpu_seconds,
    engine_arguments,
    stack,
)
from recorder.scratch_postgres import running_postgres

# (layer, substrings of a frame's file path), most specific first.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("journal (append, fsync)", ("/recorder/journal.py",)),
    ("recorder (queue, rows)", ("/recorder/",)),
    ("database driver", ("/sqlalchemy/", "/aiosqlite/", "/sqlite3/", "/asyncpg/")),
    ("metrics", ("/prometheus_client/",)),
    ("ledger", ("/proxy/ledger/",)),
    ("output parsing", ("/proxy/parsing/",)),
    ("adapters", ("/proxy/adapters/",)),
    (
        "backend client (httpx for control calls)",
        ("/proxy/backend", "/proxy/stream_client", "/httpx/", "/httpcore/"),
    ),
    ("tokenizer", ("/transformers/", "/tokenizers/")),
    ("pipeline and routes", ("/proxy/", "/kernel/")),
    ("inbound HTTP (uvicorn, Starlette, FastAPI)", ("/uvicorn/", "/starlette/", "/fastapi/")),
    ("validation (pydantic)", ("/pydantic/", "/pydantic_core/")),
)
GENERIC = "event loop, sockets and stdlib"
# Frames of the loop that dispatches callbacks: what lies below them (uvicorn's Server.run,
# the CLI) called the loop, not the work, so it is charged to nothing.
LOOP = ("/asyncio/runners.py", "/asyncio/base_events.py", "/asyncio/events.py", "/uvloop/")


def frames_of(line: str) -> tuple[list[str], int]:
    """A py-spy raw line (``root;...;leaf COUNT``) as its frames, leaf last, and its count."""
    stack, _, count = line.rstrip("\n").rpartition(" ")
    return stack.split(";"), int(count)


def layer_of(frames: list[str]) -> str:
    below = max((i for i, f in enumerate(frames) if any(m in f for m in LOOP)), default=-1)
    for frame in reversed(frames[below + 1 :]):
        for layer, markers in LAYERS:
            if any(marker in frame for marker in markers):
                return layer
    return GENERIC


def summarise(raw: str) -> tuple[collections.Counter[str], collections.Counter[str], int]:
    """Samples per layer, samples per leaf function (self time), and the total."""
    layers: collections.Counter[str] = collections.Counter()
    leaves: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.splitlines():
        if not line.strip():
            continue
        frames, count = frames_of(line)
        layers[layer_of(frames)] += count
        leaves[frames[-1]] += count
        total += count
    return layers, leaves, total


async def load(
    proxy: Proxy, keys: list[str], seconds: float, max_tokens: int, stream: bool = False
) -> int:
    """Closed-loop turns for ``seconds``, one client (connection, session) per key; with
    ``stream`` each turn is asked for as SSE and read to its end, as most harnesses do."""
    body: dict[str, object] = {"model": "bench", "messages": MESSAGES, "max_tokens": max_tokens}
    if stream:
        body["stream"] = True
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    done = 0
    stop = time.monotonic() + seconds

    async def client_loop(key: str) -> None:
        nonlocal done
        headers = {"authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(timeout=60, limits=limits) as client:
            while time.monotonic() < stop:
                url = f"{proxy.url}/v1/chat/completions"
                async with client.stream("POST", url, json=body, headers=headers) as response:
                    response.raise_for_status()
                    async for _ in response.aiter_raw():
                        pass
                done += 1

    await asyncio.gather(*(client_loop(key) for key in keys))
    return done


def run(args: argparse.Namespace) -> int:
    spy = shutil.which("py-spy")
    if spy is None:
        print("bench.hotpath needs py-spy: pip install py-spy", file=sys.stderr)
        return 2
    max_tokens = args.reply_tokens or REPLY_TOKENS
    with ExitStack() as databases, stack("lego-hotpath-", engine_arguments(args)) as ready:
        url = None  # a SQLite file of its own
        if args.database == "postgres":
            server = databases.enter_context(running_postgres())
            url = asyncio.run(server.create_database("lego_hotpath"))
        proxy = ready.proxy(args.variant, database_url=url)
        keys = [proxy.new_session() for _ in range(args.concurrency)]
        asyncio.run(load(proxy, keys, 2.0, max_tokens, args.stream))  # warm caches and connections
        raw = ready.root / "py-spy.txt"
        command = [spy, "record", "--pid", str(proxy.process.pid), "--rate", str(args.rate)]
        command += ["--duration", str(args.seconds), "--format", "raw", "--output", str(raw)]
        command += ["--nolineno", "--full-filenames"]
        # Native stacks need the process paused at each sample; Python-only ones do not.
        command += ["--native"] if args.native else ["--nonblocking"]
        command += ["--gil"] if args.gil else []
        record = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(0.5)  # py-spy attaches before the load starts
        cpu = cpu_seconds(proxy.process.pid)
        turns = asyncio.run(load(proxy, keys, args.seconds, max_tokens, args.stream))
        cpu = cpu_seconds(proxy.process.pid) - cpu
        _, errors = record.communicate(timeout=args.seconds + 60)
        if record.returncode != 0 or not raw.exists():
            print(f"py-spy failed: {errors.decode(errors='replace')[-1500:]}", file=sys.stderr)
            return 2
        text = raw.read_text()
        if args.raw is not None:
            Path(args.raw).write_text(text)
    layers, leaves, total = summarise(text)
    print(
        f"variant {args.variant}, c={args.concurrency}: {turns} turns in {args.seconds} s "
        f"({turns / args.seconds:.0f}/s), proxy CPU {1e3 * cpu / max(turns, 1):.2f} ms/turn "
        f"({100 * cpu / args.seconds:.0f}% of a core); {total} busy samples at {args.rate} Hz"
    )
    print(f"{'layer':<46} {'share':>6} {'ms/turn':>8}")
    for layer, count in layers.most_common():
        per_turn = 1e3 * count / args.rate / max(turns, 1)
        print(f"{layer:<46} {100 * count / total:>5.1f}% {per_turn:>8.3f}")
    print("hottest functions (self time):")
    for leaf, count in leaves.most_common(args.top):
        print(f"  {100 * count / total:>5.1f}%  {leaf}")
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rate", type=int, default=250, help="samples per second")
    parser.add_argument("--variant", choices=sorted(VARIANTS), default="default")
    parser.add_argument("--top", type=int, default=15, help="how many hottest functions")
    parser.add_argument(
        "--database",
        choices=["sqlite", "postgres"],
        default="sqlite",
        help="postgres: a database on a scratch cluster (LEGO_TEST_POSTGRES_URL or a throwaway)",
    )
    parser.add_argument("--raw", default=None, help="also keep py-spy's raw stacks here")
    parser.add_argument(
        "--stream",
        action="store_true",
        help="the harness streams its turns (SSE), as Claude Code, Codex and OpenCode do",
    )
    parser.add_argument(
        "--gil", action="store_true", help="only samples holding the GIL (Python's own work)"
    )
    parser.add_argument(
        "--native", action="store_true", help="C frames too (SQLite, uvloop, the tokenizer)"
    )
    add_engine_arguments(parser)
    raise SystemExit(run(parser.parse_args()))


if __name__ == "__main__":
    main()
