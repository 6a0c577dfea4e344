"""A tiny container image made offline from the host's own binaries (no registry).

``tiny_image(engine)`` copies bash, dash and a few coreutils with the libraries ``ldd``
names into a root directory and imports it as ``localhost/lego-sandbox-test:tiny``: enough
for the smoke tests (``/bin/sh`` for the gate, bash's ``/dev/tcp`` for HTTP), built in
about a second. It raises ``ImageUnavailable`` with the reason when that cannot be done.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

IMAGE = "localhost/lego-sandbox-test:tiny"
PROGRAMS = ("sh", "bash", "sleep", "cat", "id", "touch", "ls", "rm", "echo", "env")


class ImageUnavailable(Exception):
    pass


def _copy(source: str, root: Path) -> None:
    real = os.path.realpath(source)
    target = root / source.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(real, target)


def tiny_image(binary: str, scratch: Path) -> str:
    root = scratch / "rootfs"
    for name in PROGRAMS:
        found = shutil.which(name, path="/usr/bin:/bin")
        if found is None:
            raise ImageUnavailable(f"no {name} on this host to put in the image")
        _copy(f"/bin/{name}", root)
        libraries = subprocess.run(["ldd", found], capture_output=True, text=True, check=False)
        for library in re.findall(r"(/\S+)", libraries.stdout):
            _copy(library, root)
    (root / "tmp").mkdir(exist_ok=True)
    tar = scratch / "rootfs.tar"
    with tarfile.open(tar, "w") as archive:
        archive.add(root, arcname=".")
    done = subprocess.run(
        [binary, "import", str(tar), IMAGE], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise ImageUnavailable(f"{binary} import failed: {done.stderr.strip()}")
    return IMAGE
