"""The bubblewrap backend, run for real: what the command sees, reaches, writes and leaves.

Every network check targets 127.0.0.1 (host servers) or a TEST-NET address (192.0.2.1,
never routed: inside the sandbox it fails before a packet could leave).
"""

from __future__ import annotations

import os
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from kernel.errors import SandboxError
from sandbox.bwrap import Bwrap
from sandbox.spec import Mount, Network, ProxyRoute, SandboxSpec, Workspace
from tests.sandbox.processes import wait_until_gone

INSIDE_PORT = 8000
PATH = {"PATH": "/usr/bin:/bin"}


def proxy_spec(server: ThreadingHTTPServer, **changes: object) -> SandboxSpec:
    route = ProxyRoute(host="127.0.0.1", port=server.server_address[1], inside_port=INSIDE_PORT)
    fields: dict[str, object] = {
        "label": "trial-1",
        "network": Network.PROXY_ONLY,
        "proxy": route,
        "cwd": "/tmp",
        "env": PATH,
    }
    fields.update(changes)
    return SandboxSpec(**fields)  # type: ignore[arg-type]


def connect_script(host: str, port: int) -> str:
    return (
        "import socket, sys\n"
        "try:\n"
        f"    socket.create_connection(({host!r}, {port}), timeout=5)\n"
        "except OSError as exc:\n"
        "    print('refused', exc.errno)\n"
        "    sys.exit(0)\n"
        "print('connected')\n"
    )


def test_the_proxy_answers_on_the_inside_port(
    bwrap: Bwrap, http_server: ThreadingHTTPServer
) -> None:
    script = (
        "import urllib.request\n"
        f"print(urllib.request.urlopen('http://127.0.0.1:{INSIDE_PORT}/v1/models').read().decode())"
    )
    result = bwrap.run(proxy_spec(http_server), ["python3", "-c", script])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"served by {http_server.server_address[1]} /v1/models"


def test_localhost_reaches_the_proxy_over_ipv6_too(
    bwrap: Bwrap, http_server: ThreadingHTTPServer
) -> None:
    """Node resolves ``localhost`` to ``::1`` first: the proxy must answer there as well."""
    script = (
        "const http = require('http');\n"
        f"http.get({{host: '::1', port: {INSIDE_PORT}, path: '/node'}}, (res) => {{\n"
        "  let body = ''; res.on('data', (c) => body += c);\n"
        "  res.on('end', () => console.log(body));\n"
        "}).on('error', (e) => { console.log('error ' + e.code); });\n"
    )
    result = bwrap.run(proxy_spec(http_server), ["node", "-e", script])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"served by {http_server.server_address[1]} /node"


def test_another_host_port_is_unreachable(
    bwrap: Bwrap, http_server: ThreadingHTTPServer, other_server: ThreadingHTTPServer
) -> None:
    result = bwrap.run(
        proxy_spec(http_server),
        ["python3", "-c", connect_script("127.0.0.1", other_server.server_address[1])],
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("refused")


def test_an_outside_address_is_unreachable(bwrap: Bwrap, http_server: ThreadingHTTPServer) -> None:
    result = bwrap.run(proxy_spec(http_server), ["python3", "-c", connect_script("192.0.2.1", 80)])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "refused 101"  # ENETUNREACH: no route but loopback


def test_with_no_network_not_even_the_proxy_is_reachable(
    bwrap: Bwrap, http_server: ThreadingHTTPServer
) -> None:
    spec = proxy_spec(http_server, network=Network.NONE)
    for host, port in [
        ("127.0.0.1", INSIDE_PORT),
        ("127.0.0.1", http_server.server_address[1]),
        ("192.0.2.1", 80),
    ]:
        result = bwrap.run(spec, ["python3", "-c", connect_script(host, port)])
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("refused"), (host, port)


def test_streams_keep_alive_and_many_connections_pass(
    bwrap: Bwrap, http_server: ThreadingHTTPServer
) -> None:
    script = f"""
import http.client, threading
def get(path):
    conn = http.client.HTTPConnection('127.0.0.1', {INSIDE_PORT}, timeout=30)
    conn.request('GET', path)
    body = conn.getresponse().read().decode()
    conn.close()
    return body
results = {{}}
threads = [threading.Thread(target=lambda i=i: results.update({{i: get(f'/n{{i}}')}}))
           for i in range(24)]
[t.start() for t in threads]; [t.join() for t in threads]
assert all(results[i].endswith(f'/n{{i}}\\n') for i in range(24)), results
conn = http.client.HTTPConnection('127.0.0.1', {INSIDE_PORT}, timeout=30)
for i in range(3):  # one connection, three requests
    conn.request('GET', f'/again{{i}}')
    assert conn.getresponse().read().decode().endswith(f'/again{{i}}\\n')
conn.request('GET', '/stream')
response = conn.getresponse()
events = [line for line in response.read().decode().split('\\n') if line]
print(len(results), events)
"""
    result = bwrap.run(proxy_spec(http_server), ["python3", "-c", script])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        "24 ['data: event 0', 'data: event 1', 'data: event 2', 'data: event 3', 'data: event 4']"
    )


