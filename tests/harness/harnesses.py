"""How each real harness is pointed at lego-proxy and run once, non-interactively.

Owns one launcher per harness (``run_opencode``, ``run_claude_code``, ``run_codex``,
``run_openhands``). Each takes the product's launch plan (``rollouts.harnesses``: the
harness's own configuration files, env and argv) laid out on the host, writes its files
into an isolated home, runs the unmodified program in ``workspace`` under a hard timeout
with stdin closed, and returns a ``HarnessRun``: exit code, output, wall time.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollouts import harnesses as plans
from rollouts.harnesses import Endpoint, LaunchPlan, Layout

HARD_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class HarnessRun:
    name: str
    returncode: int
    stdout: str
    stderr: str
    wall_s: float

    def describe(self) -> str:
        return (
            f"{self.name} exited {self.returncode} after {self.wall_s:.1f} s\n"
            f"--- stdout (tail) ---\n{self.stdout[-4000:]}\n"
            f"--- stderr (tail) ---\n{self.stderr[-4000:]}"
        )

    def json_lines(self) -> list[dict[str, Any]]:
        """The stdout lines that are JSON objects (the harnesses' ``--json`` event streams)."""
        events: list[dict[str, Any]] = []
        for line in self.stdout.splitlines():
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                events.append(value)
        return events


@dataclass(frozen=True)
class Installed:
    """Where ``tests/harness/install.sh`` put the pinned programs."""

    cache: Path

    @property
    def bin(self) -> Path:
        return self.cache / "npm" / "node_modules" / ".bin"

    @property
    def python312(self) -> Path:
        return self.cache / "py312" / "bin" / "python"


def _layout(installed: Installed, workspace: Path, home: Path) -> Layout:
    return Layout(
        home=str(home),
        workspace=str(workspace),
        runtime=str(installed.cache),
        path=os.environ.get("PATH", "/usr/bin:/bin"),
        workspace_is_git=(workspace / ".git").exists(),
    )


def _run(plan: LaunchPlan, cwd: Path, home: Path) -> HarnessRun:
    plan.write_files(home)
    start = time.monotonic()
    try:
        done = subprocess.run(
            plan.argv,
            cwd=cwd,
            env=dict(plan.env),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=HARD_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
        wall = time.monotonic() - start
        return HarnessRun(plan.harness, -9, out, err + "\n[hard timeout]", wall)
    wall = time.monotonic() - start
    return HarnessRun(plan.harness, done.returncode, done.stdout, done.stderr, wall)


def run_opencode(
    installed: Installed,
    session: dict[str, Any],
    workspace: Path,
    home: Path,
    prompt: str,
    *,
    context_limit: int = 131072,
    title: str | None = "lego task",
) -> HarnessRun:
    layout = _layout(installed, workspace, home)
    endpoint = Endpoint.of_session(session)
    plan = plans.opencode_plan(layout, endpoint, prompt, context_limit=context_limit, title=title)
    return _run(plan, workspace, home)


def run_claude_code(
    installed: Installed,
    session: dict[str, Any],
    workspace: Path,
    home: Path,
    prompt: str,
    *,
    resume: bool = False,
) -> HarnessRun:
    layout = _layout(installed, workspace, home)
    plan = plans.claude_code_plan(layout, Endpoint.of_session(session), prompt, resume=resume)
    return _run(plan, workspace, home)


def run_codex(
    installed: Installed,
    session: dict[str, Any],
    workspace: Path,
    home: Path,
    prompt: str,
    *,
    extra_config: str = "",
) -> HarnessRun:
    layout = _layout(installed, workspace, home)
    endpoint = Endpoint.of_session(session)
    plan = plans.codex_plan(layout, endpoint, prompt, extra_config=extra_config)
    return _run(plan, workspace, home)


def run_openhands(
    installed: Installed,
    session: dict[str, Any],
    workspace: Path,
    home: Path,
    prompt: str,
    *,
    stream: bool = True,
    num_retries: int = 2,
) -> HarnessRun:
    layout = _layout(installed, workspace, home)
    endpoint = Endpoint.of_session(session)
    plan = plans.openhands_plan(layout, endpoint, prompt, stream=stream, num_retries=num_retries)
    return _run(plan, workspace, home)
