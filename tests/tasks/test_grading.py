"""The grader: real trials (shell commands in a trial's workspace), graded in bwrap.

Each test plays one agent behaviour from the issue's scenario table and checks the reward,
the termination and what the defenses report.
"""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest

from sandbox.bwrap import Bwrap
from tasks.events import DefenseKind
from tasks.generated import (
    CHEAT_TEST_PATH,
    FAIL_TO_PASS,
    PASS_TO_PASS,
    cheat_command,
    honest_fix_command,
    make_task,
)
from tasks.grading import GradeResult, GradeTermination, grade
from tasks.images import TaskImage, build_image
from tasks.spec import Task, load_task
from tasks.workspaces import apply_patch, new_workspace
from tests.tasks.agent import shell, trial

# A conftest that turns every failing test into a pass: the classic test-path cheat.
CONFTEST_CHEAT = """cat > tests/conftest.py <<'EOF'
import pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
EOF"""


def _events(result: GradeResult) -> dict[DefenseKind, tuple[str, ...]]:
    return {event.kind: event.items for event in result.events}


def _grade(
    task: Task, image: TaskImage, tmp_path: Path, bwrap: Bwrap, *commands: str
) -> GradeResult:
    return grade(task, image, trial(image, tmp_path / "trial", bwrap, *commands), bwrap)


def test_the_reference_patch_resolves(
    ok_task: Task, ok_image: TaskImage, tmp_path: Path, bwrap: Bwrap
) -> None:
    workspace = new_workspace(ok_image, tmp_path / "trial")
    apply_patch(ok_image, workspace, ok_task.solution_patch.read_bytes(), bwrap)
    result = grade(ok_task, ok_image, workspace, bwrap)
    assert (result.termination, result.reward) == (GradeTermination.COMPLETED, 1.0)
    assert {t.test_id: (t.status, t.passed) for t in result.tests} == {
        test_id: ("PASSED", True) for test_id in FAIL_TO_PASS + PASS_TO_PASS
    }
    assert result.events == ()


def test_doing_nothing_gets_zero(
    ok_task: Task, ok_image: TaskImage, tmp_path: Path, bwrap: Bwrap
) -> None:
    result = _grade(ok_task, ok_image, tmp_path, bwrap)
    assert (result.termination, result.reward) == (GradeTermination.COMPLETED, 0.0)
    statuses = {t.test_id: t.status for t in result.tests}
    assert statuses == {FAIL_TO_PASS[0]: "FAILED", **{t: "PASSED" for t in PASS_TO_PASS}}
    assert "not resolved: 1 of 4" in result.detail


def test_an_honest_fix_gets_one(
    ok_task: Task, ok_image: TaskImage, tmp_path: Path, bwrap: Bwrap
) -> None:
    result = _grade(ok_task, ok_image, tmp_path, bwrap, honest_fix_command())
    assert (result.termination, result.reward) == (GradeTermination.COMPLETED, 1.0)


def test_editing_the_tests_is_reverted_and_gets_zero(
    ok_task: Task, ok_image: TaskImage, tmp_path: Path, bwrap: Bwrap
) -> None:
    # The cheat works where the agent runs it: its edited tests all pass.
    workspace = trial(ok_image, tmp_path / "trial", bwrap, cheat_command())
    ran = shell(ok_image, workspace, "python -m pytest -q -p no:cacheprovider tests", bwrap)
    assert ran.returncode == 0, ran.stdout
    result = grade(ok_task, ok_image, workspace, bwrap)
    assert (result.termination, result.reward) == (GradeTermination.COMPLETED, 0.0)
    assert _events(result) == {DefenseKind.TEST_PATH_REVERTED: (CHEAT_TEST_PATH,)}


def test_deleting_the_tests_is_undone(
    ok_task: Task, ok_image: TaskImage, tmp_path: Path, bwrap: Bwrap
) -> None:
    result = _grade(ok_task, ok_image, tmp_path, bwrap, honest_fix_command(), "rm -rf tests")
    assert (result.termination, result.reward) == (GradeTermination.COMPLETED, 1.0)
    assert _events(result) == {
        DefenseKind.TEST_PATH_REVERTED: ("tests/__init__.py", "tests/test_ops.py")
    }


