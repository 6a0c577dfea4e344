"""Shared by the command-line tests: the installed console script, a clean environment,
and the processes a command started."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def lego_proxy() -> str:
    path = shutil.which("lego-proxy")
    assert path is not None, "the lego-proxy console script is not installed"
    return path


def clean_env(**lego: str) -> dict[str, str]:
    """The current environment without any LEGO_ variable, plus ``lego``."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("LEGO_")}
    env.update(lego)
    return env


# Started by libraries, not by us: ``ctypes.util.find_library`` runs ``ldconfig -p``, and
# trio (imported through transformers -> huggingface_hub -> httpx2 -> httpcore2) calls it at
# import time. It lives a few milliseconds, so a 20 ms poll sees it only now and then;
# counting it made the "nothing started before the check failed" tests flaky (stop 23's CI)
# without saying anything about the engine. Before its ``execve`` the helper is a vfork of
# the parent, with the parent's name and command line, so it is told apart by that too.
LIBRARY_HELPERS = frozenset({"ldconfig", "ldconfig.real"})


def children_of(pid: int) -> list[int]:
    """The live children of ``pid`` that run a program of their own (an engine, a
    worker), less the short-lived helpers libraries run."""
    try:
        parent_cmdline = (Path("/proc") / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []  # the parent itself is gone
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # "pid (comm) state ppid ...": comm may hold spaces, so split after its ')'.
            head, _, tail = stat.read_text().rpartition(")")
            if int(tail.split()[1]) != pid or head.partition("(")[2] in LIBRARY_HELPERS:
                continue
            if (stat.parent / "cmdline").read_bytes() == parent_cmdline:
                continue  # forked, not yet exec'd: a vfork on its way to a helper
        except OSError:
            continue  # the process exited while we looked
        children.append(int(stat.parent.name))
    return children


def is_running(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"
