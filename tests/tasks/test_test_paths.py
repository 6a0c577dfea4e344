"""Reverting ``test_paths`` on real directory trees: edits, deletions, additions, links, and
parents the agent replaced, without ever touching what a link points at."""

from __future__ import annotations

import os
from pathlib import Path

from tasks.events import DefenseKind
from tasks.test_paths import revert_test_paths


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def _contents(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): ("-> " + os.readlink(p) if p.is_symlink() else p.read_text())
        for p in sorted(root.rglob("*"))
        if p.is_symlink() or p.is_file()
    }


BASE = {
    "src/mod.py": "X = 1\n",
    "tests/test_a.py": "def test_a(): pass\n",
    "tests/unit/test_b.py": "def test_b(): pass\n",
}


def test_an_untouched_tree_has_no_event(tmp_path: Path) -> None:
    image = _tree(tmp_path / "image", BASE)
    tree = _tree(tmp_path / "tree", {**BASE, "src/mod.py": "X = 2\n"})
    assert revert_test_paths(tree, image, ("tests",)) == []
    assert _contents(tree)["src/mod.py"] == "X = 2\n"  # outside test_paths: the agent's


def test_edits_deletions_and_additions_are_undone_and_named(tmp_path: Path) -> None:
    image = _tree(tmp_path / "image", BASE)
    tree = _tree(
        tmp_path / "tree",
        {
            "src/mod.py": "X = 2\n",
            "tests/test_a.py": "def test_a(): assert True\n",
            "tests/conftest.py": "# forces passes\n",
            "tests/unit/new/test_c.py": "def test_c(): pass\n",
        },
    )
    events = revert_test_paths(tree, image, ("tests",))
    assert [(e.kind, e.items) for e in events] == [
        (DefenseKind.TEST_PATH_REVERTED, ("tests/test_a.py", "tests/unit/test_b.py")),
        (DefenseKind.TEST_FILE_REMOVED, ("tests/conftest.py", "tests/unit/new/test_c.py")),
    ]
    assert _contents(tree) == {**BASE, "src/mod.py": "X = 2\n"}


def test_an_executable_bit_is_an_edit(tmp_path: Path) -> None:
    image = _tree(tmp_path / "image", BASE)
    tree = _tree(tmp_path / "tree", BASE)
    (tree / "tests" / "test_a.py").chmod(0o755)
    [event] = revert_test_paths(tree, image, ("tests/test_a.py",))
    assert event.items == ("tests/test_a.py",)
    assert not os.access(tree / "tests" / "test_a.py", os.X_OK)


def test_a_link_out_of_the_tree_is_replaced_and_its_target_left_alone(tmp_path: Path) -> None:
    image = _tree(tmp_path / "image", BASE)
    outside = _tree(tmp_path / "outside", {"test_a.py": "host file\n", "unit/test_b.py": "host\n"})
    tree = _tree(tmp_path / "tree", {"src/mod.py": "X = 1\n"})
    (tree / "tests").symlink_to(outside)
    events = revert_test_paths(tree, image, ("tests/unit",))
    assert events[0].kind is DefenseKind.TEST_PATH_REVERTED
    assert "tests" in events[0].items  # the parent link itself
    assert not (tree / "tests").is_symlink()
    assert (tree / "tests" / "unit" / "test_b.py").read_text() == BASE["tests/unit/test_b.py"]
    assert _contents(outside) == {"test_a.py": "host file\n", "unit/test_b.py": "host\n"}


def test_a_file_swapped_for_a_link_is_restored(tmp_path: Path) -> None:
    image = _tree(tmp_path / "image", BASE)
    tree = _tree(tmp_path / "tree", BASE)
    (tree / "tests" / "test_a.py").unlink()
    (tree / "tests" / "test_a.py").symlink_to("/etc/hostname")
    [event] = revert_test_paths(tree, image, ("tests",))
    assert (event.kind, event.items) == (DefenseKind.TEST_PATH_REVERTED, ("tests/test_a.py",))
    assert _contents(tree) == BASE


def test_a_test_path_the_base_lacks_is_emptied(tmp_path: Path) -> None:
    image = _tree(tmp_path / "image", BASE)
    tree = _tree(tmp_path / "tree", {**BASE, "tests/integration/test_x.py": "x\n"})
    [event] = revert_test_paths(tree, image, ("tests/integration",))
    assert (event.kind, event.items) == (
        DefenseKind.TEST_FILE_REMOVED,
        ("tests/integration/test_x.py",),
    )
    assert not (tree / "tests" / "integration").exists()