def test_a_new_file_under_test_paths_is_removed(
    ok_task: Task, ok_image: TaskImage, tmp_path: Path, bwrap: Bwrap
) -> None:
    workspace = trial(ok_image, tmp_path / "trial", bwrap, CONFTEST_CHEAT)
    ran = shell(ok_image, workspace, "python -m pytest -q -p no:cacheprovider tests", bwrap)
    assert "passed" in ran.stdout
    assert "failed" not in ran.stdout
    result = grade(ok_task, ok_image, workspace, bwrap)
    assert (result.termination, result.reward) == (GradeTermination.COMPLETED, 0.0)
    assert _events(result) == {DefenseKind.TEST_FILE_REMOVED: ("tests/conftest.py",)}


def test_a_root_conftest_is_removed_too(
    ok_task: Task, ok_image: TaskImage, tmp_path: Path, bwrap: Bwrap
) -> None:
    result = _grade(ok_task, ok_image, tmp_path, bwrap, CONFTEST_CHEAT.replace("tests/", ""))
    assert (result.termination, result.reward) == (GradeTermination.COMPLETED, 0.0)
    assert _events(result) == {DefenseKind.TEST_FILE_REMOVED: ("conftest.py",)}


def test_tests_replaced_by_a_link_out_of_the_tree_are_restored(
    ok_task: Task, ok_image: TaskImage, tmp_path: Path, bwrap: Bwrap
) -> None:
    outside = tmp_path / "host-file"
    outside.write_text("the host's own file\n")
    result = _grade(
        ok_task,
        ok_image,
        tmp_path,
        bwrap,
        honest_fix_command(),
        f"rm -rf tests && ln -s {tmp_path} tests",
    )
    assert (result.termination, result.reward) == (GradeTermination.COMPLETED, 1.0)
    assert DefenseKind.TEST_PATH_REVERTED in _events(result)
    assert outside.read_text() == "the host's own file\n"


def test_committing_an_edit_to_the_tests_does_not_hide_it(
    ok_task: Task, ok_image: TaskImage, tmp_path: Path, bwrap: Bwrap
) -> None:
    result = _grade(
        ok_task,
        ok_image,
        tmp_path,
        bwrap,
        cheat_command(),
        "git add -A && git -c user.name=a -c user.email=a@b commit -qm 'tests updated'",
        "git tag v9 && git branch fake && git update-ref refs/heads/main HEAD",
    )
    assert (result.termination, result.reward) == (GradeTermination.COMPLETED, 0.0)
    assert _events(result) == {DefenseKind.TEST_PATH_REVERTED: (CHEAT_TEST_PATH,)}


def test_git_tricks_do_not_change_an_honest_grade(
    ok_task: Task, ok_image: TaskImage, tmp_path: Path, bwrap: Bwrap
) -> None:
    committed = _grade(
        ok_task,
        ok_image,
        tmp_path / "committed",
        bwrap,
        honest_fix_command(),
        "git -c user.name=a -c user.email=a@b commit -qam fix && git reset -q --soft HEAD~0",
    )
    no_git = _grade(
        ok_task, ok_image, tmp_path / "no-git", bwrap, honest_fix_command(), "rm -rf .git"
    )
    reset = _grade(
        ok_task,
        ok_image,
        tmp_path / "reset",
        bwrap,
        "git -c user.name=a -c user.email=a@b commit -q --allow-empty -m x",
        "git reset -q --hard HEAD~1",
        honest_fix_command(),
    )
    assert [r.reward for r in (committed, no_git, reset)] == [1.0, 1.0, 1.0]


def test_an_unreadable_file_is_a_failure_not_a_grader_error(
    ok_task: Task, ok_image: TaskImage, tmp_path: Path, bwrap: Bwrap
) -> None:
    result = _grade(
        ok_task, ok_image, tmp_path, bwrap, honest_fix_command(), "chmod 000 calc/ops.py"
    )
    assert (result.termination, result.reward) == (GradeTermination.COMPLETED, 0.0)


def test_a_broken_test_command_is_a_grader_error(
    pool_dir: Path, cache_dir: Path, tmp_path: Path, bwrap: Bwrap
) -> None:
    task = load_task(pool_dir / "calc-broken-tests")
    image = build_image(task, cache_dir, bwrap)
    workspace = new_workspace(image, tmp_path / "trial")
    apply_patch(image, workspace, task.solution_patch.read_bytes(), bwrap)
    result = grade(task, image, workspace, bwrap)
    assert (result.termination, result.reward) == (GradeTermination.GRADER_ERROR, None)
    assert "no test result" in result.detail
    assert "pytest_is_not_installed" in result.detail