def test_writes_land_in_upper_and_lower_is_untouched(bwrap: Bwrap, workspace: Workspace) -> None:
    spec = SandboxSpec(label="t", workspace=workspace, env=PATH)
    script = "echo 'VALUE = 2' > module.py && rm tests/test_module.py && echo new > added.txt"
    result = bwrap.run(spec, ["sh", "-c", script])
    assert result.returncode == 0, result.stderr
    assert (workspace.lower / "module.py").read_text() == "VALUE = 1\n"
    assert (workspace.lower / "tests" / "test_module.py").exists()
    assert (workspace.upper / "module.py").read_text() == "VALUE = 2\n"
    assert (workspace.upper / "added.txt").read_text() == "new\n"
    assert (workspace.upper / "tests" / "test_module.py").is_char_device()  # a whiteout
    again = bwrap.run(spec, ["cat", "module.py", "added.txt"])
    assert again.stdout == "VALUE = 2\nnew\n"


def test_the_command_runs_unprivileged_with_only_its_env(
    bwrap: Bwrap, workspace: Workspace
) -> None:
    os.environ["LEGO_HOST_SECRET"] = "leaked"
    try:
        spec = SandboxSpec(label="t", workspace=workspace, env={**PATH, "ONLY": "this"})
        result = bwrap.run(
            spec, ["sh", "-c", "id -u; id -g; pwd; env | sort; grep CapEff /proc/self/status"]
        )
    finally:
        del os.environ["LEGO_HOST_SECRET"]
    lines = result.stdout.splitlines()
    assert lines[:3] == ["1000", "1000", "/testbed"]
    environment = [line for line in lines[3:] if not line.startswith("CapEff")]
    assert environment == ["ONLY=this", "PATH=/usr/bin:/bin", "PWD=/testbed"]
    assert lines[-1].split() == ["CapEff:", "0000000000000000"]


def test_the_host_is_not_visible(bwrap: Bwrap, tmp_path: Path) -> None:
    marker = tmp_path / "host-file"
    marker.write_text("host")
    result = bwrap.run(
        SandboxSpec(label="t", cwd="/tmp", env=PATH),
        ["sh", "-c", f"ls /; test -e {marker} && echo visible; touch /etc/x || echo ro"],
    )
    entries = set(result.stdout.split())
    assert "visible" not in entries
    assert "ro" in entries
    assert not entries & {"root", "home", "work", "srv", "mnt"}


def test_mounts_and_toolchains(bwrap: Bwrap, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "config.toml").write_text("model = 'm'\n")
    toolchain = Path(sys.base_prefix)  # the project's Python: /root/.pyenv/... (0700 parents)
    spec = SandboxSpec(
        label="t",
        cwd="/home/agent",
        env={**PATH, "HOME": "/home/agent"},
        mounts=(
            Mount(home, "/home/agent", writable=True),
            Mount(shared, "/opt/lego/config"),
            Mount(toolchain, str(toolchain)),
        ),
    )
    script = (
        "cat /opt/lego/config/config.toml; touch /opt/lego/config/x 2>/dev/null || echo ro; "
        f"echo hi > notes.txt; {toolchain}/bin/python3 -c 'import sys; print(sys.version_info[0])'"
    )
    result = bwrap.run(spec, ["sh", "-c", script])
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["model = 'm'", "ro", "3"]
    assert (home / "notes.txt").read_text() == "hi\n"


