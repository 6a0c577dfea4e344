"""``lego-proxy serve`` refuses what cannot work before it starts anything, in one line.

Each error path runs the real console script in a fresh session and watches its process
tree while it lives: a check that ran too late would show as an engine child (the engine
takes seconds to come up, so a 20 ms poll cannot miss it). The exit status, the single
stderr line and what was left behind are asserted; how long each took is printed (timing
assertions have no place on a shared machine).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from kernel.paths import default_model_dir
from kernel.threaded import free_port
from proxy.settings import Settings
from recorder.disks import RecorderDisks
from recorder.migrate import upgrade_database
from recorder.store import Store
from tests.cli.conftest import children_of, clean_env, is_running


@dataclass(frozen=True)
class Exit:
    returncode: int
    stderr: str
    children_seen: int
    seconds: float

    @property
    def line(self) -> str:
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, self.stderr
        return lines[0]


def serve_until_exit(lego_proxy: str, env: dict[str, str], timeout_s: float = 90) -> Exit:
    began = time.monotonic()
    process = subprocess.Popen(
        [lego_proxy, "serve"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    seen: set[int] = set()
    try:
        while process.poll() is None:
            assert time.monotonic() - began < timeout_s, "serve did not exit"
            seen.update(children_of(process.pid))
            time.sleep(0.02)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        _, stderr = process.communicate()
    seconds = time.monotonic() - began
    print(f"serve exited {process.returncode} after {seconds:.2f} s: {stderr.strip()}")
    return Exit(process.returncode, stderr, len(seen), seconds)


def assert_refused(result: Exit, *phrases: str) -> None:
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert result.line.startswith("lego-proxy: ")
    for phrase in phrases:
        assert phrase in result.line
    assert result.children_seen == 0, "a child process was started before the check failed"


def test_a_database_that_is_down_is_reported_before_the_engine_or_the_model(
    lego_proxy: str, tmp_path: Path
) -> None:
    dead = f"postgresql+asyncpg://lego@127.0.0.1:{free_port()}/lego"
    result = serve_until_exit(
        lego_proxy, clean_env(LEGO_DATA_DIR=str(tmp_path), LEGO_DATABASE_URL=dead)
    )
    assert_refused(result, "database", "LEGO_DATABASE_URL")
    assert not default_model_dir(tmp_path).exists()  # not even the tiny model was built


def test_a_url_without_a_driver_names_the_one_to_use(lego_proxy: str, tmp_path: Path) -> None:
    env = clean_env(LEGO_DATA_DIR=str(tmp_path), LEGO_DATABASE_URL="postgresql://lego@db/lego")
    assert_refused(serve_until_exit(lego_proxy, env), "LEGO_DATABASE_URL", "postgresql+asyncpg")


def test_a_used_port_is_reported(lego_proxy: str, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = clean_env(LEGO_DATA_DIR=str(tmp_path), LEGO_PORT=str(port))
        assert_refused(serve_until_exit(lego_proxy, env), f"port {port}", "in use")


def test_a_data_dir_another_proxy_serves_from_is_reported(lego_proxy: str, tmp_path: Path) -> None:
    port = free_port()
    url = Settings(data_dir=tmp_path).effective_database_url
    asyncio.run(upgrade_database(url))
    # What a live proxy on this data dir, database and port holds: its spool, locked.
    held = RecorderDisks(tmp_path, asyncio.run(_identity(url))).spool(port)
    try:
        env = clean_env(LEGO_DATA_DIR=str(tmp_path), LEGO_PORT=str(port))
        assert_refused(serve_until_exit(lego_proxy, env), "another lego-proxy", "LEGO_DATA_DIR")
    finally:
        held.close()


async def _identity(url: str) -> str:
    store = await Store.open(url)
    try:
        return await store.identity()
    finally:
        await store.close()


def test_a_backend_url_without_a_tokenizer_says_which_setting_is_missing(
    lego_proxy: str, tmp_path: Path
) -> None:
    env = clean_env(LEGO_DATA_DIR=str(tmp_path), LEGO_BACKEND_URL="http://127.0.0.1:9")
    assert_refused(serve_until_exit(lego_proxy, env), "LEGO_TOKENIZER_PATH is required")


@pytest.mark.parametrize("kind", ["missing", "not-a-tokenizer"])
def test_a_tokenizer_path_that_cannot_render_is_reported(
    lego_proxy: str, tmp_path: Path, kind: str
) -> None:
    path = tmp_path / "model"
    if kind == "not-a-tokenizer":
        path.mkdir()
        (path / "config.json").write_text("{}")
    env = clean_env(LEGO_DATA_DIR=str(tmp_path), LEGO_TOKENIZER_PATH=str(path))
    assert_refused(serve_until_exit(lego_proxy, env), "LEGO_TOKENIZER_PATH", str(path))


def test_start_lines_say_where_things_are_and_where_the_admin_key_comes_from(
    lego_proxy: str, tmp_path: Path
) -> None:
    port = free_port()
    process = subprocess.Popen(
        [lego_proxy, "serve"],
        env=clean_env(LEGO_DATA_DIR=str(tmp_path), LEGO_PORT=str(port)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert process.stderr is not None
        lines = [process.stderr.readline().strip() for _ in range(6)]
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    text = "\n".join(lines)
    assert f"serving on http://127.0.0.1:{port}" in text
    assert "admin key: lego-dev-admin-key (the development default; set LEGO_ADMIN_KEY)" in text
    assert f"Live UI: http://127.0.0.1:{port}/ui" in text
    assert "the embedded local engine" in text


def test_the_engine_child_dies_with_a_killed_proxy(lego_proxy: str, tmp_path: Path) -> None:
    port = free_port()
    process = subprocess.Popen(
        [lego_proxy, "serve"],
        env=clean_env(LEGO_DATA_DIR=str(tmp_path), LEGO_PORT=str(port)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, "serve exited"
            assert time.monotonic() < deadline, "serve did not become healthy"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass  # not listening yet
            time.sleep(0.2)
        (engine,) = children_of(process.pid)
        process.kill()  # SIGKILL: no shutdown code runs in the proxy
        process.wait()
        deadline = time.monotonic() + 15
        while is_running(engine) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not is_running(engine), "the engine outlived its killed proxy"
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
