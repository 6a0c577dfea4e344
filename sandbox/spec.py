"""The sandbox contract every backend implements: what to run, where, with which network.

A trial runs a few one-shot commands (the harness; later the grader's test command), each
in a fresh sandbox built from a ``SandboxSpec``. The spec says which host directories are
seen and how (``Mount``), where the task's repository appears (``Workspace``: a read-only
lower layer, the task image, with the writes landing in a host directory the grader reads
afterwards), which user runs the command, for how long, and what the network reaches:

- ``Network.NONE``: loopback only (grading, image checks);
- ``Network.PROXY_ONLY``: loopback, where ``127.0.0.1:<inside_port>`` reaches the proxy on
  the host and nothing else does (the agent phase).

``Sandbox.run`` returns an ``ExecResult`` whatever the command did (a non-zero exit, a
timeout); it raises ``SandboxError`` only when the sandbox itself could not be made.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Protocol


class Network(StrEnum):
    NONE = "none"
    PROXY_ONLY = "proxy_only"


@dataclass(frozen=True, slots=True)
class ProxyRoute:
    """Where the proxy listens, as the runner reaches it, and where the sandbox sees it."""

    host: str
    port: int
    inside_port: int


@dataclass(frozen=True, slots=True)
class Mount:
    source: Path  # a host path
    target: str  # an absolute path inside the sandbox
    writable: bool = False


@dataclass(frozen=True, slots=True)
class Workspace:
    """The task's repository inside the sandbox: ``lower`` is never written; the writes
    land in ``upper`` (``work`` is the overlay's scratch dir on the same filesystem)."""

    lower: Path
    upper: Path
    work: Path
    target: str = "/testbed"


@dataclass(frozen=True, slots=True)
class SandboxSpec:
    label: str  # the trial's id: every process and directory it leaves is found by it
    workspace: Workspace | None = None
    mounts: tuple[Mount, ...] = ()
    network: Network = Network.NONE
    proxy: ProxyRoute | None = None  # required with Network.PROXY_ONLY
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str = "/testbed"
    uid: int = 1000  # unprivileged inside; never root
    gid: int = 1000
    timeout_s: float = 600.0
    memory_mb: int | None = None  # container backends enforce it; bwrap ignores it
    pids_limit: int | None = None


@dataclass(frozen=True, slots=True)
class ExecResult:
    returncode: int | None  # None when the command was killed at its deadline
    stdout: str
    stderr: str
    wall_s: float
    timed_out: bool


class Sandbox(Protocol):
    """A backend: ``bwrap`` (the default), ``podman`` or ``docker``."""

    @property
    def name(self) -> str: ...

    def run(
        self, spec: SandboxSpec, argv: Sequence[str], stdin: bytes | None = None
    ) -> ExecResult: ...