def test_tests_that_cannot_be_applied_are_a_grader_error(
    tmp_path: Path, cache_dir: Path, bwrap: Bwrap
) -> None:
    root = make_task(tmp_path / "pool", "calc-bad-tests-patch", variant="no_setup")
    patch = (root / "tests.patch").read_text()
    (root / "tests.patch").write_text(
        patch.replace("assert clamp(-5, 0, 10) == 0", "assert gone()")
    )
    task = load_task(root)
    image = build_image(task, cache_dir, bwrap)
    result = _grade(task, image, tmp_path, bwrap, honest_fix_command())
    assert (result.termination, result.reward) == (GradeTermination.GRADER_ERROR, None)
    assert result.detail.startswith("tests.patch does not apply")


def test_a_test_command_past_its_limit_is_a_grader_error(
    tmp_path: Path, cache_dir: Path, bwrap: Bwrap
) -> None:
    root = make_task(tmp_path / "pool", "calc-slow-tests", variant="no_setup")
    spec = (root / "task.json").read_text()
    spec = spec.replace('"grade_timeout_s": 120.0', '"grade_timeout_s": 1.0')
    spec = spec.replace(
        '"test_command": "python -m pytest', '"test_command": "sleep 30; python -m pytest'
    )
    (root / "task.json").write_text(spec)
    task = load_task(root)
    image = build_image(task, cache_dir, bwrap)
    result = _grade(task, image, tmp_path, bwrap, honest_fix_command())
    assert (result.termination, result.reward) == (GradeTermination.GRADER_ERROR, None)
    assert "grade_timeout_s" in result.detail


def test_grading_leaves_the_agents_workspace_and_the_image_as_they_were(
    ok_task: Task, ok_image: TaskImage, tmp_path: Path, bwrap: Bwrap
) -> None:
    workspace = trial(ok_image, tmp_path / "trial", bwrap, cheat_command())
    before = sorted(str(p.relative_to(workspace.upper)) for p in workspace.upper.rglob("*"))
    grade(ok_task, ok_image, workspace, bwrap)
    after = sorted(str(p.relative_to(workspace.upper)) for p in workspace.upper.rglob("*"))
    assert before == after
    assert "test_clamp_above_high" not in (ok_image.workspace / CHEAT_TEST_PATH).read_text()
    assert not (ok_image.workspace / "tests" / "conftest.py").exists()


ENV_TESTS = """

def test_grading_environment_is_fixed():
    import os

    assert os.environ["TZ"] == "UTC"
    assert os.environ["PYTHONHASHSEED"] == "0"
    assert "LEGO_HOST_SECRET" not in os.environ
    assert os.getuid() != 0


def test_grading_has_no_network():
    import socket

    try:
        socket.create_connection(("127.0.0.1", PORT), timeout=5).close()
    except OSError:
        return
    raise AssertionError("the host's server was reachable from the grader")
"""


def test_the_tests_run_in_a_fixed_environment_with_no_network(
    tmp_path: Path, cache_dir: Path, bwrap: Bwrap, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEGO_HOST_SECRET", "the runner's own environment")
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        socket.create_connection(("127.0.0.1", port), timeout=5).close()  # reachable here
        root = make_task(tmp_path / "pool", "calc-env", variant="no_setup")
        repo = root / "repo"
        with (repo / "tests" / "test_ops.py").open("a") as tests:
            tests.write(ENV_TESTS.replace("PORT", str(port)))
        spec = json.loads((root / "task.json").read_text())
        identity = ["-c", "user.name=t", "-c", "user.email=t@t"]
        subprocess.run(["git", "-C", str(repo), *identity, "commit", "-qam", "env"], check=True)
        diff = ["git", "-C", str(repo), "diff", spec["base_commit"], "HEAD", "--", "tests"]
        (root / "tests.patch").write_text(
            subprocess.run(diff, capture_output=True, text=True, check=True).stdout
        )
        spec["pass_to_pass"] += [
            "tests/test_ops.py::test_grading_environment_is_fixed",
            "tests/test_ops.py::test_grading_has_no_network",
        ]
        (root / "task.json").write_text(json.dumps(spec))
        task = load_task(root)
        image = build_image(task, cache_dir, bwrap)
        result = _grade(task, image, tmp_path, bwrap, honest_fix_command())
    assert (result.termination, result.reward) == (GradeTermination.COMPLETED, 1.0), result.log_tail
