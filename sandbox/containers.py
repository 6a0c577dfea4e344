"""What the podman and docker backends share: one ``<engine> run`` per command, found by label.

``ContainerSandbox.run`` runs the command in a fresh ``--rm --init`` container from the
backend's image, as the spec's uid/gid with no capabilities and no-new-privileges, on a
read-only root with private ``/tmp``, with the spec's mounts, environment, memory and pids
limits, labelled ``lego.trial=<label>`` and ``lego.runner=<pid>.<start ticks>`` and named
after its registry record, so ``sandbox.reap`` finds it even when its runner was SIGKILLed.

- ``Network.NONE``: ``--network none`` (loopback only).
- ``Network.PROXY_ONLY``: the engine's bridge network, with ``sandbox.egress``'s rule
  loaded into the container's namespace from outside; the command waits behind a gate
  (a file in a read-only bind of the sandbox's scratch dir) that opens only once the rule
  is in, so it never runs with an open network. The proxy must listen where the bridge
  reaches it: a loopback ``ProxyRoute.host`` is taken to mean the bridge's gateway.

At the deadline the container is removed (``rm -f``), not just its client killed. Exit
125 is the engine's own failure (no image, a bad flag): ``SandboxError``, never a result.

The engine modules fill two hooks, ``engine_flags`` (the OCI runtime and ulimits these
machines need, read-only-root details) and ``workspace_flags`` (the task's overlay), and
say how they remove a container at once (``remove_flags``).
"""

from __future__ import annotations

import abc
import ipaddress
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from kernel.errors import SandboxError
from sandbox import egress, registry
from sandbox.checks import check_spec
from sandbox.ownership import prepare_writable
from sandbox.process import DEFAULT_MAX_OUTPUT_BYTES, run_bounded
from sandbox.spec import ExecResult, Network, ProxyRoute, SandboxSpec, Workspace

TRIAL_LABEL = "lego.trial"
RUNNER_LABEL = "lego.runner"
GATE_DIR = "/run/lego"
GATE_FILE = "open"
ENGINE_FAILED = 125
INSPECT_POLL_S = 0.05
TOOL_TIMEOUT_S = 60.0
INSPECT_FORMAT = "{{.State.Pid}} {{.NetworkSettings.Gateway}}"


def runner_label(runner: registry.ProcessId) -> str:
    return f"{runner.pid}.{runner.start_ticks}"


def gate(command: Sequence[str]) -> list[str]:
    script = f'while [ ! -e {GATE_DIR}/{GATE_FILE} ]; do sleep 0.05; done; exec "$@"'
    return ["/bin/sh", "-c", script, "lego-gate", *command]


def plain_path(path: str) -> str:
    if "," in path or '"' in path:
        raise SandboxError(f"container mounts cannot take a path with ',' or '\"': {path}")
    return path


def bind_flag(source: str, target: str, *, writable: bool) -> list[str]:
    mode = "" if writable else ",readonly"
    return ["--mount", f"type=bind,source={plain_path(source)},target={plain_path(target)}{mode}"]


