"""One task directory, ``POOL/<task_id>/``: the ``task.json`` format and the loaded ``Task``.

    POOL/<task_id>/task.json       the fields below (strict: unknown keys, wrong types fail)
    POOL/<task_id>/solution.patch  the reference fix (never shown to the agent)
    POOL/<task_id>/tests.patch     the tests added for grading (withheld until grading)
    POOL/<task_id>/<repo>/         a git repository; the agent starts at ``base_commit``

``task.json``: ``id`` (the directory's name), ``instruction`` (the harness's prompt),
``repo`` (a subdirectory), ``base_commit`` (default ``HEAD``), ``test_command`` (run at the
repository root at grading; ``{tests}`` becomes the shell-quoted files ``tests.patch``
touches), ``fail_to_pass`` and ``pass_to_pass`` (test ids as the test log names them,
SWE-bench's meaning), ``test_paths`` (files and folders only the grader may change),
``setup_command`` (optional, run once when the image is built), ``agent_timeout_s``,
``grade_timeout_s``.

``load_task(directory)`` returns a frozen ``Task`` with resolved paths, or raises a
``TaskError`` naming the task and the field.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from kernel.errors import TaskError

TASK_FILE = "task.json"
SOLUTION_PATCH = "solution.patch"
TESTS_PATCH = "tests.patch"
TESTS_PLACEHOLDER = "{tests}"
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


def _relative(value: str) -> str:
    """A path inside the repository: relative, normalised, never climbing out of it."""
    path = PurePosixPath(value)
    if not value or path.is_absolute() or ".." in path.parts or str(path) == ".":
        raise ValueError(f"{value!r} must be a relative path inside the repository")
    if path.parts[0] == ".git":
        raise ValueError(f"{value!r} is inside .git, which no task owns")
    return str(path)


def _task_id(value: str) -> str:
    if not _ID.match(value):
        raise ValueError(f"{value!r} is not a task id (letters, digits, '.', '_', '-')")
    return value


RelativePath = Annotated[str, AfterValidator(_relative)]
NonEmpty = Annotated[str, Field(min_length=1)]


class TaskFile(BaseModel):
    """``task.json`` as written on disk."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    id: Annotated[str, AfterValidator(_task_id)]
    instruction: NonEmpty
    repo: RelativePath
    base_commit: NonEmpty = "HEAD"
    test_command: NonEmpty
    fail_to_pass: Annotated[list[NonEmpty], Field(min_length=1)]
    pass_to_pass: list[NonEmpty] = []
    test_paths: Annotated[list[RelativePath], Field(min_length=1)]
    setup_command: NonEmpty | None = None
    agent_timeout_s: Annotated[float, Field(gt=0)] = 1800.0
    grade_timeout_s: Annotated[float, Field(gt=0)] = 600.0


@dataclass(frozen=True, slots=True)
class Task:
    id: str
    root: Path  # the task directory
    instruction: str
    repo: Path
    base_commit: str  # as task.json says it (a sha, a branch, HEAD); images resolve it
    test_command: str
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    test_paths: tuple[str, ...]
    setup_command: str | None
    agent_timeout_s: float
    grade_timeout_s: float

    @property
    def task_file(self) -> Path:
        return self.root / TASK_FILE

    @property
    def solution_patch(self) -> Path:
        return self.root / SOLUTION_PATCH

    @property
    def tests_patch(self) -> Path:
        return self.root / TESTS_PATCH

    def owns(self, path: str) -> bool:
        """Whether ``path`` (a repository path) is under one of the ``test_paths``."""
        parts = PurePosixPath(path).parts
        return any(
            parts[: len(PurePosixPath(t).parts)] == PurePosixPath(t).parts for t in self.test_paths
        )

    def command_for(self, tests: Sequence[str]) -> str:
        """The test command with ``{tests}`` filled in."""
        return self.test_command.replace(TESTS_PLACEHOLDER, shlex.join(tests))


def load_task(directory: Path) -> Task:
    """The task in ``directory``; a ``TaskError`` naming the task and the field if not."""
    name = directory.name
    path = directory / TASK_FILE
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TaskError(f"task {name}: cannot read {TASK_FILE}: {exc.strerror}") from exc
    try:
        spec = TaskFile.model_validate_json(raw)
    except ValidationError as exc:
        raise TaskError(f"task {name}: {TASK_FILE}: {describe_errors(exc)}") from exc
    if spec.id != name:
        raise TaskError(f"task {name}: {TASK_FILE}: id: {spec.id!r} is not the directory's name")
    root = directory.resolve()
    repo = root / spec.repo
    if not (repo / ".git").exists():
        raise TaskError(f"task {name}: {TASK_FILE}: repo: {spec.repo!r} is not a git repository")
    for patch in (SOLUTION_PATCH, TESTS_PATCH):
        if not (root / patch).is_file():
            raise TaskError(f"task {name}: {patch} is missing")
    return Task(
        id=spec.id,
        root=root,
        instruction=spec.instruction,
        repo=repo,
        base_commit=spec.base_commit,
        test_command=spec.test_command,
        fail_to_pass=tuple(spec.fail_to_pass),
        pass_to_pass=tuple(spec.pass_to_pass),
        test_paths=tuple(spec.test_paths),
        setup_command=spec.setup_command,
        agent_timeout_s=spec.agent_timeout_s,
        grade_timeout_s=spec.grade_timeout_s,
    )


def describe_errors(exc: ValidationError) -> str:
    problems = []
    for error in exc.errors(include_url=False):
        field = ".".join(str(part) for part in error["loc"]) or "(document)"
        problems.append(f"{field}: {str(error['msg']).removeprefix('Value error, ')}")
    return "; ".join(problems)
