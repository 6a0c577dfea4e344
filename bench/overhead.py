"""Proxy overhead: the same turns sent straight to the engine and through the proxy.

The engine runs in zero-compute mode (fixed reply, no forward pass) so that what is
measured is the proxy: parsing, rendering, the backend round trip it adds, output parsing,
streaming and recording. Engine and each proxy variant run in their own process, as
deployed; the load generator is this process (the separate client a harness is, with
keep-alive connections). All paths are measured in the same run, interleaved in rounds, and
each variant is printed against the direct baseline: the added latency p50/p99, throughput
as a ratio of the direct path's, and each server process's CPU per request (from
``/proc``), next to the journal disk's fsync measured in the same rounds (the floor of a
turn that is durable before its last byte). The fsync is measured after a pause of one
direct turn, as a lone turn's commit comes: this disk's fsync is slower after a pause
(``fsync_seconds``). The back-to-back figure is printed next to it, and so is what one
round trip between two processes on loopback costs this machine (``round_trip_seconds``):
a proxied turn makes one more than a direct one, and on a virtual machine whose idle cores
are woken by the hypervisor it can cost several times what it does on bare metal.

Variants (``--variants``): ``default`` (what ``lego-proxy serve`` runs: uvloop + httptools
where installed), ``asyncio-h11`` (the stdlib loop and the pure-Python parser),
``no-journal`` (``LEGO_JOURNAL=false``: no fsync per turn), ``workers-2`` and ``workers-4``
(``serve --workers N``; its CPU is the parent's and the workers' together).
``--database postgres`` gives each proxy its own database on a scratch Postgres
(``recorder.scratch_postgres``: ``LEGO_TEST_POSTGRES_URL`` or a throwaway cluster) instead
of its own SQLite file. ``--baseline DIR`` adds ``baseline``: the default variant run
from another checkout (a ``git worktree add DIR <commit>``), so a change is measured
against its parent in the same rounds. ``--stream``: the harness asks for its answer as
SSE and reads it to the end (the direct path streams either way). Each concurrent client
is one harness: its own session and its own keep-alive connection.

The engine answers at once with a short fixed reply, in one chunk: the cost of a turn
around its generation. What a real generation adds (SGLang streams a chunk per decode
step) is measured with ``--reply-tokens N --token-ms MS``: an N-token reply whose tokens
come MS apart, a chunk each; ``--incremental-streaming`` makes those chunks deltas instead
of SGLang's default cumulative chunks (``--incremental-streaming-output``).

``--python PATH`` runs the proxies (the baseline's too) on another interpreter, one with
lego-proxy's dependencies installed: most of a turn's CPU is the interpreter's, and how the
interpreter was built moves it (``interpreter``). The engine and the load client stay on
this one. The first line printed names the proxies' interpreter.

    python -m bench.overhead [--requests 600] [--concurrency 1 16 64] [--variants default ...]
        [--baseline DIR] [--database sqlite|postgres] [--stream] [--python PATH]
        [--reply-tokens N --token-ms MS [--incremental-streaming]]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import httpx

from engine.tiny import ensure_tiny_model
from kernel.heap import long_lived_frozen
from kernel.paths import default_model_dir
from kernel.process import python_module, start_server
from kernel.threaded import free_port
from recorder.scratch_postgres import running_postgres

T = TypeVar("T")
ADMIN_KEY = "bench-admin-key"
MESSAGES = [
    {"role": "system", "content": "You are a coding agent. Use the shell tool when useful."},
    {"role": "user", "content": "List the files in the repository and summarise them."},
]
# name -> (extra `serve` arguments, extra environment)
VARIANTS: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {
    "default": ((), {}),
    "asyncio-h11": (("--loop", "asyncio", "--http", "h11"), {}),
    "no-journal": ((), {"LEGO_JOURNAL": "false"}),
    "workers-2": (("--workers", "2"), {}),
    "workers-4": (("--workers", "4"), {}),
    # Unstreamed harness turns read a chunk every N tokens, not every 64 (without --stream).
    "chunks-1": ((), {"LEGO_UNSTREAMED_CHUNK_TOKENS": "1"}),
    "chunks-16": ((), {"LEGO_UNSTREAMED_CHUNK_TOKENS": "16"}),
    "chunks-256": ((), {"LEGO_UNSTREAMED_CHUNK_TOKENS": "256"}),
}
BASELINE = "baseline"  # the default variant, from the checkout --baseline names
REPLY_TOKENS = 16  # max_new_tokens of every turn unless --reply-tokens says otherwise
FSYNC_SAMPLES = 50  # per round
ROUND_TRIP_SAMPLES = 200  # per round


@dataclass(frozen=True)
class Proxy:
    name: str
    url: str
    run_id: str
    process: subprocess.Popen[bytes]

    def new_session(self) -> str:
        """A new session's key (each concurrent client is one harness on one session)."""
        response = httpx.post(
            f"{self.url}/api/v1/runs/{self.run_id}/sessions",
            json={"task_id": "bench", "group_id": "g"},
            headers={"authorization": f"Bearer {ADMIN_KEY}"},
        )
        return str(response.raise_for_status().json()["key"])