class ContainerSandbox(abc.ABC):
    """``Sandbox`` over a container engine; ``Podman`` and ``Docker`` fill the hooks."""

    engine = "container"  # the engine's command name and the backend's name
    remove_flags: tuple[str, ...] = ()  # ``rm`` and what makes it immediate

    def __init__(
        self,
        *,
        image: str,
        runtime_dir: Path | None = None,
        binary: str | None = None,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    ) -> None:
        found = binary or shutil.which(self.engine)
        if found is None:
            raise SandboxError(f"{self.engine} is not installed (no {self.engine} on PATH)")
        self.binary = found
        self.image = image
        self._runtime_dir = runtime_dir or registry.default_runtime_dir(os.environ)
        self._max_output_bytes = max_output_bytes

    @property
    def name(self) -> str:
        return self.engine

    @property
    def runtime_dir(self) -> Path:
        return self._runtime_dir

    # -- hooks --------------------------------------------------------------------------

    @abc.abstractmethod
    def engine_flags(self) -> list[str]: ...

    @abc.abstractmethod
    def workspace_flags(self, workspace: Workspace) -> list[str]: ...

    def remove_argv(self, container: str) -> list[str]:
        return [self.binary, *self.remove_flags, container]

    # -- the command line (pure) -------------------------------------------------------

    def run_argv(
        self,
        spec: SandboxSpec,
        command: Sequence[str],
        *,
        container: str,
        runner: registry.ProcessId,
        scratch: Path,
        interactive: bool,
    ) -> list[str]:
        argv = [self.binary, "run", "--rm", "--init", "--name", container]
        argv += ["--label", f"{TRIAL_LABEL}={spec.label}"]
        argv += ["--label", f"{RUNNER_LABEL}={runner_label(runner)}"]
        if interactive:
            argv.append("--interactive")
        argv += ["--user", f"{spec.uid}:{spec.gid}", "--workdir", spec.cwd]
        argv += ["--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--read-only"]
        argv += ["--hostname", "lego-sandbox", *self.engine_flags()]
        if spec.memory_mb is not None:
            argv += ["--memory", f"{spec.memory_mb}m", "--memory-swap", f"{spec.memory_mb}m"]
        if spec.pids_limit is not None:
            argv += ["--pids-limit", str(spec.pids_limit)]
        proxied = spec.network is Network.PROXY_ONLY
        argv += ["--network", "bridge" if proxied else "none"]
        for key, value in spec.env.items():
            argv += ["--env", f"{key}={value}"]
        for mount in spec.mounts:
            argv += bind_flag(str(mount.source), mount.target, writable=mount.writable)
        if spec.workspace is not None:
            argv += self.workspace_flags(spec.workspace)
        if proxied:
            argv += bind_flag(str(scratch), GATE_DIR, writable=False)
        return [*argv, self.image, *(gate(command) if proxied else command)]

    # -- running -------------------------------------------------------------------------

    def run(self, spec: SandboxSpec, argv: Sequence[str], stdin: bytes | None = None) -> ExecResult:
        check_spec(spec)
        if not argv:
            raise SandboxError("no command to run")
        if os.geteuid() == 0:
            prepare_writable(spec)
        registration = registry.register(
            self._runtime_dir, label=spec.label, backend=self.name, containerised=True
        )
        container = registration.record.container
        assert container is not None
        failures: list[str] = []
        try:
            command = self.run_argv(
                spec,
                argv,
                container=container,
                runner=registration.record.runner,
                scratch=registration.scratch,
                interactive=stdin is not None,
            )
            on_start = None
            if spec.network is Network.PROXY_ONLY:
                assert spec.proxy is not None
                opener = threading.Thread(
                    target=self._open_egress,
                    args=(spec.proxy, container, registration.scratch, spec.timeout_s, failures),
                    daemon=True,
                )

                def on_start(pid: int) -> None:
                    del pid
                    opener.start()

            result = run_bounded(
                command,
                stdin=stdin,
                timeout_s=spec.timeout_s,
                max_output_bytes=self._max_output_bytes,
                on_start=on_start,
                on_timeout=lambda: self.remove(container),
            )
        finally:
            self.remove(container)
            registration.close()
        if failures:
            raise SandboxError(failures[0])
        if result.returncode == ENGINE_FAILED:
            raise SandboxError(
                f"{self.engine} could not run the container: {result.stderr[-4000:].strip()}"
            )
        return result

    def remove(self, container: str) -> None:
        """Removes the container now (SIGKILL, no grace period); a missing one is fine."""
        subprocess.run(
            self.remove_argv(container),
            capture_output=True,
            timeout=TOOL_TIMEOUT_S,
            check=False,
        )

    def _inspect(self, container: str) -> tuple[int, str]:
        done = subprocess.run(
            [self.binary, "inspect", "--format", INSPECT_FORMAT, container],
            capture_output=True,
            text=True,
            timeout=TOOL_TIMEOUT_S,
            check=False,
        )
        fields = done.stdout.split()
        if done.returncode != 0 or not fields:
            return 0, ""
        return int(fields[0]), fields[1] if len(fields) > 1 else ""

    def _open_egress(
        self,
        route: ProxyRoute,
        container: str,
        scratch: Path,
        timeout_s: float,
        failures: list[str],
    ) -> None:
        try:
            deadline = time.monotonic() + timeout_s
            pid, gateway = self._inspect(container)
            while pid == 0:
                if time.monotonic() > deadline:
                    raise SandboxError(f"container {container} never started")
                time.sleep(INSPECT_POLL_S)
                pid, gateway = self._inspect(container)
            address = proxy_address(route.host, gateway)
            ruleset = egress.proxy_only_ruleset(address, route.port, route.inside_port)
            for command, given in (
                (["sh", "-c", f"echo 1 > {egress.ROUTE_LOCALNET}"], None),
                (["nft", "-f", "-"], ruleset),
            ):
                done = subprocess.run(
                    egress.nsenter_argv(pid, *command),
                    input=given,
                    capture_output=True,
                    text=True,
                    timeout=TOOL_TIMEOUT_S,
                    check=False,
                )
                if done.returncode != 0:
                    raise SandboxError(
                        f"cannot load the egress rule of {container}: {done.stderr.strip()}"
                    )
            (scratch / GATE_FILE).touch()
        except (SandboxError, ValueError, OSError, subprocess.SubprocessError) as exc:
            failures.append(str(exc))
            self.remove(container)  # the command must never run unfenced


def proxy_address(host: str, gateway: str) -> str:
    """The IPv4 address the container reaches the proxy at: the bridge's gateway for a
    proxy on the runner's loopback, else the host's own address."""
    address = socket.gethostbyname(host)
    if ipaddress.ip_address(address).is_loopback:
        if not gateway:
            raise SandboxError("the container's network has no gateway to reach the proxy by")
        return gateway
    return address
