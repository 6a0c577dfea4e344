"""Looking for sandbox processes on the host: ``sleep <marker>``, the marker unique to a test."""

from __future__ import annotations

import time
from pathlib import Path

# How long the kernel may take to finish killing a pid namespace whose init died: the
# loop ends as soon as the processes are gone; the bound only keeps a failure from hanging.
GONE_WITHIN_S = 30.0


def processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue  # exited while we looked
        if state != "Z" and argv[0].endswith(b"sleep") and marker.encode() in argv[1:]:
            found.append(int(entry.name))
    return found


def wait_until_gone(marker: str) -> None:
    deadline = time.monotonic() + GONE_WITHIN_S
    while processes_with(marker):
        assert time.monotonic() < deadline, f"processes with {marker} outlived their sandbox"
        time.sleep(0.05)
