"""SWE-bench import: instances in swebench's schema, made from a generated repository, become
a pool whose tasks validate; bad instances are refused with the line and the field."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kernel.errors import TaskError
from sandbox.bwrap import Bwrap
from tasks.generated import FAIL_TO_PASS, INSTRUCTION, PASS_TO_PASS, make_task
from tasks.pool import load_pool
from tasks.swebench_import import import_instances
from tasks.validate import Verdict, validate_pool

ROOT = Path(__file__).resolve().parents[2]


def _instance(source: Path, instance_id: str) -> dict[str, object]:
    """What a SWE-bench dataset row for the generated task looks like."""
    spec = json.loads((source / "task.json").read_text())
    return {
        "instance_id": instance_id,
        "repo": "calc-org/calc",
        "base_commit": spec["base_commit"],
        "patch": (source / "solution.patch").read_text(),
        "test_patch": (source / "tests.patch").read_text(),
        "problem_statement": INSTRUCTION,
        "hints_text": "",
        "created_at": "2024-01-03T00:00:00Z",
        "version": "0.2",
        "environment_setup_commit": spec["base_commit"],
        "FAIL_TO_PASS": json.dumps(list(FAIL_TO_PASS)),  # JSON text, as the datasets have it
        "PASS_TO_PASS": json.dumps(list(PASS_TO_PASS)),
    }


@pytest.fixture
def generated(tmp_path: Path) -> tuple[Path, Path]:
    """(the repos directory holding calc-org__calc, the generated task it came from)."""
    source = make_task(tmp_path / "generated", "calc", variant="no_setup")
    repos = tmp_path / "repos"
    repos.mkdir()
    subprocess.run(
        ["git", "clone", "-q", str(source / "repo"), str(repos / "calc-org__calc")], check=True
    )
    return repos, source


def _write_instances(path: Path, *rows: dict[str, object] | str) -> Path:
    path.write_text(
        "".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows)
    )
    return path


def test_imported_instances_are_tasks_that_validate(
    generated: tuple[Path, Path], tmp_path: Path, bwrap: Bwrap
) -> None:
    repos, source = generated
    instances = _write_instances(
        tmp_path / "instances.jsonl",
        _instance(source, "calc-org__calc-1"),
        _instance(source, "calc-org__calc-2"),
    )
    written = import_instances(instances, repos=repos, out=tmp_path / "pool")
    assert [path.name for path in written] == ["calc-org__calc-1", "calc-org__calc-2"]
    pool = load_pool(tmp_path / "pool")
    assert pool.invalid == ()
    task = pool.tasks[0]
    assert task.instruction == INSTRUCTION
    assert task.fail_to_pass == FAIL_TO_PASS
    assert task.pass_to_pass == PASS_TO_PASS
    assert task.test_paths == ("tests/test_ops.py",)
    assert task.test_command == "python -m pytest -q -rA {tests}"
    assert task.solution_patch.read_text() == (source / "solution.patch").read_text()
    verdicts = validate_pool(pool, tmp_path / "cache", bwrap)
    assert [(v.task_id, v.verdict) for v in verdicts] == [
        ("calc-org__calc-1", Verdict.VALID),
        ("calc-org__calc-2", Verdict.VALID),
    ]


def test_the_command_imports_and_reports(generated: tuple[Path, Path], tmp_path: Path) -> None:
    repos, source = generated
    instances = _write_instances(tmp_path / "i.jsonl", _instance(source, "calc-org__calc-7"))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "cli.main",
            "tasks",
            "import-swebench",
            str(instances),
            "--repos",
            str(repos),
            "--out",
            str(tmp_path / "pool"),
            "--test-command",
            "python -m pytest -q -rA -p no:cacheprovider {tests}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert lines == [
        {"task": "calc-org__calc-7", "path": str(tmp_path / "pool" / "calc-org__calc-7")},
        {"summary": {"imported": 1}},
    ]
    [task] = load_pool(tmp_path / "pool").tasks
    assert task.test_command == "python -m pytest -q -rA -p no:cacheprovider {tests}"


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (
            {"FAIL_TO_PASS": "[not json"},
            r"^instances line 2: FAIL_TO_PASS: not a JSON-encoded list",
        ),
        ({"base_commit": "0" * 40}, r"line 2 \(calc-org__calc-2\): base_commit: 0{40} is not in"),
        (
            {"repo": "other/repo"},
            r"line 2 \(calc-org__calc-2\): repo: no local clone of other/repo",
        ),
        (
            {"instance_id": "../escape"},
            r"line 2 \(\.\./escape\): id: '\.\./escape' is not a task id",
        ),
        ({"FAIL_TO_PASS": "[]"}, r"fail_to_pass: List should have at least 1 item"),
        ({"patch": None}, r"line 2: patch: Field required"),
    ],
)
def test_a_bad_instance_is_refused_before_anything_is_written(
    generated: tuple[Path, Path], tmp_path: Path, edit: dict[str, object], reason: str
) -> None:
    repos, source = generated
    bad = {**_instance(source, "calc-org__calc-2"), **edit}
    bad = {key: value for key, value in bad.items() if value is not None}
    instances = _write_instances(tmp_path / "i.jsonl", _instance(source, "calc-org__calc-1"), bad)
    with pytest.raises(TaskError, match=reason):
        import_instances(instances, repos=repos, out=tmp_path / "pool")
    assert not (tmp_path / "pool").exists()


def test_an_existing_task_is_never_overwritten(
    generated: tuple[Path, Path], tmp_path: Path
) -> None:
    repos, source = generated
    (tmp_path / "pool" / "calc-org__calc-1").mkdir(parents=True)
    instances = _write_instances(tmp_path / "i.jsonl", _instance(source, "calc-org__calc-1"))
    with pytest.raises(TaskError, match="already exists"):
        import_instances(instances, repos=repos, out=tmp_path / "pool")
    assert list((tmp_path / "pool" / "calc-org__calc-1").iterdir()) == []


def test_a_malformed_line_names_its_number(generated: tuple[Path, Path], tmp_path: Path) -> None:
    repos, _ = generated
    instances = _write_instances(tmp_path / "i.jsonl", "", "{broken")
    with pytest.raises(TaskError, match=r"^instances line 2: \(document\): Invalid JSON"):
        import_instances(instances, repos=repos, out=tmp_path / "pool")
