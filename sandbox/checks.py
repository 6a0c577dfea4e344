"""What every backend refuses before it makes anything: a spec no sandbox could honour.

``check_spec(spec)`` raises ``SandboxError`` with the reason (root inside, a proxy-only
network without a route, relative or clashing targets, a missing mount source or lower).
"""

from __future__ import annotations

from pathlib import PurePosixPath

from kernel.errors import SandboxError
from sandbox.spec import Network, SandboxSpec


def check_spec(spec: SandboxSpec) -> None:
    """Raises ``SandboxError`` naming what is wrong with ``spec``."""
    if not spec.label:
        raise SandboxError("a sandbox needs a label (the trial's id)")
    if spec.uid == 0 or spec.gid == 0:
        raise SandboxError("a sandbox never runs as root: give it an unprivileged uid and gid")
    if spec.timeout_s <= 0:
        raise SandboxError(f"timeout_s must be positive, not {spec.timeout_s}")
    if spec.network is Network.PROXY_ONLY and spec.proxy is None:
        raise SandboxError("Network.PROXY_ONLY needs a ProxyRoute (spec.proxy)")
    targets = [m.target for m in spec.mounts]
    if spec.workspace is not None:
        targets.append(spec.workspace.target)
    for target in [*targets, spec.cwd]:
        if not PurePosixPath(target).is_absolute() or PurePosixPath(target) == PurePosixPath("/"):
            raise SandboxError(f"sandbox paths must be absolute and not /: {target!r}")
    if len(set(targets)) != len(targets):
        raise SandboxError(f"two mounts share a target: {sorted(targets)}")
    for mount in spec.mounts:
        if not mount.source.exists():
            raise SandboxError(f"mount source {mount.source} does not exist")
    if spec.workspace is not None and not spec.workspace.lower.is_dir():
        raise SandboxError(f"workspace lower {spec.workspace.lower} is not a directory")
