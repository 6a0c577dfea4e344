"""Agent workspaces over a task image: make one, patch one, read what the agent left.

``new_workspace(image, directory)`` is a fresh ``Workspace`` for one trial: the image's
workspace as the read-only lower layer, an empty ``upper`` (where the agent's writes
land) and ``work`` under ``directory``. ``apply_patch`` applies a patch in such a
workspace the way an agent would (``git apply`` inside a ``Network.NONE`` sandbox): the
validator uses it for the reference fix.

``final_tree(agent, image, sandbox, dest, timeout_s)`` copies what the agent left (the
overlay of ``upper`` on ``lower``, read by the kernel, whiteouts and all) into ``dest``
without any ``.git``: the grader never trusts the agent's git.
"""

from __future__ import annotations

from pathlib import Path

from kernel.errors import SandboxError, TaskError
from sandbox.spec import Mount, Sandbox, Workspace
from tasks.images import TaskImage
from tasks.sandboxing import WORKSPACE_TARGET, give_to_sandbox_user, none_spec

_OUT = "/run/lego-out"


def new_workspace(image: TaskImage, directory: Path) -> Workspace:
    upper, work = directory / "upper", directory / "work"
    upper.mkdir(parents=True)
    work.mkdir()
    give_to_sandbox_user(directory)
    return Workspace(lower=image.workspace, upper=upper, work=work, target=WORKSPACE_TARGET)


def apply_patch(image: TaskImage, workspace: Workspace, patch: bytes, sandbox: Sandbox) -> None:
    if not patch.strip():
        return
    spec = none_spec(
        f"apply-{image.task_id}",
        mounts=image.mounts,
        env=image.env,
        timeout_s=120.0,
        workspace=workspace,
    )
    result = sandbox.run(spec, ["git", "apply", "--whitespace=nowarn", "-"], stdin=patch)
    if result.returncode != 0:
        raise TaskError(f"task {image.task_id}: the patch does not apply: {result.stderr.strip()}")


def final_tree(
    agent: Workspace, image: TaskImage, sandbox: Sandbox, dest: Path, timeout_s: float
) -> None:
    """The agent's final tree, ``.git`` left out, in ``dest`` (made here).

    Files the sandbox user cannot read are left out too (``--ignore-failed-read``): a
    file the agent made unreadable is as good as deleted, never a grader error.
    """
    dest.mkdir(parents=True)
    spec = none_spec(
        f"collect-{image.task_id}",
        mounts=(Mount(dest, _OUT, writable=True),),
        env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"},
        timeout_s=timeout_s,
        workspace=agent,
    )
    script = (  # through a file, not a pipe: sh's exit status is then tar's, both times
        f"tar -C {WORKSPACE_TARGET} --exclude=.git --ignore-failed-read -cf /tmp/tree.tar . "
        f"&& tar -C {_OUT} --no-same-owner --preserve-permissions -xf /tmp/tree.tar"
    )
    result = sandbox.run(spec, ["sh", "-c", script])
    if result.timed_out or result.returncode != 0:
        raise SandboxError(
            f"could not read the agent's workspace (exit {result.returncode}): "
            f"{result.stderr.strip()[-500:]}"
        )
