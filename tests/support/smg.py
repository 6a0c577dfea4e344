"""The real smg router (PyPI ``smg``, pinned in pyproject) in front of workers on loopback.

``running_smg(worker_urls, log_dir)`` starts ``python -m smg.launch_router`` as deploy/ runs
it (``--policy consistent_hashing``, so ``X-SMG-Routing-Key`` pins a session to a worker),
bound to 127.0.0.1 (its metrics listener too), waits until it lists every worker as
healthy, yields its URL and stops it. smg registers a worker by probing the worker's own
``/health`` and ``/server_info``, so a worker stand-in must serve both.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

from kernel.process import python_module, start_server
from kernel.threaded import free_port


def listed_workers(router: str) -> list[dict[str, object]]:
    workers = httpx.get(f"{router}/workers", timeout=5).json()["workers"]
    assert isinstance(workers, list)
    return workers


@contextmanager
def running_smg(
    worker_urls: Sequence[str], log_dir: Path, *, timeout_s: float = 90.0
) -> Iterator[str]:
    port = free_port()
    router = f"http://127.0.0.1:{port}"
    cmd = python_module(
        "smg.launch_router",
        "--host", "127.0.0.1",
        "--port", str(port),
        "--worker-urls", *worker_urls,
        "--policy", "consistent_hashing",
        "--prometheus-host", "127.0.0.1",
        "--prometheus-port", str(free_port()),
        "--health-check-interval-secs", "1",
        "--log-level", "warn",
    )  # fmt: skip
    process = start_server(cmd, dict(os.environ), f"{router}/health", log_dir / f"smg-{port}.log")
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            healthy = [w for w in listed_workers(router) if w.get("is_healthy")]
            if len(healthy) == len(worker_urls):
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"smg registered {healthy} of {list(worker_urls)}")
            time.sleep(0.2)
        yield router
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
