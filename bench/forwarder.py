"""The transport's floor: a bare forwarder on lego-proxy's own stack, for ``bench.peers``.

It serves ``POST /v1/chat/completions`` the way ``lego-proxy serve`` is served (uvicorn on
uvloop with httptools, a raw ASGI app) and passes each turn to the engine's ``/generate``
through the proxy's own stream client (``proxy.stream_client``: one pooled keep-alive
connection per turn in flight), then answers with a fixed chat completion once the
engine's answer is read to its end. It does nothing else a proxy does: no parsing of the
request (the engine gets one fixed, pre-tokenized body: ``bench.overhead.generate_body``),
no ledger, no detokenizing or rendering, no record and no fsync. It asks for the chunks
lego-proxy asks for on a turn its harness does not stream (``stream_interval``: the
default of ``LEGO_UNSTREAMED_CHUNK_TOKENS``), so a long reply costs it as many reads.

So what it adds to the engine's direct latency, and its CPU per turn, is what any turn
through a Python proxy on this stack pays at least; ``bench.peers`` measures it in the
same rounds as the proxies, and the rest of a proxy's figures is its own work.

``--durable DIR`` adds the one thing lego-proxy's invariant asks of every turn: it is
durable before its answer's last byte. Each turn's request body and the engine's answer,
as received, are one row in a SQLite file in ``DIR`` (``DurableLog``: WAL, every commit
synced, the pragmas of lego-proxy's embedded database), committed on the event loop's
thread, as lego-proxy commits a lone turn, before the answer is sent. What that forwarder
adds is the floor of a durable turn through a Python proxy on this stack: lego-proxy's
latency target (1 ms beyond one fsync at c=1) has to fit its own work into what is left.

    python -m bench.forwarder --engine URL --model DIR --port PORT [--max-tokens N]
        [--durable DIR]
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

if not __package__:
    # Run as ``python bench/forwarder.py``: the repository, not this directory, must be on
    # sys.path for ``bench.overhead`` (a sibling) to import.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import orjson

from bench.overhead import REPLY_TOKENS, generate_body
from proxy.backend import CONNECT_TIMEOUT_S, KEEPALIVE_S, SETTLE_TIMEOUT_S
from proxy.settings import Settings
from proxy.stream_client import StreamClient
from recorder.database import sqlite_pragmas

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

ANSWER = orjson.dumps(
    {
        "id": "chatcmpl-forwarded",
        "object": "chat.completion",
        "created": 0,
        "model": "bench",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "OK."},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }
)
JSON_HEADERS = [(b"content-type", b"application/json")]
GENERATE_HEADERS = {"Content-Type": "application/json"}


class DurableLog:
    """Turns made durable the least a proxy can: the request and the answer as received,
    one row a turn, one synced commit each (``BEGIN IMMEDIATE``, the insert, ``COMMIT``),
    on the calling thread. The file is in WAL mode with every commit synced
    (``recorder.database.sqlite_pragmas``); SQLite checkpoints it by itself."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / "forwarded.sqlite"
        self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        sqlite_pragmas(self._conn.cursor())
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS turns "
            "(id INTEGER PRIMARY KEY, request BLOB NOT NULL, answer BLOB NOT NULL)"
        )

    def write(self, request: bytes, answer: bytes) -> None:
        """Return once the turn is on disk (its commit's fsync done)."""
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("INSERT INTO turns (request, answer) VALUES (?, ?)", (request, answer))
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def synchronous(self) -> int:
        """SQLite's ``synchronous`` level on the log's connection (2: every commit synced)."""
        return int(self._conn.execute("PRAGMA synchronous").fetchone()[0])

    def close(self) -> None:
        self._conn.close()


class Forwarder:
    """The ASGI app: each chat turn becomes one streamed ``/generate`` call, read whole;
    with a ``DurableLog``, the turn is written to it before it is answered."""

    def __init__(
        self, engine_url: str, generate: dict[str, object], durable: DurableLog | None = None
    ) -> None:
        self._url = f"{engine_url.rstrip('/')}/generate"
        self._body = orjson.dumps(generate)
        self._client = StreamClient(
            connect_timeout_s=CONNECT_TIMEOUT_S, keepalive_s=KEEPALIVE_S, settle_s=SETTLE_TIMEOUT_S
        )
        self._durable = durable

    @property
    def connections_opened(self) -> int:
        """Connections to the engine opened so far (one per turn in flight, then reused)."""
        return self._client.opened

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        request: list[bytes] = []
        more = True
        while more:  # the harness's request, read (and dropped unless it is logged)
            message = await receive()
            request.append(message.get("body", b""))
            more = message.get("more_body", False)
        if scope["path"] == "/health":
            await _answer(send, 200, b'{"ok":true}')
            return
        if scope["method"] != "POST" or scope["path"] != "/v1/chat/completions":
            await _answer(send, 404, b'{"error":"not found"}')
            return
        response = await self._client.post(self._url, self._body, GENERATE_HEADERS)
        answer: list[bytes] = []
        try:
            while chunk := await response.readany():
                answer.append(chunk)
            status = response.status
        finally:
            response.release()
        if status != 200:
            await _answer(send, 502, b'{"error":"the engine failed"}')
            return
        if self._durable is not None:
            self._durable.write(b"".join(request), b"".join(answer))
        await _answer(send, 200, ANSWER)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self._client.close()
                if self._durable is not None:
                    self._durable.close()
                await send({"type": "lifespan.shutdown.complete"})
                return


async def _answer(send: Send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": JSON_HEADERS})
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", required=True, help="the engine's URL")
    parser.add_argument("--model", type=Path, required=True, help="its tokenizer's directory")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-tokens", type=int, default=REPLY_TOKENS)
    parser.add_argument(
        "--durable",
        type=Path,
        help="make each turn durable before answering it: a SQLite file in this directory",
    )
    args = parser.parse_args()
    import uvicorn

    body = generate_body(args.model, args.max_tokens)
    sampling = body["sampling_params"]
    assert isinstance(sampling, dict)
    sampling["stream_interval"] = Settings.model_fields["unstreamed_chunk_tokens"].default
    app = Forwarder(args.engine, body, None if args.durable is None else DurableLog(args.durable))
    uvicorn.run(
        app, host="127.0.0.1", port=args.port, loop="uvloop", http="httptools", log_level="warning"
    )


if __name__ == "__main__":
    main()
