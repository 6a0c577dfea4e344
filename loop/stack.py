"""What the loop runs against: a proxy and a backend it starts, or ones it is pointed at.

``embedded_stack(data_dir, engine_args)`` is the embedded default: the local CPU engine
(``python -m engine``, the tiny model it builds on first use in ``data_dir``, routed experts
on, ``engine_args`` appended, e.g. ``--script policy.json``) and ``lego-proxy serve`` on a
SQLite file in ``data_dir`` pointed at it, each a child process on a free loopback port,
logs in ``data_dir/logs``, stopped when the block ends. ``Endpoints`` is what the rest of
the loop needs either way: the proxy and its admin key, the backend the trainer publishes
weights to, and the model the trainer starts from.
"""

from __future__ import annotations

import os
import secrets
import shlex
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kernel.paths import default_model_dir
from kernel.process import python_module, start_server
from kernel.threaded import free_port

# Harness prompts are large (system + tool schemas: 7-20 K tokens of the tiny vocabulary)
# and Claude Code asks for 32 K output tokens: the embedded proxy leaves room for both.
EMBEDDED_CONTEXT = 131072


@dataclass(frozen=True, slots=True)
class Endpoints:
    proxy_url: str
    admin_key: str
    backend_url: str | None  # None: an external trainer publishes the weights
    model_path: Path | None  # None: an external trainer holds the policy


@contextmanager
def embedded_stack(data_dir: Path, engine_args: str = "") -> Iterator[Endpoints]:
    data_dir.mkdir(parents=True, exist_ok=True)
    logs = data_dir / "logs"
    logs.mkdir(exist_ok=True)
    engine_port, proxy_port = free_port(), free_port()
    engine_url = f"http://127.0.0.1:{engine_port}"
    proxy_url = f"http://127.0.0.1:{proxy_port}"
    admin_key = secrets.token_urlsafe(24)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEGO_")}
    children: list[subprocess.Popen[bytes]] = []
    try:
        children.append(
            start_server(
                python_module(
                    "engine",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(engine_port),
                    "--data-dir",
                    str(data_dir),
                    "--enable-return-routed-experts",
                    *shlex.split(engine_args),
                ),
                env,
                f"{engine_url}/health",
                logs / "engine.log",
            )
        )
        model = default_model_dir(data_dir)
        proxy_env = {
            **env,
            "LEGO_DATA_DIR": str(data_dir),
            "LEGO_BACKEND_URL": engine_url,
            "LEGO_TOKENIZER_PATH": str(model),
            "LEGO_ADMIN_KEY": admin_key,
            "LEGO_PORT": str(proxy_port),
            "LEGO_HOST": "127.0.0.1",
            "LEGO_CONTEXT_LENGTH": str(EMBEDDED_CONTEXT),
        }
        children.append(
            start_server(
                python_module("cli.main", "serve", "--log-level", "warning"),
                proxy_env,
                f"{proxy_url}/healthz",
                logs / "proxy.log",
            )
        )
        yield Endpoints(proxy_url, admin_key, engine_url, model)
    finally:
        for child in reversed(children):
            child.terminate()
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
