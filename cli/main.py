"""The ``lego-proxy`` command line: parse the command, start what it names.

    lego-proxy serve [--host H] [--port P]     the proxy (settings from LEGO_* env)
    lego-proxy serve --workers N               N proxy processes on one port (cli.workers)
    lego-proxy engine [--model DIR] [--port P] the SGLang-compatible local engine alone
    lego-proxy db upgrade                      bring the database to the current schema
    lego-proxy train ...                       trainer_bridge (lego-proxy train --help)
    lego-proxy demo [--keep]                   a guided scripted rollout on the embedded default
    lego-proxy loop ...                        the closed loop (lego-proxy loop --help)

Every failure the operator can fix is one line on stderr and a non-zero exit: invalid
settings exit 2, a start-up check that fails (``cli.preflight``: the port, the database,
the data directory, the tokenizer) exits 1 before anything is started.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import sys
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from kernel.errors import LegoError
from proxy.settings import Settings

if TYPE_CHECKING:
    import uvicorn
    from starlette.types import ASGIApp

DESCRIPTION = (
    "lego-proxy: unmodified coding-agent harnesses as token-faithful RL environments. "
    "Settings come from LEGO_* environment variables (lego-proxy serve --help lists them)."
)


def _load_settings(**overrides: Any) -> Settings:
    """The validated settings, or exit 2 with one readable line (a bad value is the
    operator's to fix; a traceback would bury it)."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        problems = []
        for error in exc.errors(include_url=False):
            message = str(error["msg"]).removeprefix("Value error, ")
            field = ".".join(str(part) for part in error["loc"])
            problems.append(f"LEGO_{field.upper()}: {message}" if field else message)
        print(f"lego-proxy: invalid settings: {'; '.join(problems)}", file=sys.stderr)
        raise SystemExit(2) from None


def _serve(args: argparse.Namespace) -> None:
    import uvicorn

    from cli.preflight import preflight
    from proxy.app import create_app

    overrides: dict[str, Any] = {}
    if args.host is not None:
        overrides["host"] = args.host
    if args.port is not None:
        overrides["port"] = args.port
    settings = _load_settings(**overrides)
    loop, http = _server_implementation(args.loop, args.http)
    if args.worker_channel is not None:
        _serve_as_worker(args, settings, loop, http)
        return
    if args.workers < 1:
        print("lego-proxy: --workers must be at least 1", file=sys.stderr)
        raise SystemExit(2)
    if args.workers > 1 and settings.backend_url is None:
        print(
            "lego-proxy: --workers needs LEGO_BACKEND_URL (each worker would start its own "
            "local engine): start one with `lego-proxy engine` and point LEGO_BACKEND_URL at it",
            file=sys.stderr,
        )
        raise SystemExit(2)
    checked = preflight(settings)
    if settings.tokenizer_path is None and settings.backend_url is not None:
        settings = settings.model_copy(update={"tokenizer_path": checked.tokenizer_path})
    for line in (*checked.lines, f"serving HTTP with {http} on the {loop} event loop"):
        print(f"lego-proxy: {line}", file=sys.stderr, flush=True)
    if args.workers > 1:
        from cli.workers import run_front

        command = [sys.executable, "-m", "cli.main", "serve", "--log-level", args.log_level]
        command += ["--loop", loop, "--http", http]
        env = {**os.environ, "LEGO_TOKENIZER_PATH": str(settings.tokenizer_path)}
        env |= {"LEGO_HOST": settings.host, "LEGO_PORT": str(settings.port)}
        run_front(settings.host, settings.port, command, args.workers, env)
        return
    uvicorn.Server(_server_config(args, settings, create_app(settings), loop, http)).run()


def _server_config(
    args: argparse.Namespace, settings: Settings, app: ASGIApp, loop: str, http: str
) -> uvicorn.Config:
    import uvicorn

    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=args.log_level,
        loop=loop,
        http=http,
        timeout_graceful_shutdown=30,
        # Harnesses keep their connection across tool calls that take seconds to minutes;
        # closing idle ones after uvicorn's default 5 s races their next request (a client
        # sees the close as a read error on a request it had already sent).
        timeout_keep_alive=75,
    )


def _serve_as_worker(args: argparse.Namespace, settings: Settings, loop: str, http: str) -> None:
    """One worker of ``serve --workers``: the parent checked everything and holds the port."""
    from cli.workers import run_worker
    from proxy.app import create_app

    channel, _, index = str(args.worker_channel).partition(":")
    app = create_app(settings, instance=f"{settings.port}.w{index}")
    run_worker(_server_config(args, settings, app, loop, http), int(channel), int(index))


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _server_implementation(loop: str, http: str) -> tuple[str, str]:
    """The event loop and HTTP parser to serve with: ``auto`` takes uvloop and httptools
    where installed (they are dependencies on Linux; bench.overhead measures the gain), else
    asyncio and h11. One named explicitly but not installed exits 2 with one line."""
    chosen = (
        loop if loop != "auto" else "uvloop" if _installed("uvloop") else "asyncio",
        http if http != "auto" else "httptools" if _installed("httptools") else "h11",
    )
    missing = [name for name in chosen if name in ("uvloop", "httptools") and not _installed(name)]
    if missing:
        print(
            f"lego-proxy: {' and '.join(missing)} not installed (pip install {' '.join(missing)}"
            ", or serve with --loop asyncio --http h11)",
            file=sys.stderr,
        )
        raise SystemExit(2)
    return chosen


