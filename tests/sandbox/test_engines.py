"""The podman and docker backends for real, where the engine runs containers here
(skipped with the reason otherwise: no tool, no daemon, no runtime): the same guarantees
as bwrap's, plus the reaper removing the container of a SIGKILLed runner.

The test servers listen on every address because a container reaches the host only
through its bridge's gateway, which exists only while a container is attached; the
connections the tests make go to 127.0.0.1 inside the container, to the gateway, or to a
TEST-NET address the egress rule rejects before a packet leaves.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import uuid
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from kernel.errors import SandboxError
from sandbox.backends import CONTAINER_BACKENDS
from sandbox.containers import ContainerSandbox
from sandbox.reap import reap
from sandbox.spec import Network, ProxyRoute, SandboxSpec, Workspace
from tests.sandbox.images import ImageUnavailable, tiny_image
from tests.sandbox.processes import wait_until_gone
from tests.sandbox.runners import start_runner
from tests.sandbox.servers import serve, stop

PATH = {"PATH": "/usr/bin:/bin"}
# Where each engine's default bridge has its gateway.
GATEWAY = {
    "podman": ["network", "inspect", "podman", "--format", "{{range .Subnets}}{{.Gateway}}{{end}}"],
    "docker": ["network", "inspect", "bridge", "--format", "{{(index .IPAM.Config 0).Gateway}}"],
}


@pytest.fixture(scope="module", params=sorted(CONTAINER_BACKENDS))
def image(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, str]:
    engine: str = request.param
    binary = shutil.which(engine)
    if binary is None:
        pytest.skip(f"{engine} is not installed")
    try:
        built = tiny_image(binary, tmp_path_factory.mktemp("image"))
    except ImageUnavailable as exc:
        pytest.skip(str(exc))
    probe = CONTAINER_BACKENDS[engine](image=built, runtime_dir=tmp_path_factory.mktemp("probe"))
    try:
        probe.run(SandboxSpec(label="probe", cwd="/tmp"), ["sh", "-c", ":"])
    except SandboxError as exc:
        pytest.skip(f"{engine} cannot run containers here: {exc.message[-300:]}")
    return engine, built


@pytest.fixture
def backend(image: tuple[str, str], runtime_dir: Path) -> ContainerSandbox:
    engine, built = image
    return CONTAINER_BACKENDS[engine](image=built, runtime_dir=runtime_dir)


@pytest.fixture
def bridge_servers() -> Iterator[tuple[ThreadingHTTPServer, ThreadingHTTPServer]]:
    proxy, other = serve("0.0.0.0"), serve("0.0.0.0")
    yield proxy, other
    stop(proxy)
    stop(other)


def engine_out(backend: ContainerSandbox, *args: str) -> str:
    done = subprocess.run([backend.binary, *args], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_grading_runs_unprivileged_offline_with_an_overlay(
    backend: ContainerSandbox, workspace: Workspace
) -> None:
    spec = SandboxSpec(label="t", workspace=workspace, env=PATH, memory_mb=256, pids_limit=64)
    script = (
        "id -u; echo changed > module.py; echo new > added.txt; "
        "(exec 3<>/dev/tcp/127.0.0.1/8000) 2>/dev/null || echo offline; exit 4"
    )
    result = backend.run(spec, ["bash", "-c", script])
    assert (result.returncode, result.stdout) == (4, "1000\noffline\n"), result.stderr
    assert (workspace.lower / "module.py").read_text() == "VALUE = 1\n"
    assert (workspace.upper / "module.py").read_text() == "changed\n"
    assert (workspace.upper / "added.txt").read_text() == "new\n"


def test_proxy_only_reaches_the_proxy_and_nothing_else(
    backend: ContainerSandbox, bridge_servers: tuple[ThreadingHTTPServer, ThreadingHTTPServer]
) -> None:
    proxy, other = bridge_servers
    route = ProxyRoute("127.0.0.1", proxy.server_address[1], 8000)
    spec = SandboxSpec(label="t", network=Network.PROXY_ONLY, proxy=route, cwd="/tmp", env=PATH)
    gateway = engine_out(backend, *GATEWAY[backend.engine])
    other_port = other.server_address[1]
    script = (
        "exec 3<>/dev/tcp/127.0.0.1/8000; printf 'GET /v1 HTTP/1.0\\r\\n\\r\\n' >&3; "
        "tail=$(cat <&3); echo \"${tail##*$'\\n'}\"; "
        f"for target in {gateway}/{other_port} 127.0.0.1/{other_port} 198.51.100.1/80; do "
        "(exec 4<>/dev/tcp/${target}) 2>/dev/null && echo open || echo refused; done"
    )
    result = backend.run(spec, ["bash", "-c", script])
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"served by {proxy.server_address[1]} /v1",
        "refused",
        "refused",
        "refused",
    ]


def test_the_deadline_removes_the_container(backend: ContainerSandbox) -> None:
    label = f"deadline-{uuid.uuid4().hex[:8]}"
    result = backend.run(
        SandboxSpec(label=label, cwd="/tmp", env=PATH, timeout_s=2.0), ["sleep", "600"]
    )
    assert (result.returncode, result.timed_out) == (None, True)
    assert (
        engine_out(backend, "ps", "--all", "--quiet", "--filter", f"label=lego.trial={label}") == ""
    )


def test_reap_removes_the_container_of_a_sigkilled_runner(
    backend: ContainerSandbox,
    runtime_dir: Path,
    bridge_servers: tuple[ThreadingHTTPServer, ThreadingHTTPServer],
) -> None:
    marker = f"{uuid.uuid4().int % 10**6 + 10**6}.75"
    code = f"{type(backend).__name__}(image={backend.image!r}, runtime_dir=runtime_dir)"
    runner = start_runner(code, runtime_dir, marker, bridge_servers[0].server_address[1])
    runner.send_signal(signal.SIGKILL)
    runner.wait()
    # A container outlives its client: that is the reaper's job.
    assert engine_out(backend, "ps", "--quiet", "--filter", "label=lego.trial=doomed") != ""
    done = reap(runtime_dir, {backend.engine: backend.binary})
    assert any(line.startswith(f"removed {backend.engine} container lego-doomed-") for line in done)
    wait_until_gone(marker)
    assert list(runtime_dir.iterdir()) == []
