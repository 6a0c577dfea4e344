"""lego-proxy next to other LLM proxies, measured in the same interleaved rounds.

Each system sits in front of a zero-compute backend in its own process and is driven by the
same closed-loop client (this process: one keep-alive connection, and for lego-proxy one
session, per concurrent client) with the same two-message chat turn:

- lego-proxy (``serve``, journal on) in front of the zero-compute SGLang-protocol engine
  (``bench.overhead``'s set-up), once per ``--database`` (default SQLite, its own file;
  ``postgres``: a database on a scratch cluster, ``LEGO_TEST_POSTGRES_URL`` or a
  throwaway); its baseline is that engine's ``/generate`` called directly;
- LiteLLM's proxy, when its ``litellm`` command is installed (``--litellm PATH``, else the
  one on ``PATH``), in front of a zero-compute OpenAI endpoint (a fixed chat completion,
  served by this module in its own process); its baseline is that endpoint called directly;
- a bare forwarder (``bench.forwarder``), always: lego-proxy's own stack (uvicorn on uvloop
  with httptools, its stream client to the same engine) passing each turn through with no
  parsing, ledger, rendering or record: the least any turn through a Python proxy here
  costs, so the rest of lego-proxy's figures is its own work. Its baseline is the
  engine's ``/generate`` called directly;
- a durable forwarder (``bench.forwarder --durable``), always: the bare forwarder that also
  commits each turn's request and answer to a SQLite file (WAL, every commit synced) before
  its answer's last byte, as lego-proxy's invariant asks: the least a durable turn through a
  Python proxy here costs. Its baseline is the engine's ``/generate`` called directly;
- slime's OpenAI agent adapter (``slime.agent.adapters.OpenAIAdapter``, THUDM/slime: not on
  PyPI), when ``--slime PATH`` names a checkout of it, in front of the same zero-compute
  engine as lego-proxy (it renders the chat template itself and sends ``input_ids`` to
  ``/generate``, unstreamed); ``bench.slime_runner`` serves it in its own process, run by
  ``--slime-python`` (an interpreter with ``aiohttp``, ``httpx``, ``torch`` and
  ``transformers``; default: this one). Its baseline is lego-proxy's: the engine's
  ``/generate`` called directly. Each client is one session (its bearer key is the adapter's
  session id).

Each concurrency's first line gives the fsync of the disk the SQLite files are on, each
after a pause of one direct turn (``bench.overhead.lone_turn_fsyncs``, as
``bench.overhead`` measures it): c=1's target is lego-proxy's added p50 under 1 ms beyond it.

Per system: the added p50 against its own baseline, throughput as a ratio of its baseline's,
the proxy process's CPU per request, what its calls cost its backend (the direct rows: their
own CPU), and what a request cost the whole machine (every core's busy time,
``bench.overhead.machine_cpu_seconds``: the proxy, its backend, a database server, the
kernel) with the load client's share of it. Where the cores are saturated (c=16 and up on
two cores), throughput follows the machine's figure, not the proxy's alone: a proxy that
asks its backend for more (lego-proxy streams each answer and asks for the routed experts;
slime's adapter takes one JSON body without them) spends cores outside its own process.

``--baseline DIR`` (a checkout of another commit, ``git worktree add DIR <commit>``) adds
that commit's lego-proxy, once per database, to the same rounds: a before and after next to
the peers. A peer that is not installed is skipped with the reason; the run goes on with
the rest.

``--reply-tokens N --token-ms MS [--incremental-streaming]`` (``bench.overhead``'s) shape the
engine's replies as a decoding model's: then lego-proxy reads a harness's unstreamed turn in
chunks (``LEGO_UNSTREAMED_CHUNK_TOKENS``) and slime's adapter in one body, and LiteLLM, whose
endpoint does not decode, is skipped.

``--python PATH`` runs lego-proxy, and the bare forwarder (the floor of its stack), on
another interpreter (``bench.overhead``'s); give slime's adapter the same build with
``--slime-python`` for a like-for-like comparison.

    python -m bench.peers [--requests 300] [--concurrency 1 16] [--litellm PATH]
        [--slime PATH [--slime-python PYTHON]] [--database sqlite postgres] [--baseline DIR]
        [--python PATH] [--reply-tokens N --token-ms MS [--incremental-streaming]]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

if not __package__:
    # Run as ``python bench/peers.py``: the repository, not this directory, must be on
    # sys.path for ``bench.overhead`` (a sibling) to import.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from bench.overhead import (
    MESSAGES,
    Call,
    Measured,
    Stack,
    add_baseline_argument,
    add_engine_arguments,
    add_python_argument,
    added_by_round,
    direct_call,
    engine_arguments,
    generate_body,
    interpreter,
    lone_turn_fsyncs,
    measure,
    ms_per_request,
    percentile,
    rotated,
    run_by,
    spread,
    stack,
)
from kernel.process import ServerDidNotStart, python_module, start_server
from kernel.threaded import free_port
from recorder.scratch_postgres import running_postgres

REPLY_TOKENS = 16
LITELLM_KEY = "sk-bench-" + "0123456789abcdef" * 2  # its proxy refuses to start without one


@dataclass(frozen=True)
class System:
    """A proxy and the baseline it adds to, each a call the load client makes."""

    name: str
    pid: int
    call: Call
    baseline: str  # which direct call it is compared with


def openai_endpoint_app() -> FastAPI:
    """The zero-compute OpenAI endpoint: a fixed chat completion for every request."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def complete(request: Request) -> JSONResponse:
        body = await request.json()
        return JSONResponse(
            {
                "id": "chatcmpl-bench",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", "bench"),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "ok " * REPLY_TOKENS},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {
                    "prompt_tokens": 40,
                    "completion_tokens": REPLY_TOKENS,
                    "total_tokens": 40 + REPLY_TOKENS,
                },
            }
        )

    @app.get("/health")
    async def health() -> dict[str, bool]:
        return {"ok": True}

    return app


