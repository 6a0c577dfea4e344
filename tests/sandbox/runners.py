"""A sandbox runner in its own process, for the tests that kill runners.

``start_runner(backend_code, runtime_dir, marker)`` starts a Python process that runs
``sleep <marker>`` in a sandbox made by ``backend_code`` (an expression over the names
``Path`` and ``runtime_dir``) and waits until that sleep is running inside it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.sandbox.processes import GONE_WITHIN_S, processes_with

ROOT = Path(__file__).resolve().parents[2]

RUNNER = """
import sys
from pathlib import Path
from sandbox.bwrap import Bwrap
from sandbox.docker import Docker
from sandbox.podman import Podman
from sandbox.spec import Network, ProxyRoute, SandboxSpec
runtime_dir = Path(sys.argv[1])
backend = {backend}
spec = SandboxSpec(label="doomed", cwd="/tmp", env={{"PATH": "/usr/bin:/bin"}},
                   network=Network.PROXY_ONLY, proxy=ProxyRoute("127.0.0.1", {port}, 8000))
backend.run(spec, ["sleep", sys.argv[2]])
"""


def start_runner(
    backend: str, runtime_dir: Path, marker: str, proxy_port: int
) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = RUNNER.format(backend=backend, port=proxy_port)
    runner = subprocess.Popen(
        [sys.executable, "-c", code, str(runtime_dir), marker],
        cwd=ROOT,
        env=env,
    )
    deadline = time.monotonic() + GONE_WITHIN_S
    while not processes_with(marker):
        assert runner.poll() is None, "the runner exited before its sandbox ran"
        assert time.monotonic() < deadline, "the sandbox never started"
        time.sleep(0.05)
    return runner