@dataclass(frozen=True)
class Measured:
    latencies: list[float]
    rps: float
    cpu_s: float  # the server process's user + system CPU over the measured requests
    client_gc_longest_s: float  # this process's longest full collection meanwhile
    machine_cpu_s: float  # every core's busy time meanwhile: client, servers, database, kernel
    client_cpu_s: float  # this process's (the load client's) CPU meanwhile
    backend_cpu_s: float | None = None  # the backend's, when ``measure`` was given its pid


def rotated(items: Sequence[T], round_: int) -> list[T]:
    """``items`` in the order round ``round_`` measures them: each round starts with the
    next one, so none is always measured right after another (whose deferred work, its
    last commits' fsyncs or a WAL checkpoint, it would share the disk with). Use an even
    number of rounds for two proxies. Even so, the p99 at c=16 of the same code measured
    twice swung between 57 and 141 ms in one run: compare tails over several runs."""
    shift = round_ % len(items) if items else 0
    return [*items[shift:], *items[:shift]]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def added_by_round(runs: Sequence[Measured], direct: Sequence[Measured]) -> list[float]:
    """Each round's added p50 in ms: the round's p50 through the proxy less the same
    round's direct p50 (the two measured minutes apart at most). Their spread is how far
    the machine moved within one run; a change smaller than it needs more rounds or runs."""
    return [
        1e3 * (percentile(through.latencies, 0.5) - percentile(baseline.latencies, 0.5))
        for through, baseline in zip(runs, direct, strict=True)
    ]


def spread(values: Sequence[float]) -> str:
    """``values``' range, as printed next to a pooled figure ("by round 1.21 to 1.64")."""
    return f"by round {min(values):.2f} to {max(values):.2f}" if values else "no rounds"


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds so far of a process and its children (``serve --workers``:
    the workers), from Linux's ``/proc``."""

    def stat(path: Path) -> list[str]:
        return path.read_text().rsplit(")", 1)[1].split()

    total = 0
    for path in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat(path)
        except (OSError, IndexError):
            continue  # gone meanwhile
        if path.parent.name == str(pid) or fields[1] == str(pid):
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def machine_cpu_seconds() -> float:
    """Busy CPU seconds of the whole machine so far, all cores together (``/proc/stat``:
    user, nice, system, irq and softirq time; idle, I/O wait and time stolen by the
    hypervisor are not ours). On a machine whose cores a closed loop keeps busy, a
    system's throughput is the cores over what a request costs all of them: its proxy, the
    backend's work for what the proxy asks, the database server, the client reading its
    answers, and the kernel's work on their sockets."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def ms_per_request(seconds: Iterable[float], requests: int) -> float:
    """CPU seconds spent over ``requests`` requests, in ms a request."""
    return 1e3 * sum(seconds) / requests


def fsync_seconds(directory: Path, samples: int, pause_s: float = 0.0) -> list[float]:
    """One small append + fsync at a time on ``directory``'s disk, each after ``pause_s``
    of quiet: what a journaled turn waits for at least once.

    A disk's fsync may cost more the longer it was idle. On the development VM: 0.05 ms
    back to back, 0.7 ms after a 1 ms pause and 0.9 ms after 2 ms (``docs/performance.md``).
    A lone turn commits about one turn after the last commit, so its floor is the paced
    figure. Back to back is the floor of turns that share a group commit."""
    path = directory / "fsync-probe"
    timings = []
    with path.open("ab") as sink:
        for _ in range(samples):
            if pause_s > 0:
                time.sleep(pause_s)
            sink.write(b"x" * 512)
            sink.flush()
            began = time.perf_counter()
            os.fsync(sink.fileno())
            timings.append(time.perf_counter() - began)
    path.unlink()
    return timings


def lone_turn_fsyncs(directory: Path, direct: Measured) -> list[float]:
    """``FSYNC_SAMPLES`` fsyncs of ``directory``'s disk, each after a pause of ``direct``'s
    p50 turn: what a lone turn's commit waits for (c=1's floor, in both benchmarks)."""
    return fsync_seconds(directory, FSYNC_SAMPLES, percentile(direct.latencies, 0.5))


# A loopback echo server in its own process: it prints its port, serves one connection,
# and sends back every byte it gets until the connection closes.
_ECHO = """
import socket
server = socket.create_server(("127.0.0.1", 0))
print(server.getsockname()[1], flush=True)
peer, _ = server.accept()
peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while data := peer.recv(64):
    peer.sendall(data)
