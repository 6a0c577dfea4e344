"""A pool of tasks, ``POOL/<task_id>/``: every directory loaded on its own.

``load_pool(pool)`` returns the tasks that load and, apart, the directories that do not,
each with the ``TaskError``'s reason: one malformed ``task.json`` never keeps the others
out. Directories are taken in name order; hidden ones (``.cache``, ``.git``) are skipped.
A pool directory that does not exist is a ``TaskError``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kernel.errors import TaskError
from tasks.spec import Task, load_task


@dataclass(frozen=True, slots=True)
class InvalidTask:
    task_id: str  # the directory's name
    reason: str


@dataclass(frozen=True, slots=True)
class Pool:
    root: Path
    tasks: tuple[Task, ...]
    invalid: tuple[InvalidTask, ...]


def load_pool(pool: Path) -> Pool:
    if not pool.is_dir():
        raise TaskError(f"task pool {pool} is not a directory")
    tasks: list[Task] = []
    invalid: list[InvalidTask] = []
    for directory in sorted(pool.iterdir()):
        if not directory.is_dir() or directory.name.startswith("."):
            continue
        try:
            tasks.append(load_task(directory))
        except TaskError as exc:
            invalid.append(InvalidTask(directory.name, exc.message))
    return Pool(root=pool.resolve(), tasks=tuple(tasks), invalid=tuple(invalid))
