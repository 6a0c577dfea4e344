"""The docker backend: ``ContainerSandbox`` over a running docker daemon.

- docker's runc needs no ulimit workaround here;
- the workspace is an anonymous ``local`` volume of type overlay (``lowerdir``,
  ``upperdir``, ``workdir``), mounted by the daemon and removed with the container;
- ``--read-only`` with explicit tmpfs for /tmp and /var/tmp (docker adds none itself);
- ``rm -f -v``: SIGKILL at once, anonymous volumes with it.
"""

from __future__ import annotations

from sandbox.containers import ContainerSandbox, plain_path
from sandbox.spec import Workspace


class Docker(ContainerSandbox):
    engine = "docker"
    remove_flags = ("rm", "--force", "--volumes")

    def engine_flags(self) -> list[str]:
        return ["--tmpfs", "/tmp:rw,mode=1777", "--tmpfs", "/var/tmp:rw,mode=1777"]

    def workspace_flags(self, workspace: Workspace) -> list[str]:
        layers = (
            f"lowerdir={plain_path(str(workspace.lower))},upperdir={plain_path(str(workspace.upper))},"
            f"workdir={plain_path(str(workspace.work))}"
        )
        volume = (
            f"type=volume,target={plain_path(workspace.target)},volume-driver=local,"
            f'volume-opt=type=overlay,volume-opt=device=overlay,"volume-opt=o={layers}"'
        )
        return ["--mount", volume]