"""


@contextmanager
def echo_peer() -> Iterator[socket.socket]:
    """A TCP connection on loopback to an echo server in another process (closed, and the
    process gone, when the block ends)."""
    peer = subprocess.Popen(
        [sys.executable, "-c", _ECHO], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    try:
        assert peer.stdout is not None
        announced = peer.stdout.readline()
        if not announced.strip().isdigit():
            raise RuntimeError(f"the echo process did not start (it said {announced!r})")
        port = int(announced)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            yield connection
        peer.wait(timeout=10)  # its connection closed: it ends by itself
    finally:
        if peer.poll() is None:
            peer.kill()
            peer.wait()


def round_trip_seconds(connection: socket.socket, samples: int) -> list[float]:
    """``samples`` one-byte round trips to ``echo_peer``'s process, one at a time: a hop
    between two processes on this machine, which a proxy adds to every turn. On the
    development VM: 0.02-0.03 ms at the p50 between the benchmark's rounds, 0.09-0.12 ms on an
    idle machine (a sleeping vCPU woken each way) and 0.02 ms with both on one core
    (``docs/performance.md``)."""
    timings = []
    for _ in range(samples):
        began = time.perf_counter()
        connection.sendall(b"x")
        if not connection.recv(64):
            raise ConnectionError("the echo process closed the connection")
        timings.append(time.perf_counter() - began)
    return timings


Call = Callable[[httpx.AsyncClient, int], Awaitable[None]]


async def measure(
    call: Call, requests: int, concurrency: int, pid: int, backend_pid: int | None = None
) -> Measured:
    """``requests`` calls from ``concurrency`` clients, each with its own keep-alive
    connection and its own slot (a session, as each harness has its own). The CPU of
    ``pid`` (the server called) and of ``backend_pid`` (the one it calls, when given) over
    those calls, not the warm-up's.

    This process's heap is frozen while it measures (``kernel.heap.long_lived_frozen``, as
    the servers freeze theirs): with ``transformers`` imported, the load client's own full
    collections took up to 243 ms at c=64 and stopped every client at once, the p99 stall
    of about 230 ms these benchmarks used to show (``docs/performance.md``)."""
    latencies: list[float] = []
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    clients = [httpx.AsyncClient(timeout=60, limits=limits) for _ in range(concurrency)]
    try:
        await asyncio.gather(*(call(client, slot) for slot, client in enumerate(clients)))
        queue = iter(range(requests))

        async def worker(client: httpx.AsyncClient, slot: int) -> None:
            for _ in queue:
                began = time.perf_counter()
                await call(client, slot)
                latencies.append(time.perf_counter() - began)

        with long_lived_frozen() as collections:
            cpu = cpu_seconds(pid)
            backend = cpu_seconds(backend_pid) if backend_pid is not None else 0.0
            machine, client_cpu = machine_cpu_seconds(), time.process_time()
            began = time.perf_counter()
            await asyncio.gather(*(worker(client, slot) for slot, client in enumerate(clients)))
            elapsed = time.perf_counter() - began
            machine = machine_cpu_seconds() - machine
            client_cpu = time.process_time() - client_cpu
            cpu = cpu_seconds(pid) - cpu
            if backend_pid is not None:
                backend = cpu_seconds(backend_pid) - backend
    finally:
        await asyncio.gather(*(client.aclose() for client in clients))
    return Measured(
        latencies,
        requests / elapsed,
        cpu,
        collections.longest_s,
        machine,
        client_cpu,
        backend if backend_pid is not None else None,
    )


def start_proxy(
    name: str,
    root: Path,
    model: Path,
    engine_url: str,
    env: dict[str, str],
    checkout: Path | None = None,
    database_url: str | None = None,
    python: str | None = None,
) -> Proxy:
    """``name``'s proxy; from ``checkout`` (its ``cli.main``) when given, else from here;
    on ``database_url`` when given, else on a SQLite file of its own; run by ``python``
    when given, else by this interpreter."""
    args, extra_env = VARIANTS["default" if name == BASELINE else name]
    if database_url is not None:
        extra_env = {**extra_env, "LEGO_DATABASE_URL": database_url}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    data = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=root))  # its own SQLite file, journal
    proxy_env = {
        **env,
        **extra_env,
        "LEGO_DATA_DIR": str(data),
        "LEGO_BACKEND_URL": engine_url,
        "LEGO_TOKENIZER_PATH": str(model),
        "LEGO_ADMIN_KEY": ADMIN_KEY,
        "LEGO_PORT": str(port),
    }
    process = start_server(
        proxy_command(python, args),
        proxy_env,
        f"{url}/healthz",
        root / f"proxy-{data.name}.log",
        cwd=checkout,
    )
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    run_id = httpx.post(f"{url}/api/v1/runs", json={"name": "bench"}, headers=admin).json()["id"]
    return Proxy(name, url, run_id, process)


def run_by(python: str | None, command: list[str]) -> list[str]:
    """``command`` (this interpreter's, as ``python_module`` builds it) run by ``python``
    (an interpreter with lego-proxy's dependencies) when given."""
    return [python, *command[1:]] if python is not None else command


def proxy_command(python: str | None, args: Sequence[str]) -> list[str]:
    """``serve`` with ``args``, run by ``python`` when given, else by this interpreter."""
    return run_by(python, python_module("cli.main", "serve", "--log-level", "warning", *args))


def interpreter(python: str | None) -> str:
    """What runs the proxies, for the report: ``python``'s (else this interpreter's)
    implementation, version and executable. The development VM's CPython is built without
    profile-guided or link-time optimization; the deploy image's (the official
    ``python:3.11-slim-bookworm``) with both. On pure Python Debian's optimized 3.11 ran
    1.25x as fast as it, and the proxy took 5-12% less CPU a turn (``docs/performance.md``)."""
    probe = "import platform, sys; print(platform.python_implementation(), "
    probe += "platform.python_version(), 'at', sys.executable)"
    try:
        done = subprocess.run(
            [python or sys.executable, "-c", probe], capture_output=True, text=True, check=False
        )
    except OSError as exc:
        raise RuntimeError(f"{python or sys.executable} does not run: {exc}") from exc
    if done.returncode != 0:
        raise RuntimeError(f"{python or sys.executable} does not run: {done.stderr.strip()[-500:]}")
    return done.stdout.strip()


def start_engine(
    root: Path, model: Path, env: dict[str, str], engine_args: Sequence[str] = ()
) -> tuple[subprocess.Popen[bytes], str]:
    """The zero-compute engine in its own process (``engine_args`` added to its command
    line), and its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    engine = start_server(
        python_module(
            "engine",
            "--model",
            str(model),
            "--port",
            str(port),
            "--zero-compute",
            "--enable-return-routed-experts",
            *engine_args,
        ),
        env,
        f"{url}/health",
        root / "engine.log",
    )
    return engine, url


@dataclass
class Stack:
    """A data directory with the tiny model, the zero-compute engine, and every process
    started on it (stopped, newest first, when the ``stack`` block ends)."""

    root: Path
    model: Path
    env: dict[str, str]
    engine: subprocess.Popen[bytes]
    engine_url: str
    processes: list[subprocess.Popen[bytes]]

    def proxy(
        self,
        variant: str,
        checkout: Path | None = None,
        database_url: str | None = None,
        python: str | None = None,
    ) -> Proxy:
        proxy = start_proxy(
            variant,
            self.root,
            self.model,
            self.engine_url,
            self.env,
            checkout,
            database_url,
            python,
        )
        self.processes.append(proxy.process)
        return proxy


@contextmanager
def stack(prefix: str, engine_args: Sequence[str] = ()) -> Iterator[Stack]:
    root = Path(tempfile.mkdtemp(prefix=prefix))
    model = ensure_tiny_model(default_model_dir(root))
    env = {**os.environ, "LEGO_DATA_DIR": str(root)}
    engine, engine_url = start_engine(root, model, env, engine_args)
    processes = [engine]
    try:
        yield Stack(root, model, env, engine, engine_url, processes)
    finally:
        for process in reversed(processes):
            process.terminate()
            process.wait(timeout=30)


def generate_body(model: Path, max_new_tokens: int = REPLY_TOKENS) -> dict[str, object]:
    """The engine request the proxy sends for the bench's turn: the direct path's body."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model))
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    return {
        "input_ids": tokenizer.encode(prompt, add_special_tokens=False),
        "sampling_params": {
            "max_new_tokens": max_new_tokens,
            "skip_special_tokens": False,
            "no_stop_trim": True,
            "spaces_between_special_tokens": False,
        },
        "stream": True,
        "return_logprob": True,
        "return_routed_experts": True,
        "routed_experts_start_len": 0,
    }


def direct_call(engine_url: str, body: dict[str, object]) -> Call:
    """One turn straight to the engine, its stream read to the end."""

    async def call(client: httpx.AsyncClient, slot: int) -> None:
        async with client.stream("POST", f"{engine_url}/generate", json=body) as response:
            async for _ in response.aiter_lines():
                pass
            response.raise_for_status()

    return call


def run(args: argparse.Namespace) -> None:
    # The databases outlive the proxies (stopped first, by ``stack``).
    max_tokens = args.reply_tokens or REPLY_TOKENS
    print(f"lego-proxy runs on {interpreter(args.python)}")
    with ExitStack() as databases, stack("lego-bench-", engine_arguments(args)) as ready:
        names = ([BASELINE] if args.baseline is not None else []) + list(args.variants)
        urls: list[str | None] = [None] * len(names)  # None: a SQLite file of its own
        if args.database == "postgres":
            server = databases.enter_context(running_postgres())
            urls = [asyncio.run(server.create_database("lego_bench")) for _ in names]
        proxies = [
            ready.proxy(name, args.baseline if name == BASELINE else None, url, args.python)
            for name, url in zip(names, urls, strict=True)
        ]
        chat_body = {"model": "bench", "messages": MESSAGES, "max_tokens": max_tokens}
        if args.stream:
            chat_body["stream"] = True
        body = generate_body(ready.model, max_tokens)
        asyncio.run(
            compare(args, ready.engine, ready.engine_url, proxies, chat_body, body, ready.root)
        )


async def compare(
    args: argparse.Namespace,
    engine: subprocess.Popen[bytes],
    engine_url: str,
    proxies: list[Proxy],
    chat_body: dict[str, object],
    generate_body: dict[str, object],
    disk: Path,
) -> None:

    direct = direct_call(engine_url, generate_body)

    keys: dict[str, list[str]] = {}
    for proxy in proxies:
        keys[proxy.name] = [proxy.new_session() for _ in range(max(args.concurrency))]

    def through(proxy: Proxy) -> Call:
        async def call(client: httpx.AsyncClient, slot: int) -> None:
            url = f"{proxy.url}/v1/chat/completions"
            headers = {"authorization": f"Bearer {keys[proxy.name][slot]}"}
            if not args.stream:
                response = await client.post(url, json=chat_body, headers=headers)
                response.raise_for_status()
                return
            async with client.stream("POST", url, json=chat_body, headers=headers) as streamed:
                async for _ in streamed.aiter_lines():
                    pass
                streamed.raise_for_status()

        return call

    results: dict[str, object] = {}
    with echo_peer() as hop:
        for concurrency in args.concurrency:
            results[f"concurrency_{concurrency}"] = await compare_at(
                args, concurrency, engine, direct, proxies, through, disk, hop
            )
    print(json.dumps(results, indent=2))


async def compare_at(
    args: argparse.Namespace,
    concurrency: int,
    engine: subprocess.Popen[bytes],
    direct: Call,
    proxies: list[Proxy],
    through: Callable[[Proxy], Call],
    disk: Path,
    hop: socket.socket,
) -> dict[str, object]:
    """One concurrency's rounds: the direct path, the fsync and round-trip floors, and
    every proxy, interleaved; printed and returned as ``run``'s JSON row."""
    per_round = max(args.requests // args.rounds, concurrency)
    direct_runs: list[Measured] = []
    proxy_runs: dict[str, list[Measured]] = {proxy.name: [] for proxy in proxies}
    fsyncs: list[float] = []  # each after a pause of one direct turn (a lone turn's)
    back_to_back: list[float] = []  # the floor of turns that share a group commit
    round_trips: list[float] = []  # the hop a proxy adds to every turn
    for round_ in range(args.rounds):  # interleaved: machine noise hits every path alike
        direct_runs.append(await measure(direct, per_round, concurrency, engine.pid))
        fsyncs += lone_turn_fsyncs(disk, direct_runs[-1])
        back_to_back += fsync_seconds(disk, FSYNC_SAMPLES)
        round_trips += round_trip_seconds(hop, ROUND_TRIP_SAMPLES)
        for proxy in rotated(proxies, round_):
            proxy_runs[proxy.name].append(
                await measure(through(proxy), per_round, concurrency, proxy.process.pid)
            )
    direct_lat = [x for m in direct_runs for x in m.latencies]
    direct_rps = statistics.median(m.rps for m in direct_runs)
    fsync_p50_ms = 1e3 * percentile(fsyncs, 0.5)
    back_to_back_p50_ms = 1e3 * percentile(back_to_back, 0.5)
    round_trip_p50_ms = 1e3 * percentile(round_trips, 0.5)
    direct_p50 = 1e3 * percentile(direct_lat, 0.5)
    direct_p99 = 1e3 * percentile(direct_lat, 0.99)
    requests = per_round * args.rounds
    engine_cpu = ms_per_request((m.cpu_s for m in direct_runs), requests)
    measured = [*direct_runs, *(m for runs in proxy_runs.values() for m in runs)]
    client_gc_ms = 1e3 * max(m.client_gc_longest_s for m in measured)
    row: dict[str, object] = {
        "client_gc_longest_ms": client_gc_ms,
        "direct_p50_ms": direct_p50,
        "direct_p99_ms": direct_p99,
        "direct_rps": direct_rps,
        "engine_cpu_ms_per_request": engine_cpu,
        "direct_machine_cpu_ms_per_request": ms_per_request(
            (m.machine_cpu_s for m in direct_runs), requests
        ),
        "fsync_p50_ms": fsync_p50_ms,
        "fsync_back_to_back_p50_ms": back_to_back_p50_ms,
        "round_trip_p50_ms": round_trip_p50_ms,
    }
    print(
        f"concurrency {concurrency:>3}: direct p50 {direct_p50:.2f} ms, "
        f"{direct_rps:.0f} req/s, engine CPU {engine_cpu:.2f} ms/req; "
        f"fsync p50 {fsync_p50_ms:.2f} ms after a direct turn's pause "
        f"({back_to_back_p50_ms:.2f} back to back); a process round trip on loopback p50 "
        f"{round_trip_p50_ms:.3f} ms; the load client's longest full collection "
        f"{client_gc_ms:.1f} ms"
    )
    for name, runs in proxy_runs.items():
        lat = [x for m in runs for x in m.latencies]
        rps = statistics.median(m.rps for m in runs)
        added_p50 = 1e3 * percentile(lat, 0.5) - direct_p50
        added_p99 = 1e3 * percentile(lat, 0.99) - direct_p99
        cpu = ms_per_request((m.cpu_s for m in runs), requests)
        by_round = added_by_round(runs, direct_runs)
        row[name] = {
            "proxy_p50_ms": 1e3 * percentile(lat, 0.5),
            "proxy_p99_ms": 1e3 * percentile(lat, 0.99),
            "proxy_rps": rps,
            "throughput_ratio": rps / direct_rps,
            "proxy_cpu_ms_per_request": cpu,
            "machine_cpu_ms_per_request": ms_per_request((m.machine_cpu_s for m in runs), requests),
            "added_p50_ms": added_p50,
            "added_p99_ms": added_p99,
            "added_p50_beyond_fsync_ms": added_p50 - fsync_p50_ms,
            "added_p50_by_round_ms": by_round,
        }
        print(
            f"    {name:<12} added p50 {added_p50:.2f} ms "
            f"({added_p50 - fsync_p50_ms:.2f} beyond one fsync; {spread(by_round)}), "
            f"p99 {added_p99:.2f} ms; "
            f"throughput/direct {rps / direct_rps:.2f} ({rps:.0f} req/s); "
            f"proxy CPU {cpu:.2f} ms/req"
        )
    return row


def lego_checkout(value: str) -> Path:
    """``--baseline``'s value: a lego-proxy checkout (``git worktree add DIR <commit>``)."""
    path = Path(value)
    if not (path / "cli" / "main.py").is_file():
        raise argparse.ArgumentTypeError(f"no cli/main.py in {value} (a lego-proxy checkout?)")
    return path


def add_baseline_argument(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--baseline",
        type=lego_checkout,
        help=f"a checkout of another commit: {what} runs in the same rounds",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument(
        "--variants", nargs="+", choices=sorted(VARIANTS), default=["default", "asyncio-h11"]
    )
    parser.add_argument("--database", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument(
        "--stream",
        action="store_true",
        help="the harness streams its turns (SSE), as Claude Code, Codex and OpenCode do",
    )
    add_engine_arguments(parser)
    add_baseline_argument(parser, "its default variant")
    add_python_argument(parser)
    run(parser.parse_args())


def add_python_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--python",
        default=None,
        help="the interpreter that runs lego-proxy, with its dependencies installed (a "
        "virtual environment on the interpreter you deploy; default: this one)",
    )


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """The zero-compute engine's reply: its length, its pace, its chunks' kind."""
    parser.add_argument(
        "--reply-tokens",
        type=int,
        default=None,
        help="the engine's reply, in tokens (default: its short fixed reply, 'OK.')",
    )
    parser.add_argument(
        "--token-ms",
        type=float,
        default=0.0,
        help="the engine streams a chunk a token, this many ms apart, as decoding does "
        "(default 0: the whole reply in one chunk; use 1 or more: its timers tick in ms)",
    )
    parser.add_argument(
        "--incremental-streaming",
        action="store_true",
        help="the engine streams deltas (SGLang's --incremental-streaming-output), not the "
        "cumulative chunks of its default",
    )


def engine_arguments(args: argparse.Namespace) -> list[str]:
    """``add_engine_arguments``' values as the engine's command-line flags."""
    flags: list[str] = []
    if args.reply_tokens is not None:
        flags += ["--zero-compute-reply-tokens", str(args.reply_tokens)]
    if args.token_ms:
        flags += ["--zero-compute-token-ms", str(args.token_ms)]
    if args.incremental_streaming:
        flags.append("--incremental-streaming-output")
    return flags


if __name__ == "__main__":
    main()
