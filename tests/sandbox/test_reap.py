"""No sandbox outlives its runner: a SIGKILLed runner's sandbox dies with it, and
``lego-proxy sandbox reap`` removes what it left while leaving a live runner's alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from http.server import ThreadingHTTPServer
from pathlib import Path

from sandbox import registry
from sandbox.reap import reap
from tests.sandbox.processes import processes_with, wait_until_gone
from tests.sandbox.runners import ROOT, start_runner

BWRAP = "Bwrap(runtime_dir=runtime_dir)"


def marker() -> str:
    return f"{uuid.uuid4().int % 10**6 + 10**6}.25"


def cli(runtime_dir: Path, action: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-m", "cli", "sandbox", action, "--runtime-dir", str(runtime_dir)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.splitlines()


def cli_reap(runtime_dir: Path) -> list[str]:
    return cli(runtime_dir, "reap")


def test_a_sigkilled_runner_leaves_no_process_and_reap_cleans_up(
    runtime_dir: Path, http_server: ThreadingHTTPServer
) -> None:
    port = http_server.server_address[1]
    doomed, survivor = marker(), marker()
    dead_runner = start_runner(BWRAP, runtime_dir, doomed, port)
    live_runner = start_runner(BWRAP, runtime_dir, survivor, port)
    try:
        dead_runner.send_signal(signal.SIGKILL)
        dead_runner.wait()
        wait_until_gone(doomed)

        by_runner = {r.runner.pid: r for _, r in registry.records(runtime_dir) if r is not None}
        dead = by_runner[dead_runner.pid]
        live = by_runner[live_runner.pid]
        assert dead.scratch.is_dir()  # left behind: nobody ran its cleanup
        assert dead.sandbox is not None
        assert live.sandbox is not None

        listed = cli(runtime_dir, "list")
        assert f"{dead.id}\tbwrap\tdoomed\tdead runner\t{dead.sandbox.pid}" in listed
        assert f"{live.id}\tbwrap\tdoomed\tlive\t{live.sandbox.pid}" in listed

        lines = cli_reap(runtime_dir)
        assert f"removed directory {dead.scratch}" in lines
        assert any(line.startswith(f"removed record {dead.id} ") for line in lines)
        assert lines[-1] == f"reaped {runtime_dir}: {len(lines) - 1} action(s)"
        assert not dead.scratch.exists()
        remaining = [r for _, r in registry.records(runtime_dir)]
        assert remaining == [live]
        assert live.scratch.is_dir()
        assert processes_with(survivor)  # the live runner's sandbox still runs

        assert cli_reap(runtime_dir) == [f"reaped {runtime_dir}: 0 action(s)"]
    finally:
        live_runner.send_signal(signal.SIGKILL)
        live_runner.wait()
    wait_until_gone(survivor)
    reap(runtime_dir, {})
    assert list(runtime_dir.iterdir()) == []


def test_an_orphan_directory_is_removed_and_a_bad_record_reported(runtime_dir: Path) -> None:
    runtime_dir.mkdir()
    orphan = runtime_dir / "trial-0123456789"
    orphan.mkdir()
    torn = runtime_dir / "torn.json"
    torn.write_text("{not json")
    assert reap(runtime_dir, {}) == [
        f"left unreadable record {torn}",
        f"removed orphan directory {orphan}",
    ]
    assert not orphan.exists()