def _engine(args: argparse.Namespace) -> None:
    from engine.cli import run_engine

    run_engine(args)


def _db_upgrade(args: argparse.Namespace) -> None:
    from recorder.database import display_url
    from recorder.migrate import upgrade_database

    settings = _load_settings()
    url = settings.effective_database_url
    asyncio.run(upgrade_database(url))
    print(f"database at {display_url(url)} is at the current schema")


def _demo(args: argparse.Namespace) -> None:
    from cli.demo import run_demo

    run_demo(keep=args.keep)


def settings_help() -> str:
    """The LEGO_* settings, their defaults and what they do (``serve --help``)."""
    lines = ["settings (environment variables; the README's table says the same):"]
    for name, field in Settings.model_fields.items():
        default = (
            "" if field.is_required() else _default(field.get_default(call_default_factory=True))
        )
        lines.append(f"  LEGO_{name.upper():<27} {default}")
        lines.append(f"      {field.description or ''}")
    return "\n".join(lines)


def _default(value: object) -> str:
    return "(unset)" if value is None else f"default {value!s}" if value != "" else "(empty)"


def build_parser() -> argparse.ArgumentParser:
    from engine.cli import add_engine_arguments

    parser = argparse.ArgumentParser(prog="lego-proxy", description=DESCRIPTION)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser(
        "serve",
        help="run the proxy",
        description="Run the proxy. With no LEGO_BACKEND_URL it starts the local CPU engine "
        "as a child process; with no LEGO_DATABASE_URL it keeps a SQLite file in "
        "LEGO_DATA_DIR. It checks the port, the database, the data directory and the "
        "tokenizer before it starts anything.",
        epilog=settings_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument("--host", default=None, help="bind address (LEGO_HOST)")
    serve.add_argument("--port", type=int, default=None, help="port (LEGO_PORT)")
    serve.add_argument("--log-level", default="info", help="uvicorn's log level")
    serve.add_argument(
        "--loop",
        choices=("auto", "uvloop", "asyncio"),
        default="auto",
        help="event loop (auto: uvloop where installed)",
    )
    serve.add_argument(
        "--http",
        choices=("auto", "httptools", "h11"),
        default="auto",
        help="HTTP/1.1 parser (auto: httptools where installed)",
    )
    serve.add_argument(
        "--workers",
        type=int,
        default=1,
        help="proxy processes behind the one port, each session kept on one of them "
        "(needs LEGO_BACKEND_URL; docs/performance.md)",
    )
    # Internal: how `serve --workers` starts each worker (FD:INDEX of its channel).
    serve.add_argument("--worker-channel", default=None, help=argparse.SUPPRESS)
    serve.set_defaults(func=_serve)

    engine = commands.add_parser(
        "engine",
        help="run the SGLang-compatible local engine",
        description="The SGLang-compatible local engine alone (SGLang's native /generate "
        "protocol over a PyTorch model on the CPU).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_engine_arguments(engine)
    engine.set_defaults(func=_engine)

    db = commands.add_parser("db", help="database maintenance")
    db_commands = db.add_subparsers(dest="db_command", required=True, metavar="COMMAND")
    upgrade = db_commands.add_parser("upgrade", help="migrate LEGO_DATABASE_URL to head")
    upgrade.set_defaults(func=_db_upgrade)

    demo = commands.add_parser(
        "demo",
        help="a guided scripted rollout on the embedded default",
        description="One scripted agent rollout through the whole system (SQLite + the local "
        "CPU engine in a temporary directory), explained as it goes.",
    )
    demo.add_argument(
        "--keep", action="store_true", help="keep the data and say how to open it in the Live UI"
    )
    demo.set_defaults(func=_demo)

    from cli import loop_cmd, rollout_cmd, sandbox_cmd, tasks_cmd

    tasks_cmd.add_parser(commands)
    rollout_cmd.add_parser(commands)
    loop_cmd.add_parser(commands)
    sandbox_cmd.add_parser(commands)

    # Listed for --help; main() hands everything after "train" to trainer_bridge's own parser.
    commands.add_parser("train", help="run trainer_bridge (lego-proxy train --help)")
    return parser


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["train"]:
            from trainer_bridge.train import main as train_main

            train_main(argv[1:], prog="lego-proxy train")
            return
        args = build_parser().parse_args(argv)
        args.func(args)
    except LegoError as exc:
        print(f"lego-proxy: {exc.message}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