def serve_openai_endpoint(port: int) -> None:
    import uvicorn

    uvicorn.run(openai_endpoint_app(), host="127.0.0.1", port=port, log_level="warning")


def litellm_command(args: argparse.Namespace) -> str | None:
    found: str | None = args.litellm or shutil.which("litellm")
    return found if found and Path(found).exists() else None


def run(args: argparse.Namespace) -> None:
    # The databases outlive the proxies (stopped first, by ``stack``).
    reply_tokens = args.reply_tokens or REPLY_TOKENS
    print(f"lego-proxy runs on {interpreter(args.python)}")
    with ExitStack() as databases, stack("lego-peers-", engine_arguments(args)) as ready:
        engine_call = direct_call(ready.engine_url, generate_body(ready.model, reply_tokens))
        direct: dict[str, tuple[int, Call]] = {"sglang engine": (ready.engine.pid, engine_call)}
        systems: list[System] = []
        for database in args.database:
            url = None  # a SQLite file of its own
            if database == "postgres":
                server = databases.enter_context(running_postgres())
                url = asyncio.run(server.create_database("lego_peers"))
            name = "lego-proxy" if len(args.database) == 1 else f"lego-proxy, {database}"
            checkouts: list[tuple[str, Path | None, str | None]] = [(name, None, url)]
            if args.baseline is not None:
                base_url = None
                if database == "postgres":
                    base_url = asyncio.run(server.create_database("lego_peers_baseline"))
                checkouts.append((f"{name} (baseline)", args.baseline, base_url))
            for label, checkout, database_url in checkouts:
                proxy = ready.proxy("default", checkout, database_url, args.python)
                keys = [proxy.new_session() for _ in range(max(args.concurrency))]
                lego = _chat(proxy.url, "bench", keys, reply_tokens)
                systems.append(System(label, proxy.process.pid, lego, "sglang engine"))
        for durable in (None, ready.root / "durable-forwarder"):
            floor = _start_forwarder(ready, reply_tokens, args.python, durable)
            if floor is not None:
                systems.append(floor)
        litellm = litellm_command(args)
        if args.reply_tokens is not None or args.token_ms:
            # Its zero-compute OpenAI endpoint answers at once, with a fixed short reply.
            print("LiteLLM: skipped (--reply-tokens/--token-ms shape the engine's replies only)")
        elif litellm is None:
            print("LiteLLM: skipped (no `litellm` command; pip install 'litellm[proxy]')")
        else:
            started = _start_litellm(ready, litellm, max(args.concurrency))
            if started is not None:
                endpoint, peer = started
                direct[peer.baseline] = endpoint
                systems.append(peer)
        if args.slime is None:
            print("slime: skipped (no --slime PATH: a THUDM/slime checkout; it is not on PyPI)")
        else:
            slime = _start_slime(
                ready, args.slime, args.slime_python, max(args.concurrency), reply_tokens
            )
            if slime is not None:
                systems.append(slime)
        asyncio.run(compare(args, direct, systems, ready.root))


