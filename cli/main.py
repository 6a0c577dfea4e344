"""The ``lego-proxy`` command line.

lego-proxy serve [--host H] [--port P]     the proxy (settings from LEGO_* env)
lego-proxy engine [--model DIR] [--port P] the SGLang-compatible local engine alone
lego-proxy db upgrade                      bring the database to the current schema
lego-proxy demo                            a scripted multi-turn tool-calling rollout
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from pydantic import ValidationError

from kernel.errors import LegoError
from proxy.settings import Settings


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

    from proxy.app import create_app
    from proxy.served_template import served_template

    overrides: dict[str, Any] = {}
    if args.host is not None:
        overrides["host"] = args.host
    if args.port is not None:
        overrides["port"] = args.port
    settings = _load_settings(**overrides)
    if settings.tokenizer_path is not None:
        # Refuse a template the ledger cannot serve with one line, before anything starts
        # (inside the app's start-up the same LegoError would reach uvicorn's traceback).
        template = served_template(settings.tokenizer_path, settings.tool_parser)
        print(
            f"lego-proxy: tool calls parsed as {template.tool_parser} "
            f"({template.tool_parser_source})",
            file=sys.stderr,
        )
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=30,
        # Harnesses keep their connection across tool calls that take seconds to minutes;
        # closing idle ones after uvicorn's default 5 s races their next request (a client
        # sees the close as a read error on a request it had already sent).
        timeout_keep_alive=75,
    )


def _engine(args: argparse.Namespace) -> None:
    from engine.cli import run_engine

    run_engine(args)


def _db_upgrade(args: argparse.Namespace) -> None:
    from sqlalchemy.engine import make_url

    from recorder.migrate import upgrade_database

    settings = _load_settings()
    url = settings.effective_database_url
    asyncio.run(upgrade_database(url))
    shown = make_url(url).render_as_string(hide_password=True)
    print(f"database at {shown} is at the current schema")


def _demo(args: argparse.Namespace) -> None:
    from cli.demo import run_demo

    run_demo(keep=args.keep)


def build_parser() -> argparse.ArgumentParser:
    from engine.cli import add_engine_arguments

    parser = argparse.ArgumentParser(prog="lego-proxy", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the proxy")
    serve.add_argument("--host", default=None, help="bind address (LEGO_HOST)")
    serve.add_argument("--port", type=int, default=None, help="port (LEGO_PORT)")
    serve.add_argument("--log-level", default="info")
    serve.set_defaults(func=_serve)

    engine = commands.add_parser("engine", help="run the SGLang-compatible local engine")
    add_engine_arguments(engine)
    engine.set_defaults(func=_engine)

    db = commands.add_parser("db", help="database maintenance")
    db_commands = db.add_subparsers(dest="db_command", required=True)
    upgrade = db_commands.add_parser("upgrade", help="migrate LEGO_DATABASE_URL to head")
    upgrade.set_defaults(func=_db_upgrade)

    demo = commands.add_parser("demo", help="run a scripted rollout on the embedded default")
    demo.add_argument("--keep", action="store_true", help="keep the demo's data directory")
    demo.set_defaults(func=_demo)

    # Listed for --help; main() hands everything after "train" to trainer_bridge's own parser.
    commands.add_parser("train", help="run trainer_bridge (options: lego-proxy train --help)")
    return parser


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["train"]:
        from trainer_bridge.train import main as train_main

        train_main(argv[1:])
        return
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except LegoError as exc:
        print(f"lego-proxy: {exc.message}", file=sys.stderr)
        raise SystemExit(1) from exc
    except KeyboardInterrupt:
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
