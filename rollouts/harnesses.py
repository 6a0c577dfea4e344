"""How each real harness CLI is pointed at a session and started once, as a pure plan.

Owns ``LaunchPlan`` (the files to write under the harness's HOME, its environment, its
argv) and one planner per harness (``opencode_plan``, ``claude_code_plan``, ``codex_plan``,
``openhands_plan``; ``plan_for`` picks one by name with its defaults). A planner writes
nothing (``LaunchPlan.write_files`` does, where the caller says): every path in a plan is
the path *the harness process* sees, given by a ``Layout``, so the same plan runs on the
host (the harness suite: host paths) and inside a sandbox (HOME a writable mount, the
runtime mounted read-only at ``/opt/lego/harness``, the base URL rebased onto the
sandbox's ``127.0.0.1:<inside_port>`` by ``Endpoint.rebased``).

Nothing is patched inside a harness: each gets the configuration ``docs/harnesses.md``
tells users to write, and the session key travels only as its API key or in the base
URL's ``/s/{key}/`` path. Every config file lives under HOME, never in the workspace, so a
plan leaves nothing in the repository the grader reads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit, urlunsplit

HARNESSES = ("claude-code", "opencode", "codex", "openhands")
# Harnesses read a real-looking model name from their config; the proxy records it as sent.
MODEL = "lego-policy"
# The OpenHands SDK has no CLI of its own: this program runs its documented loop.
OPENHANDS_DRIVER = Path(__file__).with_name("openhands_driver.py")
DRIVER_IN_HOME = ".lego/openhands_driver.py"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """What the control API's session JSON gives a harness."""

    key: str
    openai_base_url: str
    anthropic_base_url: str

    @classmethod
    def of_session(cls, session: Mapping[str, object]) -> Endpoint:
        return cls(
            key=str(session["key"]),
            openai_base_url=str(session["openai_base_url"]),
            anthropic_base_url=str(session["anthropic_base_url"]),
        )

    def rebased(self, origin: str) -> Endpoint:
        """The same paths on another origin (``http://127.0.0.1:8000`` inside a sandbox)."""
        return Endpoint(
            self.key,
            _rebase(self.openai_base_url, origin),
            _rebase(self.anthropic_base_url, origin),
        )


def _rebase(url: str, origin: str) -> str:
    parts, new = urlsplit(url), urlsplit(origin)
    if not new.scheme or not new.netloc:
        raise ValueError(f"not an origin (scheme://host:port): {origin!r}")
    return urlunsplit((new.scheme, new.netloc, parts.path, parts.query, ""))


@dataclass(frozen=True, slots=True)
class Layout:
    """Where the harness process finds things (host paths, or paths inside a sandbox)."""

    home: str
    workspace: str
    runtime: str  # what ``make harness-install`` installed (npm tree, py312 venv)
    path: str = "/usr/bin:/bin"
    workspace_is_git: bool = True

    @property
    def bin(self) -> str:
        return f"{self.runtime}/npm/node_modules/.bin"

    @property
    def python312(self) -> str:
        return f"{self.runtime}/py312/bin/python"


@dataclass(frozen=True, slots=True)
class PlannedFile:
    path: str  # relative to HOME
    content: str

    def __post_init__(self) -> None:
        relative = PurePosixPath(self.path)
        if relative.is_absolute() or ".." in relative.parts:
            raise ValueError(f"a planned file must stay under HOME: {self.path!r}")


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    harness: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    files: tuple[PlannedFile, ...] = field(default=())

    def write_files(self, home: Path) -> None:
        """Writes the plan's files under ``home`` (the host directory that is HOME)."""
        for planned in self.files:
            target = home / planned.path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(planned.content)


def _env(layout: Layout, **extra: str) -> dict[str, str]:
    """A minimal environment: a private HOME/XDG tree, no proxies, nothing inherited."""
    home = layout.home
    env = {
        "PATH": layout.path,
        "HOME": home,
        "XDG_CONFIG_HOME": f"{home}/.config",
        "XDG_DATA_HOME": f"{home}/.local/share",
        "XDG_CACHE_HOME": f"{home}/.cache",
        "XDG_STATE_HOME": f"{home}/.local/state",
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "NO_COLOR": "1",
    }
    env.update(extra)
    return env


# --- OpenCode: OpenAI Chat through the bundled @ai-sdk/openai-compatible provider -------


