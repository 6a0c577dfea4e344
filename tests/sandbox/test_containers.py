"""The podman and docker backends' command lines and the egress rule, as pure functions
(the rule set is also checked by nft itself, in a throwaway network namespace)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from kernel.errors import ConfigurationError, SandboxError
from sandbox import egress, registry
from sandbox.backends import make_sandbox
from sandbox.bwrap import Bwrap
from sandbox.containers import gate, proxy_address
from sandbox.docker import Docker
from sandbox.podman import Podman
from sandbox.spec import Mount, Network, ProxyRoute, SandboxSpec, Workspace

RUNNER = registry.ProcessId(pid=4242, start_ticks=99)
WORKSPACE = Workspace(Path("/img/repo"), Path("/trial/upper"), Path("/trial/work"))
SPEC = SandboxSpec(
    label="task-1/0",
    workspace=WORKSPACE,
    mounts=(Mount(Path("/h/home"), "/home/agent", writable=True), Mount(Path("/rt"), "/opt/rt")),
    env={"PATH": "/usr/bin:/bin", "HOME": "/home/agent"},
    memory_mb=512,
    pids_limit=256,
)


def argv_of(backend: Podman | Docker, spec: SandboxSpec, stdin: bool = False) -> list[str]:
    return backend.run_argv(
        spec,
        ["pytest", "-q"],
        container="lego-task-1-0-abc",
        runner=RUNNER,
        scratch=Path("/rt/lego-sandbox/task-1-0-abc"),
        interactive=stdin,
    )


def test_podman_grading_command_line() -> None:
    argv = argv_of(Podman(image="localhost/task:1", binary="/usr/bin/podman"), SPEC)
    assert argv == [
        "/usr/bin/podman", "run", "--rm", "--init", "--name", "lego-task-1-0-abc",
        "--label", "lego.trial=task-1/0", "--label", "lego.runner=4242.99",
        "--user", "1000:1000", "--workdir", "/testbed",
        "--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--read-only",
        "--hostname", "lego-sandbox",
        "--runtime", "runc", "--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096",
        "--memory", "512m", "--memory-swap", "512m", "--pids-limit", "256",
        "--network", "none",
        "--env", "PATH=/usr/bin:/bin", "--env", "HOME=/home/agent",
        "--mount", "type=bind,source=/h/home,target=/home/agent",
        "--mount", "type=bind,source=/rt,target=/opt/rt,readonly",
        "--volume", "/img/repo:/testbed:O,upperdir=/trial/upper,workdir=/trial/work",
        "localhost/task:1", "pytest", "-q",
    ]  # fmt: skip


def test_docker_mounts_the_workspace_as_an_overlay_volume() -> None:
    argv = argv_of(Docker(image="task:1", binary="/usr/bin/docker"), SPEC, stdin=True)
    assert "--interactive" in argv
    assert "--runtime" not in argv
    assert argv[argv.index("--tmpfs") + 1] == "/tmp:rw,mode=1777"
    volume = argv[argv.index("task:1") - 1]
    assert volume == (
        "type=volume,target=/testbed,volume-driver=local,volume-opt=type=overlay,"
        'volume-opt=device=overlay,"volume-opt=o=lowerdir=/img/repo,upperdir=/trial/upper,'
        'workdir=/trial/work"'
    )


@pytest.mark.parametrize("backend", [Podman, Docker])
def test_proxy_only_uses_the_bridge_and_waits_behind_the_gate(
    backend: type[Podman] | type[Docker],
) -> None:
    spec = SandboxSpec(
        label="t", network=Network.PROXY_ONLY, proxy=ProxyRoute("127.0.0.1", 18080, 8000)
    )
    argv = argv_of(backend(image="img", binary="engine"), spec)
    assert argv[argv.index("--network") + 1] == "bridge"
    assert "type=bind,source=/rt/lego-sandbox/task-1-0-abc,target=/run/lego,readonly" in argv
    assert argv[argv.index("img") + 1 :] == gate(["pytest", "-q"])
    assert gate(["pytest"])[:2] == ["/bin/sh", "-c"]
    assert gate(["pytest"])[-1] == "pytest"


def test_a_path_that_would_break_the_mount_syntax_is_refused() -> None:
    spec = SandboxSpec(label="t", mounts=(Mount(Path("/a,b"), "/x"),))
    with pytest.raises(SandboxError, match="cannot take a path"):
        argv_of(Podman(image="img", binary="podman"), spec)


def test_the_egress_rule_allows_only_the_proxy() -> None:
    rules = egress.proxy_only_ruleset("10.88.0.1", 18080, 8000)
    assert "ip daddr 127.0.0.1 tcp dport 8000 dnat to 10.88.0.1:18080" in rules
    accepts = [line.strip() for line in rules.splitlines() if line.strip().endswith("accept")]
    assert accepts == [
        'oif "lo" accept',
        "ip daddr 10.88.0.1 tcp dport 18080 accept",
        'iif "lo" accept',
        "ct state established,related accept",
    ]
    assert rules.count("policy drop;") == 2
    with pytest.raises(ValueError, match="non-loopback"):
        egress.proxy_only_ruleset("127.0.0.1", 18080, 8000)


@pytest.mark.skipif(shutil.which("nft") is None or shutil.which("unshare") is None, reason="no nft")
def test_nft_accepts_the_rule_set(tmp_path: Path) -> None:
    rules = tmp_path / "rules.nft"
    rules.write_text(egress.proxy_only_ruleset("10.88.0.1", 18080, 8000))
    # In a network namespace of its own: the host's firewall is never touched.
    checked = subprocess.run(
        ["unshare", "--net", "nft", "--check", "-f", str(rules)],
        capture_output=True,
        text=True,
        check=False,
    )
    if "Operation not permitted" in checked.stderr:
        pytest.skip("no permission to make a network namespace here")
    assert checked.returncode == 0, checked.stderr
    assert egress.nsenter_argv(77, "nft", "-f", "-") == [
        "nsenter", "--target", "77", "--net", "--", "nft", "-f", "-",
    ]  # fmt: skip


def test_the_proxy_address_seen_from_a_container() -> None:
    assert proxy_address("127.0.0.1", "10.88.0.1") == "10.88.0.1"
    assert proxy_address("localhost", "172.17.0.1") == "172.17.0.1"
    assert proxy_address("10.1.2.3", "10.88.0.1") == "10.1.2.3"
    with pytest.raises(SandboxError, match="no gateway"):
        proxy_address("127.0.0.1", "")


def test_make_sandbox_by_name(tmp_path: Path) -> None:
    assert isinstance(make_sandbox("bwrap", runtime_dir=tmp_path), Bwrap)
    with pytest.raises(ConfigurationError, match="choose one of bwrap, podman, docker"):
        make_sandbox("firecracker")
    with pytest.raises(SandboxError, match="needs an image"):
        make_sandbox("docker")
    if shutil.which("podman") is None:
        with pytest.raises(SandboxError, match="podman is not installed"):
            make_sandbox("podman", image="img")
    else:
        assert make_sandbox("podman", image="img").name == "podman"
