"""git on the host, hardened, for the image build and the grader.

Every call ignores the system's and the user's git configuration, runs no hooks and no
fsmonitor, never prompts, and reaches no network (only ``file`` transport): the image
build reads a task's repository and the grader assembles its workspace with git, and
neither may run anything a repository or the host's config asks for. Commits it makes have
a fixed identity and date, so the same tree always gives the same commit.

``git(cwd, *args)`` returns stdout; a non-zero exit raises ``GitFailed`` with git's stderr.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

from kernel.errors import TaskError

IDENTITY = {
    "GIT_AUTHOR_NAME": "lego-proxy",
    "GIT_AUTHOR_EMAIL": "tasks@lego-proxy.invalid",
    "GIT_COMMITTER_NAME": "lego-proxy",
    "GIT_COMMITTER_EMAIL": "tasks@lego-proxy.invalid",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z",
}
_HARDENING = (
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "core.fsmonitor=false",
    "-c",
    "safe.directory=*",
    "-c",
    "protocol.allow=never",
    "-c",
    "protocol.file.allow=always",
    "-c",
    "gc.auto=0",
)


class GitFailed(TaskError):
    """A git command exited non-zero; ``stderr`` is what git said."""

    def __init__(self, message: str, *, stderr: str) -> None:
        super().__init__(message)
        self.stderr = stderr


def git(cwd: Path, *args: str, env: Mapping[str, str] | None = None) -> str:
    environment = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ALLOW_PROTOCOL": "file",
        "LC_ALL": "C",
        **IDENTITY,
        **(env or {}),
    }
    done = subprocess.run(
        ["git", *_HARDENING, *args],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        stderr = done.stderr.strip()
        raise GitFailed(f"git {args[0]} failed in {cwd}: {stderr}", stderr=stderr)
    return done.stdout
