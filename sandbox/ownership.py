"""Handing a spec's writable paths to the sandbox user, when the runner is root.

A root runner's sandbox (bwrap without a user namespace, or a rootful container) runs as
the spec's real host uid, so host permissions decide what it may write:

- the workspace ``lower`` must already be that uid's (an image is built once and chowned
  once; nothing chowns a shared image per trial): ``prepare_writable`` refuses one that is
  not, naming the fix, rather than let the first ``git apply`` fail with EACCES;
- the workspace's ``upper``/``work`` (made when missing) and each writable mount's source
  are the trial's own: they are handed over (``chown -R``).
"""

from __future__ import annotations

import os
from pathlib import Path

from kernel.errors import SandboxError
from sandbox.spec import SandboxSpec


def hand_over(path: Path, uid: int, gid: int) -> None:
    """``chown -R uid:gid path`` (symlinks themselves, never what they point at)."""
    os.lchown(path, uid, gid)
    if not path.is_dir() or path.is_symlink():
        return
    for root, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            os.lchown(os.path.join(root, name), uid, gid)


def prepare_writable(spec: SandboxSpec) -> None:
    if spec.workspace is not None:
        ws = spec.workspace
        owner = ws.lower.stat().st_uid
        if owner != spec.uid:
            raise SandboxError(
                f"workspace lower {ws.lower} is owned by uid {owner}: the sandbox user "
                f"(uid {spec.uid}) could not change the repository; chown -R "
                f"{spec.uid}:{spec.gid} it once when the image is built"
            )
        for directory in (ws.upper, ws.work):
            directory.mkdir(parents=True, exist_ok=True)
            hand_over(directory, spec.uid, spec.gid)
    for mount in spec.mounts:
        if mount.writable:
            hand_over(mount.source, spec.uid, spec.gid)