def _start_litellm(
    ready: Stack, litellm: str, clients: int
) -> tuple[tuple[int, Call], System] | None:
    """The zero-compute OpenAI endpoint and LiteLLM's proxy in front of it, or None (said
    why) when LiteLLM does not start."""
    openai_port, litellm_port = free_port(), free_port()
    openai_url = f"http://127.0.0.1:{openai_port}"
    endpoint = start_server(
        python_module("bench.peers", "--serve-openai", str(openai_port)),
        ready.env,
        f"{openai_url}/health",
        ready.root / "openai.log",
    )
    ready.processes.append(endpoint)
    litellm_url = f"http://127.0.0.1:{litellm_port}"
    peer = _start_peer(
        ready,
        "LiteLLM",
        [
            *(litellm, "--model", "openai/bench", "--api_base", f"{openai_url}/v1"),
            *("--port", str(litellm_port), "--num_workers", "1"),
        ],
        {**ready.env, "OPENAI_API_KEY": "bench", "LITELLM_MASTER_KEY": LITELLM_KEY},
        f"{litellm_url}/health/liveliness",
    )
    if peer is None:
        return None
    call = _chat(litellm_url, "openai/bench", [LITELLM_KEY] * clients)
    return (endpoint.pid, _chat(openai_url, "bench", None)), System(
        "LiteLLM", peer.pid, call, "openai endpoint"
    )


def forwarder_command(
    engine_url: str,
    model: Path,
    port: int,
    reply_tokens: int,
    python: str | None,
    durable: Path | None = None,
) -> list[str]:
    """``bench.forwarder``'s command: on lego-proxy's interpreter (``--python``), since it is
    the floor of lego-proxy's own stack; with ``durable``, its turns are committed to a
    SQLite file in that directory before they are answered."""
    return run_by(
        python,
        python_module(
            "bench.forwarder",
            *("--engine", engine_url, "--model", str(model)),
            *("--port", str(port), "--max-tokens", str(reply_tokens)),
            *(() if durable is None else ("--durable", str(durable))),
        ),
    )


def _start_forwarder(
    ready: Stack, reply_tokens: int, python: str | None, durable: Path | None
) -> System | None:
    """``bench.forwarder`` (durable to a SQLite file in ``durable``, if given) in front of
    the zero-compute engine, or None (said why)."""
    name = "bare forwarder" if durable is None else "durable forwarder"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = _start_peer(
        ready,
        name,
        forwarder_command(ready.engine_url, ready.model, port, reply_tokens, python, durable),
        ready.env,
        f"{url}/health",
    )
    if process is None:
        return None
    return System(name, process.pid, _chat(url, "bench", None), "sglang engine")


def _start_slime(
    ready: Stack, checkout: Path, python: str, clients: int, reply_tokens: int
) -> System | None:
    """slime's OpenAI agent adapter in front of the zero-compute engine, or None (said why)
    when it is not there or does not start."""
    adapter = checkout / "slime" / "agent" / "adapters" / "openai.py"
    if not adapter.is_file():
        print(f"slime: skipped (no {adapter}: --slime is not a THUDM/slime checkout)")
        return None
    if shutil.which(python) is None:
        print(f"slime: skipped (no interpreter {python}: see --slime-python)")
        return None
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    runner = Path(__file__).with_name("slime_runner.py")
    process = _start_peer(
        ready,
        "slime",
        [
            *(python, str(runner), "--slime", str(checkout), "--model", str(ready.model)),
            *("--backend", ready.engine_url, "--port", str(port)),
        ],
        ready.env,
        f"{url}/healthz",
    )
    if process is None:
        return None
    keys = [f"bench-{slot}" for slot in range(clients)]  # one adapter session per client
    call = _chat(url, "bench", keys, reply_tokens)
    return System("slime adapter", process.pid, call, "sglang engine")


def _start_peer(
    ready: Stack, name: str, command: list[str], env: dict[str, str], health: str
) -> subprocess.Popen[bytes] | None:
    """A peer's server, stopped with the stack; None (said why) when it does not start."""
    try:
        process = start_server(
            command, env, health, ready.root / f"{name.lower().replace(' ', '-')}.log"
        )
    except ServerDidNotStart as exc:
        print(f"{name}: skipped (it did not start: {exc.message[-500:]})")
        return None
    ready.processes.append(process)
    return process