def opencode_plan(
    layout: Layout,
    endpoint: Endpoint,
    prompt: str,
    *,
    context_limit: int = 131072,
    title: str | None = "lego task",
) -> LaunchPlan:
    """``opencode run --format json``; ``title=None`` lets OpenCode ask the model for one."""
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "lego": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "lego-proxy",
                "options": {"baseURL": endpoint.openai_base_url, "apiKey": endpoint.key},
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
    env = _env(
        layout,
        OPENCODE_DISABLE_MODELS_FETCH="1",
        OPENCODE_DISABLE_AUTOUPDATE="1",
        OPENCODE_DISABLE_SHARE="1",
        OPENCODE_DISABLE_LSP_DOWNLOAD="1",
    )
    argv = [f"{layout.bin}/opencode", "run", "-m", f"lego/{MODEL}", "--format", "json"]
    if title is not None:
        argv += ["--title", title]
    config_file = PlannedFile(".config/opencode/opencode.json", json.dumps(config, indent=1))
    return LaunchPlan("opencode", (*argv, prompt), env, (config_file,))


# --- Claude Code: Anthropic Messages --------------------------------------------------------


def claude_code_plan(
    layout: Layout, endpoint: Endpoint, prompt: str, *, resume: bool = False
) -> LaunchPlan:
    """``claude -p --output-format json``; ``resume`` adds ``--continue`` (same history)."""
    env = _env(
        layout,
        # As root, --dangerously-skip-permissions is refused unless the box says it is a sandbox.
        IS_SANDBOX="1",
        ANTHROPIC_BASE_URL=endpoint.anthropic_base_url,
        ANTHROPIC_API_KEY=endpoint.key,
        DISABLE_TELEMETRY="1",
        DISABLE_AUTOUPDATER="1",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
    )
    argv = [
        f"{layout.bin}/claude",
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
    return LaunchPlan("claude-code", tuple(argv), env)


# --- Codex CLI: OpenAI Responses --------------------------------------------------------------


def codex_plan(
    layout: Layout, endpoint: Endpoint, prompt: str, *, extra_config: str = ""
) -> LaunchPlan:
    """``codex exec --json`` with a custom Responses provider in ``$CODEX_HOME/config.toml``.

    Codex's own sandbox (landlock/seccomp) cannot nest inside another one, and a one-shot
    ``exec`` has nobody to approve commands: both are bypassed; the trial's sandbox is the
    boundary. ``--skip-git-repo-check`` only where the workspace is not a repository."""
    config = (
        f'model = "{MODEL}"\n'
        'model_provider = "lego"\n'
        "check_for_update_on_startup = false\n"
        f"{extra_config}\n"
        "[model_providers.lego]\n"
        'name = "lego-proxy"\n'
        f"base_url = {json.dumps(endpoint.openai_base_url)}\n"
        'env_key = "LEGO_SESSION_KEY"\n'
        'wire_api = "responses"\n'
        "[analytics]\n"
        "enabled = false\n"
    )
    env = _env(layout, CODEX_HOME=f"{layout.home}/.codex", LEGO_SESSION_KEY=endpoint.key)
    argv = [f"{layout.bin}/codex", "exec", "--json"]
    if not layout.workspace_is_git:
        argv.append("--skip-git-repo-check")
    argv += ["--dangerously-bypass-approvals-and-sandbox", prompt]
    return LaunchPlan("codex", tuple(argv), env, (PlannedFile(".codex/config.toml", config),))


# --- OpenHands SDK: OpenAI Chat through LiteLLM, in its own Python 3.12 ----------------------


def openhands_plan(
    layout: Layout,
    endpoint: Endpoint,
    prompt: str,
    *,
    stream: bool = True,
    num_retries: int = 2,
) -> LaunchPlan:
    """The SDK's documented loop (``openhands_driver.py``, written under HOME) in Python 3.12."""
    env = _env(
        layout,
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        LEGO_OPENAI_BASE_URL=endpoint.openai_base_url,
        LEGO_SESSION_KEY=endpoint.key,
        LEGO_STREAM="1" if stream else "0",
        LEGO_NUM_RETRIES=str(num_retries),
    )
    driver = PlannedFile(DRIVER_IN_HOME, OPENHANDS_DRIVER.read_text())
    argv = (layout.python312, f"{layout.home}/{DRIVER_IN_HOME}", prompt)
    return LaunchPlan("openhands", argv, env, (driver,))


def plan_for(harness: str, layout: Layout, endpoint: Endpoint, prompt: str) -> LaunchPlan:
    """The named harness's plan with its defaults (what a rollout runs)."""
    if harness == "opencode":
        return opencode_plan(layout, endpoint, prompt)
    if harness == "claude-code":
        return claude_code_plan(layout, endpoint, prompt)
    if harness == "codex":
        return codex_plan(layout, endpoint, prompt)
    if harness == "openhands":
        return openhands_plan(layout, endpoint, prompt)
    raise ValueError(f"unknown harness {harness!r}; expected one of {', '.join(HARNESSES)}")
