"""``lego-proxy sandbox``: the sandboxes this machine's runners registered.

    lego-proxy sandbox reap [--runtime-dir DIR]   clean up what dead runners left
    lego-proxy sandbox list [--runtime-dir DIR]   the registered sandboxes, live or not

``reap`` prints one line per thing it removed (processes, containers, directories,
records) and a summary; a live runner's sandboxes are left alone. The runtime directory
defaults to ``$LEGO_SANDBOX_DIR`` or ``<tmp>/lego-sandbox-<uid>``, where the backends
register.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from sandbox import registry
from sandbox.reap import available_engines, reap


def add_parser(commands: Any) -> None:
    """Registers ``sandbox`` on the top-level subcommand set."""
    sandbox = commands.add_parser("sandbox", help="list and reap rollout sandboxes")
    actions = sandbox.add_subparsers(dest="sandbox_command", required=True, metavar="COMMAND")
    for name, func, help_text in (
        ("reap", _reap, "remove what dead runners left (processes, containers, directories)"),
        ("list", _list, "the registered sandboxes and whether their runner lives"),
    ):
        action = actions.add_parser(name, help=help_text, description=help_text)
        action.add_argument(
            "--runtime-dir",
            type=Path,
            default=None,
            help="the sandbox registry (default $LEGO_SANDBOX_DIR or <tmp>/lego-sandbox-<uid>)",
        )
        action.set_defaults(func=func)


def _runtime_dir(args: argparse.Namespace) -> Path:
    chosen: Path | None = args.runtime_dir
    return chosen if chosen is not None else registry.default_runtime_dir(os.environ)


def _reap(args: argparse.Namespace) -> None:
    runtime_dir = _runtime_dir(args)
    done = reap(runtime_dir, available_engines())
    for line in done:
        print(line)
    print(f"reaped {runtime_dir}: {len(done)} action(s)")


def _list(args: argparse.Namespace) -> None:
    for path, record in registry.records(_runtime_dir(args)):
        if record is None:
            print(f"{path}: unreadable")
            continue
        state = "live" if record.runner.alive() else "dead runner"
        where = record.container or (record.sandbox.pid if record.sandbox else "-")
        print(f"{record.id}\t{record.backend}\t{record.label}\t{state}\t{where}")


def run(args: argparse.Namespace) -> None:
    args.func(args)