def _chat(url: str, model: str, keys: list[str] | None, max_tokens: int = REPLY_TOKENS) -> Call:
    body = {"model": model, "messages": MESSAGES, "max_tokens": max_tokens}

    async def call(client: httpx.AsyncClient, slot: int) -> None:
        key = keys[slot] if keys is not None else "bench"
        response = await client.post(
            f"{url}/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}
        )
        response.raise_for_status()

    return call


async def compare(
    args: argparse.Namespace,
    direct: dict[str, tuple[int, Call]],
    systems: list[System],
    disk: Path,
) -> None:
    """Every system and direct call at each concurrency, in interleaved rounds, and the
    fsync of ``disk`` (where the SQLite files are) after a pause of one direct turn."""
    for concurrency in args.concurrency:
        per_round = max(args.requests // args.rounds, concurrency)
        runs: dict[str, list[Measured]] = {
            name: [] for name in [*direct, *(s.name for s in systems)]
        }
        fsyncs: list[float] = []
        for round_ in range(args.rounds):  # interleaved: machine noise hits every system alike
            for name, (pid, call) in direct.items():
                runs[name].append(await measure(call, per_round, concurrency, pid))
            fsyncs += lone_turn_fsyncs(disk, runs[next(iter(direct))][-1])
            for system in rotated(systems, round_):
                backend_pid = direct[system.baseline][0]
                runs[system.name].append(
                    await measure(system.call, per_round, concurrency, system.pid, backend_pid)
                )
        client_gc_ms = 1e3 * max(m.client_gc_longest_s for ms in runs.values() for m in ms)
        print(
            f"concurrency {concurrency} (the load client's longest full collection "
            f"{client_gc_ms:.1f} ms; fsync p50 {1e3 * percentile(fsyncs, 0.5):.2f} ms after "
            "a direct turn's pause):"
        )
        requests = per_round * args.rounds
        for name in direct:
            lat = [x for m in runs[name] for x in m.latencies]
            rps = statistics.median(m.rps for m in runs[name])
            cpu = ms_per_request((m.cpu_s for m in runs[name]), requests)
            print(
                f"  {name:<16} direct p50 {1e3 * percentile(lat, 0.5):7.2f} ms, "
                f"{rps:6.0f} req/s, CPU {cpu:.2f} ms/req; {_machine(runs[name], requests)}"
            )
        for system in systems:
            lat = [x for m in runs[system.name] for x in m.latencies]
            base = [x for m in runs[system.baseline] for x in m.latencies]
            rps = statistics.median(m.rps for m in runs[system.name])
            base_rps = statistics.median(m.rps for m in runs[system.baseline])
            cpu = ms_per_request((m.cpu_s for m in runs[system.name]), requests)
            # Measured with its backend's pid, so never None here.
            backend = ms_per_request((m.backend_cpu_s or 0.0 for m in runs[system.name]), requests)
            added = 1e3 * (percentile(lat, 0.5) - percentile(base, 0.5))
            by_round = spread(added_by_round(runs[system.name], runs[system.baseline]))
            print(
                f"  {system.name:<16} added p50 {added:7.2f} ms ({by_round}), "
                "throughput / its own direct "
                f"{rps / base_rps:.2f} ({rps:.0f} req/s), proxy CPU {cpu:.2f} ms/req, "
                f"its backend's {backend:.2f}; "
                f"{_machine(runs[system.name], requests)}"
            )


def _machine(runs: list[Measured], requests: int) -> str:
    """What the requests cost the whole machine, and the load client's part of it."""
    machine = ms_per_request((m.machine_cpu_s for m in runs), requests)
    client = ms_per_request((m.client_cpu_s for m in runs), requests)
    return f"machine CPU {machine:.2f} ms/req (load client {client:.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--litellm", default=None, help="the litellm command (default: on PATH)")
    parser.add_argument("--slime", type=Path, default=None, help="a THUDM/slime checkout")
    parser.add_argument(
        "--slime-python",
        default=sys.executable,
        help="the interpreter that runs slime's adapter (default: this one)",
    )
    parser.add_argument(
        "--database",
        nargs="+",
        choices=["sqlite", "postgres"],
        default=["sqlite"],
        help="lego-proxy once per database given, in the same rounds",
    )
    add_baseline_argument(parser, "its lego-proxy, once per database,")
    add_engine_arguments(parser)
    add_python_argument(parser)
    parser.add_argument("--serve-openai", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_openai is not None:
        serve_openai_endpoint(args.serve_openai)
        return
    run(args)


if __name__ == "__main__":
    main()
