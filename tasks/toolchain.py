"""The grading toolchain packaged with the task images: Python and pytest, nothing fetched.

Inside a sandbox the command runs as an unprivileged user that cannot read the host's
own interpreter (it lives under ``/root/.pyenv``, mode 0700). The sandbox does see the
system's ``/usr``, so the toolchain is the system ``python3`` plus pytest and its
pure-Python dependencies, copied once from this interpreter's installed distributions
into ``CACHE/toolchains/<key>/site`` (the key hashes the interpreter and the versions):

    /opt/lego/toolchain/site/       pytest, pluggy, iniconfig, packaging, pygments
    /opt/lego/toolchain/bin/python  -> /usr/bin/python3 (python3 too)

Every task image mounts it read-only at ``/opt/lego/toolchain`` and sets ``PATH`` and
``PYTHONPATH`` (``Toolchain.env``), so a ``test_command`` of ``python -m pytest ...`` runs
the same pytest at build time, in the agent's shell and at grading.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from kernel.errors import TaskError
from sandbox.spec import Mount

INTERPRETER = "/usr/bin/python3"
TARGET = "/opt/lego/toolchain"
DISTRIBUTIONS = ("pytest", "pluggy", "iniconfig", "packaging", "pygments")


@dataclass(frozen=True, slots=True)
class Toolchain:
    key: str
    root: Path

    @property
    def mount(self) -> Mount:
        return Mount(source=self.root, target=TARGET)

    @property
    def env(self) -> dict[str, str]:
        return {
            "PATH": f"{TARGET}/bin:/usr/local/bin:/usr/bin:/bin",
            "PYTHONPATH": f"{TARGET}/site",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONNOUSERSITE": "1",
        }


def ensure_toolchain(cache_dir: Path) -> Toolchain:
    """The toolchain in ``cache_dir`` (built on first use, then reused)."""
    dists = [_distribution(name) for name in DISTRIBUTIONS]
    described = ";".join(f"{d.metadata['Name']}=={d.version}" for d in dists)
    key = hashlib.sha256(f"{INTERPRETER};{described}".encode()).hexdigest()[:16]
    root = cache_dir / "toolchains" / key
    if (root / "site").is_dir():
        return Toolchain(key=key, root=root)
    stage = root.with_name(f".build-{key}-{uuid.uuid4().hex[:8]}")
    for dist in dists:
        _copy_distribution(dist, stage / "site")
    (stage / "bin").mkdir(parents=True)
    for name in ("python", "python3"):
        os.symlink(INTERPRETER, stage / "bin" / name)
    try:
        stage.rename(root)
    except OSError:
        shutil.rmtree(stage)  # another build got there first; theirs is the same files
        if not (root / "site").is_dir():
            raise
    return Toolchain(key=key, root=root)


def _distribution(name: str) -> metadata.Distribution:
    try:
        return metadata.distribution(name)
    except metadata.PackageNotFoundError as exc:
        raise TaskError(f"the grading toolchain needs {name}, which is not installed") from exc


def _copy_distribution(dist: metadata.Distribution, site: Path) -> None:
    """The distribution's files that live in site-packages (its modules and metadata)."""
    if not dist.files:
        name = dist.metadata["Name"]
        raise TaskError(f"the grading toolchain cannot copy {name}: it has no file list (RECORD)")
    base = Path(str(dist.locate_file(""))).resolve()
    for entry in dist.files:
        source = Path(str(dist.locate_file(entry))).resolve()
        if not source.is_relative_to(base) or source.suffix == ".pyc" or not source.is_file():
            continue  # console scripts outside site-packages, bytecode for another build
        target = site / source.relative_to(base)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
