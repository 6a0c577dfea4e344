"""How the tasks package runs things in sandboxes: as whom, where, with which network.

Every command the image build, the validator and the grader run goes through
``none_spec``: ``Network.NONE`` (loopback only), the unprivileged sandbox user, the
repository at ``WORKSPACE_TARGET``. ``give_to_sandbox_user(path)`` hands a tree the host
built (an image's workspace, the grader's fresh workspace) to that user: a root runner's
sandboxes run as that real uid, so a lower layer must be its own for its writes to copy
up; a non-root runner's sandboxes map the sandbox user onto the runner instead, and there
is nothing to hand over.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from pathlib import Path

from sandbox.ownership import hand_over
from sandbox.spec import Mount, Network, SandboxSpec, Workspace

SANDBOX_UID = 1000
SANDBOX_GID = 1000
WORKSPACE_TARGET = "/testbed"


def none_spec(
    label: str,
    *,
    mounts: tuple[Mount, ...],
    env: Mapping[str, str],
    timeout_s: float,
    workspace: Workspace | None = None,
) -> SandboxSpec:
    return SandboxSpec(
        label=f"{label}-{uuid.uuid4().hex[:8]}",
        workspace=workspace,
        mounts=mounts,
        network=Network.NONE,
        env=dict(env),
        cwd=WORKSPACE_TARGET,
        uid=SANDBOX_UID,
        gid=SANDBOX_GID,
        timeout_s=timeout_s,
    )


def give_to_sandbox_user(path: Path) -> None:
    """``chown -R`` to the sandbox user when the runner is root (links themselves)."""
    if os.geteuid() == 0:
        hand_over(path, SANDBOX_UID, SANDBOX_GID)
