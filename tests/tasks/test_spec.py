"""task.json and the pool: strict fields, reasons that name the task and the field, and one
bad task that never keeps the others out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernel.errors import TaskError
from tasks.generated import FAIL_TO_PASS, make_task
from tasks.pool import load_pool
from tasks.spec import load_task


def _edit(root: Path, **changes: object) -> None:
    spec = json.loads((root / "task.json").read_text())
    for key, value in changes.items():
        if value is None:
            del spec[key]
        else:
            spec[key] = value
    (root / "task.json").write_text(json.dumps(spec))


def test_a_generated_task_loads_with_resolved_paths(tmp_path: Path) -> None:
    root = make_task(tmp_path, "calc-1")
    task = load_task(root)
    assert task.id == "calc-1"
    assert task.repo == root.resolve() / "repo"
    assert task.solution_patch.is_file()
    assert task.fail_to_pass == FAIL_TO_PASS
    assert task.test_paths == ("tests", "conftest.py")
    assert task.owns("tests/test_ops.py")
    assert not task.owns("testsuite.py")
    assert not task.owns("calc/ops.py")


def test_the_test_command_gets_the_quoted_test_files(tmp_path: Path) -> None:
    task = load_task(make_task(tmp_path, "calc-1"))
    command = task.command_for(["tests/test_ops.py", "tests/it's here.py"])
    assert command == (
        "python -m pytest -q -rA -p no:cacheprovider tests/test_ops.py 'tests/it'\"'\"'s here.py'"
    )


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        (
            {"fail_to_pass": "tests/test_ops.py::test_x"},
            "fail_to_pass: Input should be a valid array",
        ),
        ({"fail_to_pass": []}, "fail_to_pass: List should have at least 1 item"),
        ({"test_paths": ["../outside"]}, "test_paths.0: '../outside' must be a relative path"),
        ({"test_paths": [".git/hooks"]}, "test_paths.0: '.git/hooks' is inside .git"),
        ({"repo": "/abs"}, "repo: '/abs' must be a relative path"),
        ({"grade_timeout_s": "600"}, "grade_timeout_s: Input should be a valid number"),
        ({"agent_timeout_s": 0}, "agent_timeout_s: Input should be greater than 0"),
        ({"test_command": None}, "test_command: Field required"),
        ({"timeout": 5}, "timeout: Extra inputs are not permitted"),
        ({"id": "another"}, "id: 'another' is not the directory's name"),
        ({"repo": "missing"}, "repo: 'missing' is not a git repository"),
    ],
)
def test_a_malformed_task_json_says_which_field(
    tmp_path: Path, changes: dict[str, object], reason: str
) -> None:
    root = make_task(tmp_path, "calc-bad")
    _edit(root, **changes)
    with pytest.raises(TaskError) as caught:
        load_task(root)
    assert caught.value.message.startswith("task calc-bad: ")
    assert reason in caught.value.message


def test_missing_files_are_named(tmp_path: Path) -> None:
    root = make_task(tmp_path, "calc-bad")
    (root / "tests.patch").unlink()
    with pytest.raises(TaskError, match=r"^task calc-bad: tests.patch is missing$"):
        load_task(root)
    (root / "task.json").write_text("{not json")
    with pytest.raises(TaskError, match=r"^task calc-bad: task.json: \(document\): Invalid JSON"):
        load_task(root)


def test_one_bad_task_never_blocks_the_others(tmp_path: Path) -> None:
    make_task(tmp_path, "a-good")
    (tmp_path / "b-broken").mkdir()
    (tmp_path / "b-broken" / "task.json").write_text('{"id": "b-broken", "instruction": 3}')
    make_task(tmp_path, "c-good")
    (tmp_path / ".cache").mkdir()  # hidden: a cache, not a task
    (tmp_path / "notes.txt").write_text("not a task\n")
    pool = load_pool(tmp_path)
    assert [task.id for task in pool.tasks] == ["a-good", "c-good"]
    assert [bad.task_id for bad in pool.invalid] == ["b-broken"]
    reason = pool.invalid[0].reason
    assert reason.startswith("task b-broken: task.json: ")
    assert "instruction: Input should be a valid string" in reason
    assert "repo: Field required" in reason


def test_a_pool_that_is_not_a_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match="is not a directory"):
        load_pool(tmp_path / "nowhere")
