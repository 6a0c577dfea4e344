"""What ``lego-proxy serve`` checks before it starts anything: no engine child, no server.

Every check that can fail in seconds runs first, cheapest first, so a mistake costs one
line and a few seconds instead of a traceback after the local engine's start-up:

1. the port (``LEGO_HOST``/``LEGO_PORT``) is free to bind;
2. the database URL names a supported driver (``postgresql://`` is not one; the message
   names the ones that are);
3. the database answers within ``DATABASE_TIMEOUT_S`` and is brought to the current
   schema (before the tokenizer: building the tiny model takes seconds);
4. no other live proxy holds this proxy's spool for that database under ``LEGO_DATA_DIR``
   (a second ``serve`` on the same data dir and port);
5. the tokenizer that renders prompts loads and its chat template passes the ledger's
   self-check (``proxy.served_template``, which also reads off the tool-call format):
   ``LEGO_TOKENIZER_PATH``,
   or the tiny model the embedded engine serves (built here on first use, which needs
   torch); with ``LEGO_BACKEND_URL`` and no tokenizer path, the tiny model's tokenizer is
   used only in development and only when it exists.

Contract: ``preflight(settings)`` raises ``ConfigurationError`` with one line that says
what to change, or returns a ``Preflight`` holding the tokenizer directory and the lines
``serve`` prints at start (where things are, where the admin key comes from).
"""

from __future__ import annotations

import asyncio
import errno
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kernel.errors import ConfigurationError, LegoError
from kernel.paths import default_model_dir
from proxy.served_template import served_template
from proxy.settings import DEV_ADMIN_KEY, Settings
from recorder.database import display_url, parse_url
from recorder.disks import RecorderDisks
from recorder.migrate import upgrade_database
from recorder.store import Store

DATABASE_TIMEOUT_S = 15.0


@dataclass(frozen=True, slots=True)
class Preflight:
    tokenizer_path: Path
    lines: tuple[str, ...]  # what serve prints before it starts


def preflight(settings: Settings) -> Preflight:
    _check_port(settings)
    database = _check_database_url(settings)
    # Before the tokenizer: the first start builds the tiny model, which takes seconds.
    identity = asyncio.run(_upgrade(settings.effective_database_url, database))
    _check_spool(settings, identity)
    tokenizer = _tokenizer_path(settings)
    try:
        # Loads the tokenizer, runs the ledger's self-check on its chat template and reads
        # off the tool-call format (proxy.served_template).
        template = served_template(tokenizer, settings.tool_parser)
    except (LegoError, OSError, ValueError) as exc:
        raise ConfigurationError(
            f"cannot serve the tokenizer at {tokenizer} (LEGO_TOKENIZER_PATH): {_message(exc)}"
        ) from exc
    lines = _start_lines(settings, database, tokenizer)
    parsing = f"tool calls parsed as {template.tool_parser} ({template.tool_parser_source})"
    return Preflight(tokenizer, (*lines, parsing))


def _check_port(settings: Settings) -> None:
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # As uvicorn binds: a port held only by connections in TIME_WAIT is free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((settings.host, settings.port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ConfigurationError(
                    f"port {settings.port} on {settings.host} is in use: stop what listens "
                    "there or choose another (LEGO_PORT, serve --port)"
                ) from None
            raise ConfigurationError(
                f"cannot bind {settings.host}:{settings.port} (LEGO_HOST, LEGO_PORT): "
                f"{exc.strerror}"
            ) from None


def _check_database_url(settings: Settings) -> str:
    url = settings.effective_database_url
    try:
        parse_url(url)
    except LegoError as exc:
        raise ConfigurationError(f"LEGO_DATABASE_URL: {exc.message}") from None
    return display_url(url)


def _check_spool(settings: Settings, identity: str) -> None:
    disks = RecorderDisks(settings.data_dir, identity)
    try:
        disks.spool(settings.port).close()
    except LegoError:
        raise ConfigurationError(
            f"another lego-proxy on port {settings.port} is using LEGO_DATA_DIR="
            f"{settings.data_dir} for this database (its spool is locked): stop it, or give "
            "this one another LEGO_DATA_DIR or LEGO_PORT"
        ) from None
    except OSError as exc:
        raise ConfigurationError(
            f"LEGO_DATA_DIR={settings.data_dir} is not writable: {exc.strerror}"
        ) from None


def _tokenizer_path(settings: Settings) -> Path:
    if settings.tokenizer_path is not None:
        if not settings.tokenizer_path.is_dir():
            raise ConfigurationError(
                f"LEGO_TOKENIZER_PATH={settings.tokenizer_path} is not a directory: point it "
                "at the served model's HF directory (tokenizer files and chat template)"
            )
        return settings.tokenizer_path
    tiny = default_model_dir(settings.data_dir)
    if settings.backend_url is not None:
        if settings.env == "development" and (tiny / "tokenizer.json").exists():
            return tiny
        raise ConfigurationError(
            "LEGO_TOKENIZER_PATH is required with LEGO_BACKEND_URL: the directory of the "
            "model the backend serves (its tokenizer and chat template render the prompts)"
        )
    try:
        from transformers.utils import logging as hf_logging

        from engine.tiny import ensure_tiny_model
    except ImportError as exc:
        raise ConfigurationError(
            "the embedded engine needs torch (pip install torch, then 'lego-proxy[engine]'), "
            "or set LEGO_BACKEND_URL and LEGO_TOKENIZER_PATH to use an SGLang server"
        ) from exc
    # The first start builds the tiny model: its progress bars are not news.
    quiet: Callable[[], None] = hf_logging.disable_progress_bar
    quiet()
    return ensure_tiny_model(tiny)


async def _upgrade(url: str, shown: str) -> str:
    """Bring the database to the current schema; its identity (what spools are kept under)."""
    try:
        async with asyncio.timeout(DATABASE_TIMEOUT_S):
            await upgrade_database(url)
            store = await Store.open(url)
            try:
                return await store.identity()
            finally:
                await store.close()
    except TimeoutError:
        raise ConfigurationError(
            f"the database at {shown} did not answer within {DATABASE_TIMEOUT_S:.0f} s "
            "(LEGO_DATABASE_URL)"
        ) from None
    except LegoError as exc:
        raise ConfigurationError(f"{exc.message} (LEGO_DATABASE_URL={shown})") from None


def _start_lines(settings: Settings, database: str, tokenizer: Path) -> tuple[str, ...]:
    url = f"http://{settings.host}:{settings.port}"
    backend = settings.backend_url or "the embedded local engine (a child process)"
    if settings.admin_key is None:
        key = f"admin key: {DEV_ADMIN_KEY} (the development default; set LEGO_ADMIN_KEY)"
    else:
        key = "admin key: from LEGO_ADMIN_KEY"
    lines = [
        f"serving on {url}; harnesses are handed {settings.effective_public_url}",
        f"database: {database}",
        f"backend: {backend}",
        f"tokenizer and chat template: {tokenizer}",
        key,
        f"Live UI: {settings.effective_public_url}/ui (log in with the admin key)",
    ]
    if settings.wildcard_host and settings.public_url is None:
        lines.append(
            f"warning: harnesses are handed {settings.effective_public_url}, which they cannot "
            "reach: set LEGO_PUBLIC_URL"
        )
    return tuple(lines)


def _message(exc: BaseException) -> str:
    text = exc.message if isinstance(exc, LegoError) else str(exc)
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__
