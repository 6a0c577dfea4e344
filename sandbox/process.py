"""One sandbox process on the host: started, fed, captured within bounds, killed at its deadline.

``run_bounded(argv, ...)`` starts ``argv`` in a new session, writes ``stdin``, keeps at most
``max_output_bytes`` of each of stdout and stderr (the tail: test summaries and tracebacks
come last; a marker says how much was dropped), and at the wall-clock deadline kills the
whole process group, calls ``on_timeout`` (a container backend removes its container
there) and reports ``timed_out`` with no return code.

With ``ready_fd`` (the read end of a pipe whose write end the sandbox holds), the command
counts as started only once the sandbox writes ``ready`` to it; a sandbox that exits
without saying it could not be made, and ``SandboxError`` carries what it printed.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO

from kernel.errors import SandboxError
from sandbox.spec import ExecResult

DEFAULT_MAX_OUTPUT_BYTES = 8 * 1024 * 1024
READER_GRACE_S = 10.0


class _Tail:
    """The last ``limit`` bytes of a stream, and how many came before them."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._data = bytearray()
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        self._data += chunk
        excess = len(self._data) - self._limit
        if excess > self._limit:  # trim in batches, not on every chunk
            del self._data[:excess]
            self.dropped += excess

    def text(self) -> str:
        excess = max(0, len(self._data) - self._limit)
        dropped = self.dropped + excess
        body = bytes(self._data[excess:]).decode("utf-8", errors="replace")
        return f"[lego-sandbox: {dropped} bytes dropped]\n{body}" if dropped else body


def _drain(stream: IO[bytes], tail: _Tail) -> None:
    with stream:
        while chunk := os.read(stream.fileno(), 65536):
            tail.add(chunk)


def _feed(stream: IO[bytes], data: bytes) -> None:
    try:
        with stream:
            stream.write(data)
    except BrokenPipeError:
        pass  # the command exited without reading all of its input


def _wait_ready(fd: int, deadline: float) -> bool:
    """True once the sandbox says ``ready``; False when the deadline passes first."""
    received = b""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        readable, _, _ = select.select([fd], [], [], remaining)
        if not readable:
            return False
        chunk = os.read(fd, 64)
        if not chunk:
            return b"ready" in received
        received += chunk
        if b"ready" in received:
            return True


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):  # it ended on its own at the deadline
        os.killpg(process.pid, signal.SIGKILL)


def run_bounded(
    argv: Sequence[str],
    *,
    stdin: bytes | None,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    ready_fd: int | None = None,
    pass_fds: Sequence[int] = (),
    on_start: Callable[[int], None] | None = None,
    on_timeout: Callable[[], None] | None = None,
) -> ExecResult:
    started = time.monotonic()
    deadline = started + timeout_s
    try:
        process = subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env) if env is not None else None,
            pass_fds=tuple(pass_fds),
            start_new_session=True,
        )
    except OSError as exc:
        raise SandboxError(f"cannot start {argv[0]}: {exc}") from exc
    finally:
        for fd in pass_fds:
            os.close(fd)  # the child holds its copy; ours would keep the pipe open
    if on_start is not None:
        on_start(process.pid)
    assert process.stdout is not None
    assert process.stderr is not None
    out, err = _Tail(max_output_bytes), _Tail(max_output_bytes)
    threads = [
        threading.Thread(target=_drain, args=(process.stdout, out), daemon=True),
        threading.Thread(target=_drain, args=(process.stderr, err), daemon=True),
    ]
    if stdin is not None:
        assert process.stdin is not None
        threads.append(threading.Thread(target=_feed, args=(process.stdin, stdin), daemon=True))
    for thread in threads:
        thread.start()

    timed_out = False
    try:
        if ready_fd is not None and not _wait_ready(ready_fd, deadline):
            if time.monotonic() < deadline:
                process.wait()
                for thread in threads:
                    thread.join(READER_GRACE_S)
                raise SandboxError(
                    f"the sandbox exited before its command started "
                    f"(exit {process.returncode}): {err.text()[-4000:].strip()}"
                )
            timed_out = True
        if not timed_out:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        if ready_fd is not None:
            os.close(ready_fd)
        if process.poll() is None:
            _kill_group(process)
            if on_timeout is not None:
                on_timeout()
            process.wait()
    for thread in threads:
        thread.join(READER_GRACE_S)
    return ExecResult(
        returncode=None if timed_out else process.returncode,
        stdout=out.text(),
        stderr=err.text(),
        wall_s=time.monotonic() - started,
        timed_out=timed_out,
    )
