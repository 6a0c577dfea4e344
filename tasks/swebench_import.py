"""SWE-bench instances -> a task pool, given local clones of their repositories.

An instance is one JSON line in the ``swebench`` package's schema (``SWEbenchInstance``):
``instance_id``, ``repo`` (``owner/name``), ``base_commit``, ``patch`` (the reference fix),
``test_patch``, ``FAIL_TO_PASS`` / ``PASS_TO_PASS`` (JSON-encoded lists in the published
datasets; plain lists are taken too), ``problem_statement``; the other fields (``version``,
``environment_setup_commit``, ``hints_text``, ...) are ignored. Its repository is cloned
from ``REPOS/<owner>__<name>`` (SWE-bench's own spelling) or ``REPOS/<owner>/<name>``.

``import_instances(path, repos=, out=)`` writes ``OUT/<instance_id>/``: ``task.json`` (the
problem statement as the instruction, ``test_paths`` = every file the test patch names),
``solution.patch``, ``tests.patch`` and ``repo/`` (a clone that holds ``base_commit``).
Every instance is checked before anything is written; a bad line is a ``TaskError``
naming its line and field, and an existing task directory is never overwritten.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError

from kernel.errors import TaskError
from tasks.git import GitFailed, git
from tasks.patches import touched_paths
from tasks.spec import SOLUTION_PATCH, TASK_FILE, TESTS_PATCH, TaskFile, describe_errors

DEFAULT_TEST_COMMAND = "python -m pytest -q -rA {tests}"


def _json_list(value: object) -> object:
    """The datasets store the test lists as JSON text: ``'["a::b", "c::d"]'``."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not a JSON-encoded list: {exc}") from exc
    return value


TestIds = Annotated[list[str], BeforeValidator(_json_list)]


class SWEbenchInstance(BaseModel):
    """The fields of ``swebench.SWEbenchInstance`` a task needs (the rest are ignored)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    instance_id: str
    repo: str
    base_commit: str
    patch: str
    test_patch: str
    problem_statement: str
    FAIL_TO_PASS: TestIds
    PASS_TO_PASS: TestIds


@dataclass(frozen=True, slots=True)
class _Planned:
    instance: SWEbenchInstance
    clone: Path
    spec: TaskFile


def import_instances(
    instances: Path,
    *,
    repos: Path,
    out: Path,
    test_command: str | None = None,
    setup_command: str | None = None,
) -> list[Path]:
    planned = [
        _plan(line_no, line, repos, out, test_command or DEFAULT_TEST_COMMAND, setup_command)
        for line_no, line in enumerate(_lines(instances), start=1)
        if line.strip()
    ]
    seen: set[str] = set()
    for plan in planned:
        if plan.spec.id in seen:
            raise TaskError(f"{instances}: instance {plan.spec.id} appears twice")
        seen.add(plan.spec.id)
    return [_write(plan, out) for plan in planned]


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except OSError as exc:
        raise TaskError(f"cannot read {path}: {exc.strerror}") from exc


def _plan(
    line_no: int, line: str, repos: Path, out: Path, test_command: str, setup: str | None
) -> _Planned:
    where = f"instances line {line_no}"
    try:
        instance = SWEbenchInstance.model_validate_json(line)
    except ValidationError as exc:
        raise TaskError(f"{where}: {describe_errors(exc)}") from exc
    where = f"{where} ({instance.instance_id})"
    clone = _clone_of(instance.repo, repos)
    if clone is None:
        raise TaskError(
            f"{where}: repo: no local clone of {instance.repo} in {repos} "
            f"(looked for {instance.repo.replace('/', '__')} and {instance.repo})"
        )
    try:
        git(clone, "cat-file", "-e", f"{instance.base_commit}^{{commit}}")
    except GitFailed as exc:
        raise TaskError(f"{where}: base_commit: {instance.base_commit} is not in {clone}") from exc
    if (out / instance.instance_id).exists():
        raise TaskError(f"{where}: {out / instance.instance_id} already exists")
    try:
        test_paths = touched_paths(instance.test_patch)
        spec = TaskFile(
            id=instance.instance_id,
            instruction=instance.problem_statement,
            repo="repo",
            base_commit=instance.base_commit,
            test_command=test_command,
            fail_to_pass=instance.FAIL_TO_PASS,
            pass_to_pass=instance.PASS_TO_PASS,
            test_paths=test_paths,
            setup_command=setup,
        )
    except ValidationError as exc:
        raise TaskError(f"{where}: {describe_errors(exc)}") from exc
    except TaskError as exc:
        raise TaskError(f"{where}: test_patch: {exc.message}") from exc
    return _Planned(instance=instance, clone=clone, spec=spec)


def _clone_of(repo: str, repos: Path) -> Path | None:
    for candidate in (repos / repo.replace("/", "__"), repos / repo):
        if (candidate / ".git").exists():
            return candidate
    return None


def _write(plan: _Planned, out: Path) -> Path:
    root = out / plan.spec.id
    stage = out / f".import-{plan.spec.id}"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    try:
        git(stage, "clone", "--quiet", "--no-checkout", str(plan.clone), str(stage / "repo"))
        try:
            git(stage / "repo", "cat-file", "-e", f"{plan.spec.base_commit}^{{commit}}")
        except GitFailed as exc:
            raise TaskError(
                f"instance {plan.spec.id}: base_commit {plan.spec.base_commit} is on no branch "
                f"or tag of {plan.clone}, so a clone does not hold it"
            ) from exc
        (stage / SOLUTION_PATCH).write_text(plan.instance.patch)
        (stage / TESTS_PATCH).write_text(plan.instance.test_patch)
        (stage / TASK_FILE).write_text(plan.spec.model_dump_json(indent=2) + "\n")
        stage.rename(root)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return root
