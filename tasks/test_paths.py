"""Undo what the agent did under ``test_paths``: the files only the grader may change.

``revert_test_paths(tree, image_workspace, test_paths)`` compares, for each test path, the
agent's final tree with the image's workspace (the repository at ``base_commit``): a file
the agent edited, deleted or replaced (by a link, a directory) is put back
(``test_path_reverted``), a file it added is removed (``test_file_removed``), and the path
becomes exactly the image's again. A test path whose parent the agent replaced by a link
or a file gets a real directory back first, so nothing here ever follows a link the agent
made out of the tree. Returns the events, one per kind that happened.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path, PurePosixPath

from tasks.events import DefenseEvent, DefenseKind

Signature = tuple[str, str]


def revert_test_paths(
    tree: Path, image_workspace: Path, test_paths: tuple[str, ...]
) -> list[DefenseEvent]:
    reverted: set[str] = set()
    removed: set[str] = set()
    for rel in test_paths:
        reverted.update(_repair_parents(tree, rel))
        before = _entries(image_workspace, rel)
        after = _entries(tree, rel)
        reverted.update(path for path, sig in before.items() if after.get(path) != sig)
        removed.update(path for path in after if path not in before)
        if after != before:
            _replace(tree / rel, image_workspace / rel)
    events = []
    if reverted:
        events.append(
            DefenseEvent(
                DefenseKind.TEST_PATH_REVERTED,
                f"{len(reverted)} file(s) under test_paths the agent changed or deleted "
                "were restored to base_commit",
                tuple(sorted(reverted)),
            )
        )
    if removed:
        events.append(
            DefenseEvent(
                DefenseKind.TEST_FILE_REMOVED,
                f"{len(removed)} file(s) the agent added under test_paths were removed",
                tuple(sorted(removed)),
            )
        )
    return events


def _repair_parents(tree: Path, rel: str) -> list[str]:
    """Makes every parent of ``rel`` in ``tree`` a real directory; names what it replaced."""
    replaced = []
    parents = list(PurePosixPath(rel).parents)[::-1][1:]  # "a", "a/b" for "a/b/c"
    for parent in parents:
        path = tree / parent
        if path.is_symlink() or (path.exists() and not path.is_dir()):
            path.unlink()
            replaced.append(str(parent))
        if not path.exists():
            path.mkdir()
    return replaced


def _entries(root: Path, rel: str) -> dict[str, Signature]:
    """Every file, link or special file at or under ``root/rel``, by repository path."""
    top = root / rel
    if not os.path.lexists(top):
        return {}
    if top.is_symlink() or not top.is_dir():
        return {rel: _signature(top)}
    found: dict[str, Signature] = {}
    for directory, dirs, files in os.walk(top):
        base = Path(directory)
        for name in [*files, *(d for d in dirs if (base / d).is_symlink())]:
            path = base / name
            found[str(PurePosixPath(path.relative_to(root)))] = _signature(path)
    return found


def _signature(path: Path) -> Signature:
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode):
        return "link", os.readlink(path)
    if stat.S_ISREG(info.st_mode):
        executable = "x" if info.st_mode & 0o111 else "-"
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        return "file", f"{executable}{digest}"
    return "special", oct(stat.S_IFMT(info.st_mode))


def _replace(target: Path, source: Path) -> None:
    if target.is_symlink() or (os.path.lexists(target) and not target.is_dir()):
        target.unlink()
    elif target.exists():
        shutil.rmtree(target)
    if source.is_symlink():
        os.symlink(os.readlink(source), target)
    elif source.is_dir():
        shutil.copytree(source, target, symlinks=True)
    elif source.exists():
        shutil.copy2(source, target)
