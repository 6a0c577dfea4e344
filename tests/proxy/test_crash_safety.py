"""Invariant 6 under a hard kill: a turn the harness received survives SIGKILL of the proxy.

The database is held locked so the write queue cannot persist the turn; the proxy is then
killed right after the harness got its answer. Only the write-ahead journal has the turn;
the next proxy started on the same data directory must replay it.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai

from kernel.threaded import free_port
from tests.proxy.conftest import ADMIN_KEY, DEFAULT_REPLY
from tests.support.tap import BackendTap


def start_proxy(env: dict[str, str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    with log.open("ab") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "serve", "--port", str(port)],
            env={**env, "LEGO_PORT": str(port)},
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()[-3000:]
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    process.kill()
    raise AssertionError(f"the proxy did not start: {log.read_text()[-3000:]}")


def test_a_completed_turn_survives_sigkill(
    tap: BackendTap, model_dir: Path, tmp_path: Path
) -> None:
    database = tmp_path / "lego.sqlite3"
    env = {key: value for key, value in os.environ.items() if not key.startswith("LEGO_")} | {
        "LEGO_DATA_DIR": str(tmp_path / "data"),
        "LEGO_DATABASE_URL": f"sqlite+aiosqlite:///{database}",
        "LEGO_BACKEND_URL": tap.url,
        "LEGO_TOKENIZER_PATH": str(model_dir),
        "LEGO_ADMIN_KEY": ADMIN_KEY,
    }
    log = tmp_path / "proxy.log"
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    process, url = start_proxy(env, log)
    try:
        run = httpx.post(f"{url}/api/v1/runs", json={"name": "crash"}, headers=admin).json()
        session = httpx.post(
            f"{url}/api/v1/runs/{run['id']}/sessions",
            json={"task_id": "t", "group_id": "g"},
            headers=admin,
        ).json()
        # Hold the database: the write queue's insert blocks behind this lock.
        lock = sqlite3.connect(database, isolation_level=None, timeout=30)
        lock.execute("BEGIN EXCLUSIVE")
        tap.reset()
        client = openai.OpenAI(base_url=f"{url}/s/{session['key']}/v1", api_key="x")
        reply = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
        assert reply.choices[0].message.content == DEFAULT_REPLY
        process.send_signal(signal.SIGKILL)  # the harness has its answer; the proxy dies
        process.wait(timeout=10)
        lock.execute("ROLLBACK")
        assert lock.execute("SELECT count(*) FROM turns").fetchone() == (0,)
        lock.close()
    finally:
        if process.poll() is None:
            process.kill()

    process, url = start_proxy(env, log)
    try:
        deadline = time.monotonic() + 30
        while True:
            trajectory = httpx.get(
                f"{url}/api/v1/sessions/{session['id']}/trajectory", headers=admin, timeout=30
            ).json()
            if trajectory["turn_count"] or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        (turn,) = trajectory["turns"]
        assert turn["status"] == "completed"
        (exchange,) = tap.generates
        (segment,) = trajectory["segments"]
        assert segment["tokens"] == exchange.body["input_ids"] + exchange.final["output_ids"]
    finally:
        process.terminate()
        process.wait(timeout=30)
