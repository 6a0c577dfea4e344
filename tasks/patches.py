"""What a unified diff touches, read with ``unidiff`` (the parser SWE-bench itself uses).

``patch_files(text)`` lists the files a patch leaves in the tree (added or changed, in
the patch's order: the files a test command runs); ``touched_paths(text)`` every path it
names, deleted and renamed-from ones too (what SWE-bench import makes ``test_paths``).
A patch that does not parse is a ``TaskError``.
"""

from __future__ import annotations

from unidiff.errors import UnidiffParseError
from unidiff.patch import PatchSet

from kernel.errors import TaskError


def _parse(text: str) -> PatchSet:
    try:
        return PatchSet(text)
    except UnidiffParseError as exc:
        raise TaskError(f"not a unified diff: {exc}") from exc


def patch_files(text: str) -> list[str]:
    return [f.path for f in _parse(text) if not f.is_removed_file]


def touched_paths(text: str) -> list[str]:
    paths: list[str] = []
    for patched in _parse(text):
        for name in (patched.source_file, patched.target_file):
            path = name[2:] if name[:2] in ("a/", "b/") else name
            if name != "/dev/null" and path not in paths:
                paths.append(path)
    return paths
