"""``lego-proxy serve --workers N``: one port, N worker processes, each session on one.

Run as operators run it (the console script, a real engine on loopback, a real Postgres):
every turn of a session reaches the worker its key hashes to, whether the key is in the
``/s/<key>/`` path (a fresh connection per turn) or a bearer token on a kept-alive
connection; sessions spread over the workers; the tool loop stays one token-exact
training sequence; a killed worker is started again and its sessions go on; SIGTERM stops
the parent and every worker. The routing rules themselves are checked on request heads,
and ``serve``'s choice of event loop and HTTP parser (``--loop``, ``--http``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli import main as cli_main
from cli.workers import WORKER_HEADER, session_key_of, worker_for
from engine.config import EngineConfig
from engine.loopback import running_engine
from kernel.threaded import free_port
from recorder.scratch_postgres import PostgresServer
from tests.cli.conftest import children_of, clean_env, is_running
from tests.proxy.test_replicas import (
    ADMIN_KEY,
    LOOP_SCRIPT,
    STEPS,
    new_session,
    tool_loop,
    trajectory,
)

WORKERS = 2


@pytest.fixture(scope="module")
def loop_engine(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    script = tmp_path_factory.mktemp("loop") / "policy.json"
    script.write_text(json.dumps(LOOP_SCRIPT))
    config = EngineConfig(
        model_path=tiny_model_dir, script_path=script, enable_return_routed_experts=True
    )
    with running_engine(config) as url:
        yield url


@pytest.fixture(scope="module")
async def workers_database(postgres_server: PostgresServer) -> AsyncIterator[str]:
    url = await postgres_server.create_database("lego_workers")
    yield url
    await postgres_server.drop_database(url)


@dataclass
class Served:
    process: subprocess.Popen[bytes]
    url: str
    log: Path


@pytest.fixture
def served(
    lego_proxy: str,
    loop_engine: str,
    workers_database: str,
    tiny_model_dir: Path,
    tmp_path: Path,
) -> Iterator[Served]:
    port = free_port()
    env = clean_env(
        LEGO_DATA_DIR=str(tmp_path / "data"),
        LEGO_PORT=str(port),
        LEGO_BACKEND_URL=loop_engine,
        LEGO_DATABASE_URL=workers_database,
        LEGO_TOKENIZER_PATH=str(tiny_model_dir),
        LEGO_ADMIN_KEY=ADMIN_KEY,
    )
    log = tmp_path / "serve.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [lego_proxy, "serve", "--workers", str(WORKERS), "--log-level", "warning"],
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 240
    while True:
        assert process.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "serve --workers did not become healthy"
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    try:
        yield Served(process, url, log)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def sessions_on_every_worker(url: str) -> dict[int, tuple[str, str]]:
    """A new session (id, key) for each worker index."""
    found: dict[int, tuple[str, str]] = {}
    for _ in range(64):
        session_id, key = new_session(url)
        found.setdefault(worker_for(key, WORKERS), (session_id, key))
        if len(found) == WORKERS:
            return found
    raise AssertionError(f"64 sessions all hashed to workers {sorted(found)}")


def chat(client: httpx.Client, url: str, key: str, messages: list[dict[str, Any]]) -> str:
    response = client.post(
        f"{url}/v1/chat/completions",
        json={"model": "any", "messages": messages, "max_tokens": 16},
        headers={"authorization": f"Bearer {key}"},
    )
    response.raise_for_status()
    return response.headers[WORKER_HEADER]


def wait_for_turns(url: str, session_id: str, count: int) -> dict[str, Any]:
    deadline = time.monotonic() + 15  # each worker writes its turns off the hot path
    while True:
        data = trajectory(url, session_id)
        if len(data["turns"]) >= count or time.monotonic() > deadline:
            return data
        time.sleep(0.1)


def test_each_session_stays_on_the_worker_its_key_names(served: Served) -> None:
    by_worker = sessions_on_every_worker(served.url)
    for index, (session_id, key) in by_worker.items():
        # A bearer key over one kept-alive connection: every turn on the key's worker.
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Say something."}]
        with httpx.Client(timeout=60) as client:
            seen = {chat(client, served.url, key, messages) for _ in range(3)}
        assert seen == {str(index)}
        # The same key in the path, no header, a fresh connection: the same worker.
        body = {"model": "any", "messages": messages, "max_tokens": 16}
        response = httpx.post(f"{served.url}/s/{key}/v1/chat/completions", json=body, timeout=60)
        assert response.raise_for_status().headers[WORKER_HEADER] == str(index)
        # A /s/<key>/ path on a fresh connection per turn: the same worker, and the tool loop
        # is one token-exact sequence (no turn needed the ledger rebuilt elsewhere).
        loop_id, loop_key = new_session(served.url)
        tool_loop(loop_key, lambda turn: served.url)
        data = wait_for_turns(served.url, loop_id, STEPS + 1)
        assert [t["classification"] for t in data["turns"]] == ["root"] + ["extend"] * STEPS
        assert len(data["segments"]) == 1
        assert data["events"] == []
        # The bearer session's four turns (three by header, one by path) are all recorded.
        bearer_turns = wait_for_turns(served.url, session_id, 4)["turns"]
        assert [t["status"] for t in bearer_turns] == ["completed"] * 4


def test_a_killed_worker_is_started_again_and_its_session_goes_on(served: Served) -> None:
    by_worker = sessions_on_every_worker(served.url)
    session_id, key = by_worker[0]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Say something."}]
    with httpx.Client(timeout=60) as client:
        assert chat(client, served.url, key, messages) == "0"
    workers = children_of(served.process.pid)
    assert len(workers) == WORKERS, workers
    victim = next(pid for pid in workers if _worker_index(pid) == 0)
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 120
    served_by: list[str] = []
    resets = 0
    while "0" not in served_by:  # turns go on meanwhile (another worker takes them)
        assert time.monotonic() < deadline, served.log.read_text()[-3000:]
        try:
            with httpx.Client(timeout=60) as client:
                served_by.append(chat(client, served.url, key, messages))
        except httpx.TransportError:
            # A connection handed on in the instant the worker died dies with it, as a
            # request in flight there does; the harness retries.
            resets += 1
        time.sleep(0.2)
    assert resets <= 1
    assert "1" in served_by  # while worker 0 was down, worker 1 took its session
    assert victim not in children_of(served.process.pid)
    assert len(children_of(served.process.pid)) == WORKERS
    assert "worker 0 exited" in served.log.read_text()
    turns = wait_for_turns(served.url, session_id, 2)["turns"]
    assert all(t["status"] == "completed" for t in turns)


def test_sigterm_stops_the_parent_and_every_worker(served: Served) -> None:
    workers = children_of(served.process.pid)
    assert len(workers) == WORKERS
    served.process.send_signal(signal.SIGTERM)
    assert served.process.wait(timeout=90) == 0
    assert not any(is_running(pid) for pid in workers)


def test_workers_need_a_backend_url(lego_proxy: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [lego_proxy, "serve", "--workers", "2"],
        env=clean_env(LEGO_DATA_DIR=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert "--workers needs LEGO_BACKEND_URL" in line
    assert not (tmp_path / "lego.sqlite3").exists()  # refused before touching anything


def _worker_index(pid: int) -> int:
    argv = (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")
    channel = argv[argv.index(b"--worker-channel") + 1].decode()
    return int(channel.partition(":")[2])


@pytest.mark.parametrize(
    ("head", "key"),
    [
        (b"POST /s/abc/v1/chat/completions HTTP/1.1\r\nAuthorization: Bearer zzz\r\n\r\n", "abc"),
        (b"POST /s/abc?x=1 HTTP/1.1\r\n\r\n", "abc"),
        (b"POST /v1/messages HTTP/1.1\r\nHost: h\r\nauthorization: bearer  k1 \r\n\r\n", "k1"),
        (b"POST /v1/messages HTTP/1.1\r\nX-Api-Key: k2\r\n\r\n", "k2"),
        (b"POST /v1/messages HTTP/1.1\r\nAuthorization: Basic dTpw\r\nx-api-key: k3\r\n\r\n", "k3"),
        (b"GET /healthz HTTP/1.1\r\nHost: h\r\n\r\n", None),
        (b"GET /s//v1/models HTTP/1.1\r\n\r\n", None),
        (b"", None),
    ],
)
def test_the_session_key_is_read_as_the_routes_read_it(head: bytes, key: str | None) -> None:
    assert session_key_of(head) == key


def test_worker_for_is_stable_and_spreads() -> None:
    keys = [f"lego-sk-{n}" for n in range(400)]
    first = [worker_for(key, 4) for key in keys]
    assert first == [worker_for(key, 4) for key in keys]
    counts = [first.count(index) for index in range(4)]
    assert min(counts) > 60, counts  # 100 each on average


@pytest.mark.parametrize(
    ("asked", "installed", "chosen"),
    [
        (("auto", "auto"), True, ("uvloop", "httptools")),
        (("auto", "auto"), False, ("asyncio", "h11")),
        (("asyncio", "h11"), True, ("asyncio", "h11")),
        (("uvloop", "h11"), True, ("uvloop", "h11")),
    ],
)
def test_serve_takes_uvloop_and_httptools_where_installed(
    monkeypatch: pytest.MonkeyPatch,
    asked: tuple[str, str],
    installed: bool,
    chosen: tuple[str, str],
) -> None:
    monkeypatch.setattr(cli_main, "_installed", lambda module: installed)
    assert cli_main._server_implementation(*asked) == chosen


def test_asking_for_a_missing_loop_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli_main, "_installed", lambda module: False)
    with pytest.raises(SystemExit) as exited:
        cli_main._server_implementation("uvloop", "httptools")
    assert exited.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "uvloop and httptools not installed" in line
    assert "--loop asyncio --http h11" in line
