"""``lego-proxy tasks``: (filled in by issue 18)."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(commands: Any) -> None:
    """Registers ``tasks`` on the top-level subcommand set."""
    del commands


def run(args: argparse.Namespace) -> None:
    del args
