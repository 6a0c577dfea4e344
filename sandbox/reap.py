"""Cleaning up what dead runners left: ``lego-proxy sandbox reap``.

A runner that exits normally leaves nothing (each backend removes its record, scratch
directory and container as the command ends). One that is SIGKILLed leaves its records:
its bwrap processes die with it (``--die-with-parent``), but a container outlives the
``podman run`` client, and the scratch directories stay. ``reap(runtime_dir, engines)``
walks the registry and, for every record whose runner is gone (pid *and* start time):

- kills the recorded sandbox process if it somehow still runs,
- removes the recorded container (``rm -f``, no grace period),
- removes the scratch directory and the record;

then removes scratch directories no record names (the record is written first and
removed last, so such a directory is never a live sandbox's), and asks each available
engine for containers labelled ``lego.trial`` whose ``lego.runner`` is dead (a container
whose record went missing). A live runner's sandboxes are never touched. It returns one
line per thing it did.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path

from sandbox import registry
from sandbox.containers import RUNNER_LABEL, TOOL_TIMEOUT_S, TRIAL_LABEL
from sandbox.docker import Docker
from sandbox.podman import Podman

# How each engine removes a container right away, by engine name.
REMOVE = {Podman.engine: Podman.remove_flags, Docker.engine: Docker.remove_flags}


def _remove_container(binary: str, engine: str, container: str) -> bool:
    done = subprocess.run(
        [binary, *REMOVE[engine], container],
        capture_output=True,
        text=True,
        timeout=TOOL_TIMEOUT_S,
        check=False,
    )
    return done.returncode == 0


def _runner_dead(label: str) -> bool:
    pid, _, ticks = label.partition(".")
    if not (pid.isdigit() and ticks.isdigit()):
        return False  # not ours to judge
    return registry.process_start_ticks(int(pid)) != int(ticks)


def _reap_record(record: registry.SandboxRecord, engines: Mapping[str, str]) -> list[str]:
    done = []
    if record.sandbox is not None and record.sandbox.alive():
        os.kill(record.sandbox.pid, signal.SIGKILL)
        done.append(f"killed sandbox process {record.sandbox.pid} of {record.id}")
    binary = engines.get(record.backend)
    container = record.container
    if container and binary and _remove_container(binary, record.backend, container):
        done.append(f"removed {record.backend} container {container}")
    if record.scratch.exists():
        shutil.rmtree(record.scratch, ignore_errors=True)
        done.append(f"removed directory {record.scratch}")
    return done


def _labelled_orphans(engine: str, binary: str) -> list[str]:
    listed = subprocess.run(
        [binary, "ps", "--all", "--filter", f"label={TRIAL_LABEL}", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=TOOL_TIMEOUT_S,
        check=False,
    )
    if listed.returncode != 0 or not listed.stdout.strip():
        return []
    text = listed.stdout.strip()
    # podman prints one JSON array; docker prints one JSON object per line.
    rows = json.loads(text) if text.startswith("[") else [json.loads(x) for x in text.splitlines()]
    done = []
    for row in rows:
        labels = row.get("Labels") or {}
        if isinstance(labels, str):  # docker: "k=v,k=v"
            labels = dict(part.split("=", 1) for part in labels.split(",") if "=" in part)
        names = row.get("Names") or row.get("Name") or row.get("ID")
        name = names[0] if isinstance(names, list) else str(names)
        if _runner_dead(str(labels.get(RUNNER_LABEL, ""))) and _remove_container(
            binary, engine, name
        ):
            done.append(f"removed {engine} container {name} (its runner is gone)")
    return done


def reap(runtime_dir: Path, engines: Mapping[str, str]) -> list[str]:
    """Cleans up after dead runners; ``engines`` maps an engine name to its binary."""
    done: list[str] = []
    named: set[Path] = set()
    for path, record in registry.records(runtime_dir):
        if record is None:
            done.append(f"left unreadable record {path}")
            continue
        named.add(record.scratch)
        if record.runner.alive():
            continue
        done += _reap_record(record, engines)
        path.unlink(missing_ok=True)
        done.append(
            f"removed record {record.id} (label {record.label}, runner {record.runner.pid} gone)"
        )
    if runtime_dir.is_dir():
        for entry in sorted(runtime_dir.iterdir()):
            if entry.is_dir() and entry not in named:
                shutil.rmtree(entry, ignore_errors=True)
                done.append(f"removed orphan directory {entry}")
    for engine, binary in engines.items():
        done += _labelled_orphans(engine, binary)
    return done


def available_engines() -> dict[str, str]:
    """The container engines installed here, by name (podman, docker)."""
    return {name: found for name in REMOVE if (found := shutil.which(name)) is not None}
