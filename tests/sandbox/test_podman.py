"""The podman backend for real, when podman is installed and runs containers here
(skipped with the reason otherwise): the same guarantees as bwrap's, plus the reaper
removing the container of a SIGKILLed runner.

The test servers listen on every address because a container reaches the host only
through its bridge's gateway, which exists only while a container is attached; the
connections the tests make go to 127.0.0.1 inside the container or to the gateway.
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
from sandbox.podman import Podman
from sandbox.reap import reap
from sandbox.spec import Network, ProxyRoute, SandboxSpec, Workspace
from tests.sandbox.images import ImageUnavailable, tiny_image
from tests.sandbox.processes import wait_until_gone
from tests.sandbox.runners import start_runner
from tests.sandbox.servers import serve, stop

PATH = {"PATH": "/usr/bin:/bin"}
GATEWAY = "{{range .Subnets}}{{.Gateway}}{{end}}"


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> str:
    binary = shutil.which("podman")
    if binary is None:
        pytest.skip("podman is not installed")
    try:
        built = tiny_image(binary, tmp_path_factory.mktemp("image"))
    except ImageUnavailable as exc:
        pytest.skip(str(exc))
    probe = Podman(image=built, runtime_dir=tmp_path_factory.mktemp("probe"))
    try:
        probe.run(SandboxSpec(label="probe", cwd="/tmp"), ["true"])
    except SandboxError as exc:
        pytest.skip(f"podman cannot run containers here: {exc.message[-300:]}")
    return built


@pytest.fixture
def podman(image: str, runtime_dir: Path) -> Podman:
    return Podman(image=image, runtime_dir=runtime_dir)


@pytest.fixture
def bridge_servers() -> Iterator[tuple[ThreadingHTTPServer, ThreadingHTTPServer]]:
    proxy, other = serve("0.0.0.0"), serve("0.0.0.0")
    yield proxy, other
    stop(proxy)
    stop(other)


def test_grading_runs_unprivileged_offline_with_an_overlay(
    podman: Podman, workspace: Workspace
) -> None:
    spec = SandboxSpec(label="t", workspace=workspace, env=PATH, memory_mb=256, pids_limit=64)
    script = (
        "id -u; echo changed > module.py; echo new > added.txt; "
        "(exec 3<>/dev/tcp/127.0.0.1/8000) 2>/dev/null || echo offline; exit 4"
    )
    result = podman.run(spec, ["bash", "-c", script])
    assert (result.returncode, result.stdout) == (4, "1000\noffline\n")
    assert (workspace.lower / "module.py").read_text() == "VALUE = 1\n"
    assert (workspace.upper / "module.py").read_text() == "changed\n"
    assert (workspace.upper / "added.txt").read_text() == "new\n"


def test_proxy_only_reaches_the_proxy_and_nothing_else(
    podman: Podman, bridge_servers: tuple[ThreadingHTTPServer, ThreadingHTTPServer]
) -> None:
    proxy, other = bridge_servers
    gateway = subprocess.run(
        ["podman", "network", "inspect", "podman", "--format", GATEWAY],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    route = ProxyRoute("127.0.0.1", proxy.server_address[1], 8000)
    spec = SandboxSpec(label="t", network=Network.PROXY_ONLY, proxy=route, cwd="/tmp", env=PATH)
    script = (
        "exec 3<>/dev/tcp/127.0.0.1/8000; printf 'GET /v1 HTTP/1.0\\r\\n\\r\\n' >&3; "
        "tail=$(cat <&3); echo \"${tail##*$'\\n'}\"; "
        f"for target in {gateway}/{other.server_address[1]} 127.0.0.1/{other.server_address[1]} "
        "198.51.100.1/80; do "
        "(exec 4<>/dev/tcp/${target}) 2>/dev/null && echo open || echo refused; done"
    )
    result = podman.run(spec, ["bash", "-c", script])
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"served by {proxy.server_address[1]} /v1",
        "refused",
        "refused",
        "refused",
    ]


def test_the_deadline_removes_the_container(podman: Podman) -> None:
    spec = SandboxSpec(label="deadline", cwd="/tmp", env=PATH, timeout_s=2.0)
    result = podman.run(spec, ["sleep", "600"])
    assert (result.returncode, result.timed_out) == (None, True)
    listed = subprocess.run(
        ["podman", "ps", "--all", "--quiet", "--filter", "label=lego.trial=deadline"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert listed.stdout.strip() == ""


def test_reap_removes_the_container_of_a_sigkilled_runner(
    image: str, runtime_dir: Path, bridge_servers: tuple[ThreadingHTTPServer, ThreadingHTTPServer]
) -> None:
    marker = f"{uuid.uuid4().int % 10**6 + 10**6}.75"
    backend = f"Podman(image={image!r}, runtime_dir=runtime_dir)"
    runner = start_runner(backend, runtime_dir, marker, bridge_servers[0].server_address[1])
    runner.send_signal(signal.SIGKILL)
    runner.wait()
    listed = subprocess.run(
        ["podman", "ps", "--quiet", "--filter", "label=lego.trial=doomed"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert listed.stdout.strip() != ""  # a container outlives its client: the reaper's job
    done = reap(runtime_dir, {"podman": "podman"})
    assert any(line.startswith("removed podman container lego-doomed-") for line in done)
    wait_until_gone(marker)
    assert list(runtime_dir.iterdir()) == []
