"""The grader: the agent's changes, judged by tests it never saw, in a sandbox it never had.

``grade(task, image, agent, sandbox)`` -> ``GradeResult``. In order:

1. the agent's final tree is read through its overlay (``agent``: the image's workspace
   under the agent's ``upper``) in a ``Network.NONE`` sandbox and copied out WITHOUT any
   ``.git``: whatever the agent committed, reset, rewrote or deleted in git is ignored;
2. every edit under ``test_paths`` is reverted to ``base_commit`` and every new file there
   removed (``test_path_reverted`` / ``test_file_removed`` events, with the paths);
3. the real history is restored: a fresh clone of the image's ``history``, ``HEAD`` at
   ``base_commit``, the index at its tree, so the work tree shows the agent's changes;
4. ``tests.patch`` is applied (it does not apply -> ``grader_error``);
5. ``test_command`` (``{tests}``: the files ``tests.patch`` touches) runs in a fresh
   ``Network.NONE`` sandbox, as the unprivileged user, with the image's toolchain, a
   deterministic environment (``TZ=UTC``, ``PYTHONHASHSEED=0``, ...) and
   ``grade_timeout_s`` (overrun -> ``grader_error``);
6. the log is read by SWE-bench's pytest parser and judged by its rule (``tasks.
   swebench_rules``): reward 1.0 iff every ``fail_to_pass`` test passes and every
   ``pass_to_pass`` test passes (or is skipped), else 0.0. A log with no test result in
   it (a broken ``test_command``) is a ``grader_error``, never a zero.

A ``grader_error`` has ``reward=None``: the trial is excluded from optimization. The
result's ``events`` are the grader's own; the image's (``TaskImage.events``: the hidden
history, the withheld tests) belong to the same trial and are the caller's to add.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from kernel.errors import SandboxError
from sandbox.spec import Sandbox, Workspace
from tasks.events import DefenseEvent
from tasks.git import GitFailed, git
from tasks.images import TaskImage
from tasks.sandboxing import WORKSPACE_TARGET, give_to_sandbox_user, none_spec
from tasks.spec import Task
from tasks.swebench_rules import Rules, load_rules
from tasks.test_paths import revert_test_paths
from tasks.workspaces import final_tree

DETERMINISTIC_ENV = {
    "TZ": "UTC",
    "PYTHONHASHSEED": "0",
    "LC_ALL": "C.UTF-8",
    "LANG": "C.UTF-8",
    "HOME": "/tmp",
    "SOURCE_DATE_EPOCH": "946684800",
    "PY_COLORS": "0",
    "NO_COLOR": "1",
}
_LOG_TAIL = 4000


class GradeTermination(StrEnum):
    COMPLETED = "completed"
    GRADER_ERROR = "grader_error"


class Expectation(StrEnum):
    FAIL_TO_PASS = "fail_to_pass"
    PASS_TO_PASS = "pass_to_pass"


@dataclass(frozen=True, slots=True)
class TestResult:
    test_id: str
    expected: Expectation
    status: str | None  # as the log says it (PASSED, FAILED, ...); None: not in the log
    passed: bool  # by SWE-bench's rule for its kind


@dataclass(frozen=True, slots=True)
class GradeResult:
    termination: GradeTermination
    reward: float | None  # None exactly when termination is grader_error
    tests: tuple[TestResult, ...]
    events: tuple[DefenseEvent, ...]
    detail: str
    log_tail: str = ""


class _GraderError(Exception):
    """A step that makes the grade a ``grader_error`` (caught in ``grade``, never escapes)."""

    def __init__(self, detail: str, *, log_tail: str = "") -> None:
        super().__init__(detail)
        self.detail = detail
        self.log_tail = log_tail


def grade(
    task: Task,
    image: TaskImage,
    agent: Workspace,
    sandbox: Sandbox,
    *,
    work_dir: Path | None = None,
    rules: Rules | None = None,
) -> GradeResult:
    rules = rules or load_rules()
    scratch = Path(tempfile.mkdtemp(prefix=f"lego-grade-{task.id}-", dir=work_dir))
    events: list[DefenseEvent] = []
    try:
        tree = scratch / "tree"
        try:
            final_tree(agent, image, sandbox, tree, task.grade_timeout_s)
        except SandboxError as exc:
            raise _GraderError(exc.message) from exc
        events += revert_test_paths(tree, image.workspace, task.test_paths)
        _restore_history(image, scratch, tree)
        try:
            git(tree, "apply", "--whitespace=nowarn", str(task.tests_patch))
        except GitFailed as exc:
            raise _GraderError(f"tests.patch does not apply: {exc.stderr}") from exc
        return _run_tests(task, image, sandbox, rules, scratch, tree, events)
    except _GraderError as exc:
        return GradeResult(
            GradeTermination.GRADER_ERROR, None, (), tuple(events), exc.detail, exc.log_tail
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _restore_history(image: TaskImage, scratch: Path, tree: Path) -> None:
    clone = scratch / "history"
    try:
        git(
            scratch,
            "clone",
            "--quiet",
            "--no-checkout",
            "--no-hardlinks",
            str(image.history),
            str(clone),
        )
        os.rename(clone / ".git", tree / ".git")
        git(tree, "update-ref", "--no-deref", "HEAD", image.base_commit)
        git(tree, "read-tree", image.base_commit)
    except GitFailed as exc:
        raise _GraderError(f"the real history could not be restored: {exc.stderr}") from exc


def _run_tests(
    task: Task,
    image: TaskImage,
    sandbox: Sandbox,
    rules: Rules,
    scratch: Path,
    tree: Path,
    events: list[DefenseEvent],
) -> GradeResult:
    upper, work = scratch / "upper", scratch / "work"
    upper.mkdir()
    work.mkdir()
    give_to_sandbox_user(scratch)
    spec = none_spec(
        f"grade-{task.id}",
        mounts=image.mounts,
        env={**image.env, **DETERMINISTIC_ENV},
        timeout_s=task.grade_timeout_s,
        workspace=Workspace(lower=tree, upper=upper, work=work, target=WORKSPACE_TARGET),
    )
    try:
        result = sandbox.run(spec, ["sh", "-c", task.command_for(image.tests)])
    except SandboxError as exc:
        raise _GraderError(f"no sandbox for the test command: {exc.message}") from exc
    log = f"{result.stdout}\n{result.stderr}"
    tail = log.strip()[-_LOG_TAIL:]
    if result.timed_out:
        raise _GraderError(
            f"test_command ran past grade_timeout_s ({task.grade_timeout_s:g} s)", log_tail=tail
        )
    statuses = rules.parse(log)
    if not statuses:
        raise _GraderError(
            f"no test result in the test command's log (exit {result.returncode}): {tail[-500:]}",
            log_tail=tail,
        )
    tests = tuple(
        TestResult(
            test_id,
            kind,
            statuses.get(test_id),
            rules.passed(test_id, statuses, skip_ok=kind is Expectation.PASS_TO_PASS),
        )
        for kind, ids in (
            (Expectation.FAIL_TO_PASS, task.fail_to_pass),
            (Expectation.PASS_TO_PASS, task.pass_to_pass),
        )
        for test_id in ids
    )
    resolved = rules.resolved(statuses, task.fail_to_pass, task.pass_to_pass)
    failing = [t.test_id for t in tests if not t.passed]
    detail = (
        f"resolved: all {len(tests)} graded tests pass"
        if resolved
        else f"not resolved: {len(failing)} of {len(tests)} graded tests fail: {', '.join(failing)}"
    )
    return GradeResult(
        GradeTermination.COMPLETED, 1.0 if resolved else 0.0, tests, tuple(events), detail, tail
    )
