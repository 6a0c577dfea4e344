"""A proxy on loopback that serves only its control, export and UI routes.

``control_proxy(model_dir, data_dir, admin_key)`` starts the real app (SQLite in
``data_dir``) with a backend URL nobody listens on: tests of orchestrators (the rollout
runner, the loop, its trainers) drive sessions, finishes and claims through it, and no turn
is ever generated. Yields ``(url, database_url)``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kernel.threaded import free_port, serve
from proxy.app import create_app
from proxy.settings import Settings


@contextmanager
def control_proxy(model_dir: Path, data_dir: Path, admin_key: str) -> Iterator[tuple[str, str]]:
    port = free_port()
    settings = Settings(
        port=port,
        data_dir=data_dir,
        backend_url=f"http://127.0.0.1:{free_port()}",  # no turn is served here
        tokenizer_path=model_dir,
        admin_key=admin_key,
        context_length=4096,
    )
    with serve(create_app(settings), port=port) as url:
        yield url, settings.effective_database_url
