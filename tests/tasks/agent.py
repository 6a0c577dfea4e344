"""A scripted agent for the tasks suite: shell commands in a trial's workspace, as a harness's
shell tool would run them (the sandbox user, the image's toolchain, the overlay over the
image). The network is loopback only here; the agent phase's proxy route is the rollout
runner's business, not the grader's."""

from __future__ import annotations

from pathlib import Path

from sandbox.spec import ExecResult, Sandbox, Workspace
from tasks.images import TaskImage
from tasks.sandboxing import none_spec
from tasks.workspaces import new_workspace


def shell(image: TaskImage, workspace: Workspace, command: str, sandbox: Sandbox) -> ExecResult:
    spec = none_spec(
        f"agent-{image.task_id}",
        mounts=image.mounts,
        env={**image.env, "HOME": "/tmp"},
        timeout_s=60.0,
        workspace=workspace,
    )
    return sandbox.run(spec, ["sh", "-c", command])


def trial(image: TaskImage, directory: Path, sandbox: Sandbox, *commands: str) -> Workspace:
    """A fresh workspace in which ``commands`` ran, one after another; each must succeed."""
    workspace = new_workspace(image, directory)
    for command in commands:
        result = shell(image, workspace, command, sandbox)
        assert result.returncode == 0, (command, result.stdout, result.stderr)
    return workspace
