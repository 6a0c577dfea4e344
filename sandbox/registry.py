"""The registry of live sandboxes: one record per sandbox in a runtime directory.

A backend ``register``s a sandbox before it starts anything (label, backend, the runner's
pid and start time, the scratch directory it owns, the container's name) and fills in the
sandbox's own pid once it runs; ``Registration.close()`` removes the scratch directory and
the record when the sandbox has ended. A runner that is SIGKILLed leaves its records
behind: ``sandbox.reap`` finds them (a record whose runner is gone) and cleans up.

A process is named by pid *and* start time (``/proc/<pid>/stat`` field 22), so a reused
pid is never taken for the runner that died.

The runtime directory is ``$LEGO_SANDBOX_DIR`` or ``<tmp>/lego-sandbox-<uid>``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

RECORD_SUFFIX = ".json"


class ProcessId(BaseModel):
    model_config = ConfigDict(frozen=True)

    pid: int
    start_ticks: int

    def alive(self) -> bool:
        return process_start_ticks(self.pid) == self.start_ticks


class SandboxRecord(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    label: str
    backend: str
    runner: ProcessId
    scratch: Path
    sandbox: ProcessId | None = None  # the bwrap process, once started
    container: str | None = None  # the container's name (podman, docker)


def process_start_ticks(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot, or None when it does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) is parenthesised and may hold spaces or parentheses.
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19])


def this_process() -> ProcessId:
    pid = os.getpid()
    ticks = process_start_ticks(pid)
    assert ticks is not None
    return ProcessId(pid=pid, start_ticks=ticks)


def default_runtime_dir(environ: Mapping[str, str]) -> Path:
    configured = environ.get("LEGO_SANDBOX_DIR")
    if configured:
        return Path(configured)
    return Path(tempfile.gettempdir()) / f"lego-sandbox-{os.getuid()}"


def _safe(label: str) -> str:
    kept = "".join(c if c.isalnum() or c in "-_." else "-" for c in label)
    return kept.strip(".-")[:48] or "trial"


class Registration:
    """A live sandbox's record and scratch directory; ``close()`` removes both."""

    def __init__(self, runtime_dir: Path, record: SandboxRecord) -> None:
        self._path = runtime_dir / f"{record.id}{RECORD_SUFFIX}"
        self.record = record
        self._write()

    @property
    def scratch(self) -> Path:
        return self.record.scratch

    def _write(self) -> None:
        staged = self._path.with_suffix(".tmp")
        staged.write_text(self.record.model_dump_json())
        staged.replace(self._path)

    def started(self, pid: int) -> None:
        ticks = process_start_ticks(pid)
        if ticks is None:
            return  # already gone: nothing for a reaper to kill
        self.record = self.record.model_copy(
            update={"sandbox": ProcessId(pid=pid, start_ticks=ticks)}
        )
        self._write()

    def close(self) -> None:
        # The scratch directory goes first, for the same reason it is made last.
        shutil.rmtree(self.record.scratch, ignore_errors=True)
        self._path.unlink(missing_ok=True)


def register(
    runtime_dir: Path, *, label: str, backend: str, containerised: bool = False
) -> Registration:
    """Records a sandbox about to start; a containerised one gets its container's name
    (``lego-<id>``) here, so even a container whose runner dies at once can be found."""
    runtime_dir.mkdir(parents=True, exist_ok=True, mode=0o711)
    sandbox_id = f"{_safe(label)}-{uuid.uuid4().hex[:10]}"
    record = SandboxRecord(
        id=sandbox_id,
        label=label,
        backend=backend,
        runner=this_process(),
        scratch=runtime_dir / sandbox_id,
        container=f"lego-{sandbox_id}" if containerised else None,
    )
    # The record comes first: a scratch directory without one is always an orphan.
    registration = Registration(runtime_dir, record)
    record.scratch.mkdir(mode=0o711)
    return registration


def records(runtime_dir: Path) -> Iterator[tuple[Path, SandboxRecord | None]]:
    """Every record file, parsed (None for one that cannot be read: a torn write)."""
    if not runtime_dir.is_dir():
        return
    for path in sorted(runtime_dir.glob(f"*{RECORD_SUFFIX}")):
        try:
            yield path, SandboxRecord.model_validate_json(path.read_text())
        except (OSError, ValidationError):
            yield path, None
