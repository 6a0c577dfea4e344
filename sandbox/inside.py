"""The first program inside a bwrap sandbox, and the byte relay both forwarders share.

Run by the sandbox's own ``/usr/bin/python3 -I`` before the command (so it imports only
the standard library: the project is not inside), it

1. listens on ``127.0.0.1:<port>`` and ``[::1]:<port>`` when given ``--listen`` (the
   proxy-only network: each connection is relayed to the Unix socket ``--unix``, whose
   other end is the runner's ``sandbox.bridge``, which connects only to the proxy);
2. drops to ``--uid``/``--gid`` with no supplementary groups when it starts as root (the
   runner was root and bwrap ran without a user namespace, so the command runs as a real
   unprivileged host uid with no capabilities);
3. writes ``ready`` to ``--ready-fd`` (the runner takes a sandbox that never says it as
   one that could not be made) and runs the command: exec'd directly without a listener,
   else as a child whose exit status becomes this program's while the relay serves.

A command that cannot be executed exits 127, as a shell's would. ``--unset NAME`` keeps a
variable this interpreter sets for itself (``LC_CTYPE``, by its C-locale coercion) out of
the command's environment, which is then exactly the spec's.

``relay(a, b)`` copies bytes both ways between two connected sockets until both
directions are closed, passing half-closes on, so streamed (SSE) and keep-alive HTTP
flow through unchanged; ``sandbox.bridge`` uses it on the host side too.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
import threading
import time
from collections.abc import Sequence

CHUNK = 65536
EXEC_FAILED = 127


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(CHUNK):
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        # One side reset or went away: tear both down, which also wakes the other pump.
        for end in (source, sink):
            with contextlib.suppress(OSError):  # already closed
                end.shutdown(socket.SHUT_RDWR)


def relay(a: socket.socket, b: socket.socket) -> None:
    """Copies ``a`` <-> ``b`` until both directions end, then closes both."""
    back = threading.Thread(target=_pump, args=(b, a), daemon=True)
    back.start()
    _pump(a, b)
    back.join()
    a.close()
    b.close()


def _serve(listener: socket.socket, unix_path: str) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            # Out of descriptors (the command opened too many): refuse this one, keep serving.
            time.sleep(0.05)
            continue
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(unix_path)
        except OSError:
            client.close()
            upstream.close()
            continue
        threading.Thread(target=relay, args=(client, upstream), daemon=True).start()


def _listen(port: int) -> list[socket.socket]:
    """``127.0.0.1:port``, and ``[::1]:port`` where IPv6 is up: a client that resolves
    ``localhost`` to ``::1`` first (Node does) reaches the proxy too."""
    listeners = []
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            listener.bind((host, port))
        except OSError:
            listener.close()
            if family == socket.AF_INET:
                raise
            continue  # no IPv6 loopback in this sandbox: IPv4 alone
        listener.listen(256)
        listeners.append(listener)
    return listeners


def _drop_privileges(uid: int, gid: int) -> None:
    if os.getuid() != 0:
        return  # bwrap already made the user namespace's uid the requested one
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise SystemExit(f"lego-sandbox: could not drop to uid {uid}")


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="lego-sandbox")
    parser.add_argument("--uid", type=int, required=True)
    parser.add_argument("--gid", type=int, required=True)
    parser.add_argument("--ready-fd", type=int, required=True)
    parser.add_argument("--listen", type=int, default=None)
    parser.add_argument("--unix", default=None)
    parser.add_argument("--unset", action="append", default=[])
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        parser.error("no command")
    return args


def _exec(command: list[str], unset: Sequence[str]) -> None:
    env = {key: value for key, value in os.environ.items() if key not in unset}
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        print(f"lego-sandbox: cannot run {command[0]}: {exc.strerror}", file=sys.stderr)
        os._exit(EXEC_FAILED)


def main(argv: Sequence[str]) -> int:
    args = _parse(argv)
    listeners = [] if args.listen is None else _listen(args.listen)
    _drop_privileges(args.uid, args.gid)
    os.write(args.ready_fd, b"ready\n")
    os.close(args.ready_fd)
    if not listeners:
        _exec(args.command, args.unset)
    child = os.fork()
    if child == 0:
        for listener in listeners:
            listener.close()
        _exec(args.command, args.unset)
    for listener in listeners:
        threading.Thread(target=_serve, args=(listener, args.unix), daemon=True).start()
    _, status = os.waitpid(child, 0)
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