def test_a_non_zero_exit_and_stdin(bwrap: Bwrap) -> None:
    result = bwrap.run(
        SandboxSpec(label="t", cwd="/tmp", env=PATH), ["sh", "-c", "cat; exit 7"], stdin=b"in\n"
    )
    assert (result.returncode, result.stdout, result.timed_out) == (7, "in\n", False)


def test_a_missing_command_exits_127(bwrap: Bwrap) -> None:
    result = bwrap.run(SandboxSpec(label="t", cwd="/tmp", env=PATH), ["no-such-program"])
    assert result.returncode == 127
    assert "no-such-program" in result.stderr


def test_the_deadline_kills_the_whole_tree(bwrap: Bwrap) -> None:
    marker = f"{uuid.uuid4().int % 10**6 + 10**6}.5"  # an argv no other process has
    spec = SandboxSpec(label="t", cwd="/tmp", env=PATH, timeout_s=1.0)
    result = bwrap.run(spec, ["sh", "-c", f"sleep {marker} & sleep {marker}; echo never"])
    assert (result.returncode, result.timed_out) == (None, True)
    assert "never" not in result.stdout
    wait_until_gone(marker)


def test_output_is_bounded(runtime_dir: Path) -> None:
    small = Bwrap(runtime_dir=runtime_dir, max_output_bytes=1000)
    result = small.run(
        SandboxSpec(label="t", cwd="/tmp", env=PATH),
        ["sh", "-c", "head -c 300000 /dev/zero | tr '\\0' x; echo END"],
    )
    assert result.returncode == 0
    assert result.stdout.endswith("xxEND\n")
    assert result.stdout.startswith("[lego-sandbox: ")
    assert len(result.stdout) < 2100


def test_nothing_is_left_in_the_runtime_dir(
    bwrap: Bwrap, runtime_dir: Path, http_server: ThreadingHTTPServer
) -> None:
    bwrap.run(proxy_spec(http_server), ["true"])
    bwrap.run(SandboxSpec(label="t", cwd="/tmp", env=PATH), ["false"])
    assert list(runtime_dir.iterdir()) == []


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (SandboxSpec(label="t", network=Network.PROXY_ONLY), "needs a ProxyRoute"),
        (SandboxSpec(label="t", uid=0), "never runs as root"),
        (SandboxSpec(label="t", mounts=(Mount(Path("/no/such/dir"), "/x"),)), "does not exist"),
        (SandboxSpec(label="t", mounts=(Mount(Path("/etc"), "relative"),)), "must be absolute"),
        (SandboxSpec(label="", cwd="/tmp"), "needs a label"),
    ],
)
def test_a_bad_spec_is_a_clear_error(bwrap: Bwrap, spec: SandboxSpec, message: str) -> None:
    with pytest.raises(SandboxError, match=message):
        bwrap.run(spec, ["true"])


def test_a_mount_bwrap_cannot_make_is_a_sandbox_error(bwrap: Bwrap) -> None:
    spec = SandboxSpec(label="t", cwd="/tmp", mounts=(Mount(Path("/etc/hostname"), "/usr/nope/x"),))
    with pytest.raises(SandboxError, match="exited before its command started"):
        bwrap.run(spec, ["true"])


@pytest.mark.skipif(os.geteuid() != 0, reason="ownership is checked only for a root runner")
def test_a_lower_the_sandbox_user_cannot_write_is_refused(bwrap: Bwrap, tmp_path: Path) -> None:
    lower = tmp_path / "root-owned"
    lower.mkdir()
    spec = SandboxSpec(
        label="t", workspace=Workspace(lower, tmp_path / "u", tmp_path / "w"), env=PATH
    )
    with pytest.raises(SandboxError, match="chown -R 1000:1000"):
        bwrap.run(spec, ["true"])


def test_concurrent_sandboxes_each_reach_the_proxy(
    bwrap: Bwrap, http_server: ThreadingHTTPServer
) -> None:
    script = (
        "import sys, urllib.request\n"
        f"print(urllib.request.urlopen(f'http://127.0.0.1:{INSIDE_PORT}/' + sys.argv[1]).read())"
    )
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(
            pool.map(
                lambda i: bwrap.run(proxy_spec(http_server), ["python3", "-c", script, f"s{i}"]),
                range(4),
            )
        )
    port = http_server.server_address[1]
    assert [r.stdout.strip() for r in results] == [
        f"b'served by {port} /s{i}\\n'" for i in range(4)
    ]
