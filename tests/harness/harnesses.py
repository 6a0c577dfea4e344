"""How each real harness is pointed at lego-proxy and run once, non-interactively.

Owns one launcher per harness (``run_opencode``, ``run_claude_code``, ``run_codex``,
``run_openhands``). Each writes the harness's own configuration (the same files and env
vars ``docs/harnesses.md`` tells users to write) into an isolated home, runs the unmodified
program in ``workspace`` under a hard timeout with stdin closed, and returns a
``HarnessRun``: exit code, output, wall time. Nothing is patched inside the harness; the
session key travels only as the harness's API key or in the base URL's ``/s/{key}/`` path.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HARD_TIMEOUT_S = 300.0
# Harnesses read a real-looking model name from their config; the proxy records it as sent.
MODEL = "lego-policy"


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


def _isolated_env(home: Path, **extra: str) -> dict[str, str]:
    """A minimal environment: a private HOME/XDG tree, no proxies, nothing inherited."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "NO_COLOR": "1",
    }
    env.update(extra)
    return env


def _run(name: str, argv: list[str], cwd: Path, env: dict[str, str]) -> HarnessRun:
    start = time.monotonic()
    try:
        done = subprocess.run(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=HARD_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
        return HarnessRun(name, -9, out, err + "\n[hard timeout]", time.monotonic() - start)
    return HarnessRun(name, done.returncode, done.stdout, done.stderr, time.monotonic() - start)


# --- OpenCode: OpenAI Chat through the bundled @ai-sdk/openai-compatible provider -------


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
    """``opencode run --format json``; ``title=None`` lets OpenCode ask the model for one."""
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "lego": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "lego-proxy",
                "options": {"baseURL": session["openai_base_url"], "apiKey": session["key"]},
                "models": {
                    MODEL: {
                        "name": MODEL,
                        "tool_call": True,
                        "reasoning": True,
                        "limit": {"context": context_limit, "output": 4096},
                    }
                },
            }
        },
        "model": f"lego/{MODEL}",
        "small_model": f"lego/{MODEL}",
        "permission": {"bash": "allow", "edit": "allow", "webfetch": "deny"},
        "autoupdate": False,
        "share": "disabled",
    }
    (workspace / "opencode.json").write_text(json.dumps(config, indent=1))
    env = _isolated_env(
        home,
        OPENCODE_DISABLE_MODELS_FETCH="1",
        OPENCODE_DISABLE_AUTOUPDATE="1",
        OPENCODE_DISABLE_SHARE="1",
        OPENCODE_DISABLE_LSP_DOWNLOAD="1",
    )
    argv = [str(installed.bin / "opencode"), "run", "-m", f"lego/{MODEL}", "--format", "json"]
    if title is not None:
        argv += ["--title", title]
    return _run("opencode", [*argv, prompt], workspace, env)


# --- Claude Code: Anthropic Messages --------------------------------------------------------


def run_claude_code(
    installed: Installed,
    session: dict[str, Any],
    workspace: Path,
    home: Path,
    prompt: str,
    *,
    resume: bool = False,
) -> HarnessRun:
    """``claude -p --output-format json``; ``resume`` adds ``--continue`` (same history)."""
    env = _isolated_env(
        home,
        # As root, --dangerously-skip-permissions is refused unless the box says it is a sandbox.
        IS_SANDBOX="1",
        ANTHROPIC_BASE_URL=session["anthropic_base_url"],
        ANTHROPIC_API_KEY=session["key"],
        DISABLE_TELEMETRY="1",
        DISABLE_AUTOUPDATER="1",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
    )
    argv = [
        str(installed.bin / "claude"),
        "-p",
        prompt,
        "--model",
        MODEL,
        "--dangerously-skip-permissions",
        "--output-format",
        "json",
    ]
    if resume:
        argv.append("--continue")
    return _run("claude-code", argv, workspace, env)


# --- Codex CLI: OpenAI Responses --------------------------------------------------------------


def run_codex(
    installed: Installed,
    session: dict[str, Any],
    workspace: Path,
    home: Path,
    prompt: str,
    *,
    extra_config: str = "",
) -> HarnessRun:
    """``codex exec --json`` with a custom Responses provider in ``$CODEX_HOME/config.toml``."""
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(
        f'model = "{MODEL}"\n'
        'model_provider = "lego"\n'
        "check_for_update_on_startup = false\n"
        f"{extra_config}\n"
        "[model_providers.lego]\n"
        'name = "lego-proxy"\n'
        f'base_url = "{session["openai_base_url"]}"\n'
        'env_key = "LEGO_SESSION_KEY"\n'
        'wire_api = "responses"\n'
        "[analytics]\n"
        "enabled = false\n"
    )
    env = _isolated_env(home, CODEX_HOME=str(codex_home), LEGO_SESSION_KEY=session["key"])
    argv = [
        str(installed.bin / "codex"),
        "exec",
        "--json",
        "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox",
        prompt,
    ]
    return _run("codex", argv, workspace, env)


# --- OpenHands SDK: OpenAI Chat through LiteLLM, in its own Python 3.12 ----------------------

OPENHANDS_DRIVER = Path(__file__).with_name("openhands_driver.py")


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
    """The SDK's documented loop (``openhands_driver.py``) in the pinned Python 3.12 venv."""
    env = _isolated_env(
        home,
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        LEGO_OPENAI_BASE_URL=session["openai_base_url"],
        LEGO_SESSION_KEY=session["key"],
        LEGO_STREAM="1" if stream else "0",
        LEGO_NUM_RETRIES=str(num_retries),
    )
    argv = [str(installed.python312), str(OPENHANDS_DRIVER), prompt]
    return _run("openhands", argv, workspace, env)
