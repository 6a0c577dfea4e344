"""The podman backend: ``ContainerSandbox`` with what rootful podman needs on these machines.

- ``--runtime runc``: the packaged crun (1.8) fails on this kernel's hybrid cgroups;
- ``--ulimit nofile=20000:20000 --ulimit nproc=4096:4096``: without CAP_SYS_RESOURCE the
  runtime cannot raise the default limits podman asks for;
- the workspace is podman's overlay volume ``lower:target:O,upperdir=U,workdir=W``: reads
  from the image, writes in ``upper``;
- ``--read-only`` keeps podman's own tmpfs on /tmp, /var/tmp, /run and /dev/shm;
- ``rm -f -t 0``: no ten-second SIGTERM grace (``--init`` forwards the signal anyway).
"""

from __future__ import annotations

from sandbox.containers import ContainerSandbox, plain_path
from sandbox.spec import Workspace

ULIMITS = ("--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096")


class Podman(ContainerSandbox):
    engine = "podman"
    remove_flags = ("rm", "--force", "--time", "0", "--volumes")

    def engine_flags(self) -> list[str]:
        return ["--runtime", "runc", *ULIMITS]

    def workspace_flags(self, workspace: Workspace) -> list[str]:
        lower, target = plain_path(str(workspace.lower)), plain_path(workspace.target)
        upper, work = plain_path(str(workspace.upper)), plain_path(str(workspace.work))
        options = f"O,upperdir={upper},workdir={work}"
        return ["--volume", f"{lower}:{target}:{options}"]
