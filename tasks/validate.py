"""Validation: a task enters rollouts only if its grader can tell a fix from no fix.

``validate_task(task, cache_dir, sandbox)`` builds the task's image (cached), then grades
two workspaces made the way a trial makes the agent's: one with ``solution.patch``
applied (it must resolve: reward 1.0) and one left as it is (the empty patch: it must
not, reward 0.0). The verdict:

- ``valid``;
- ``invalid`` with the reason (a malformed task, a reference fix that does not apply or
  does not pass, an empty patch that passes, a grader error on either);
- ``env_setup_failure`` with the reason (the image could not be built: its setup failed).

Verdicts are remembered in ``CACHE/validity/<task_id>-<key>.json`` under the image's key
(``task.json``, both patches, the base commit, the toolchain), so a second run reuses
them and an edited task is validated again. ``valid_tasks(pool, cache_dir)`` returns the
tasks whose remembered verdict for their current content is ``valid``: what rollouts run.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from kernel.errors import EnvSetupFailure, TaskError
from sandbox.spec import Sandbox
from tasks.grading import GradeResult, GradeTermination, grade
from tasks.images import build_image, image_key, resolve_base
from tasks.pool import Pool
from tasks.spec import Task
from tasks.swebench_rules import load_rules
from tasks.toolchain import ensure_toolchain
from tasks.workspaces import apply_patch, new_workspace

VALIDATION_FORMAT = "1"


class Verdict(StrEnum):
    VALID = "valid"
    INVALID = "invalid"
    ENV_SETUP_FAILURE = "env_setup_failure"


@dataclass(frozen=True, slots=True)
class Validation:
    task_id: str
    verdict: Verdict
    reason: str | None = None
    cached: bool = False  # remembered from an earlier run

    def as_json(self) -> dict[str, str | bool | None]:
        return {
            "task": self.task_id,
            "status": self.verdict.value,
            "reason": self.reason,
            "cached": self.cached,
        }


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    format: str
    task_id: str
    key: str
    verdict: Verdict
    reason: str | None


def validate_task(task: Task, cache_dir: Path, sandbox: Sandbox) -> Validation:
    try:
        record = _record_path(task, cache_dir)
    except TaskError as exc:
        return Validation(task.id, Verdict.INVALID, exc.message)
    if record.is_file():
        known = _Record.model_validate_json(record.read_bytes())
        return Validation(task.id, known.verdict, known.reason, cached=True)
    result = _judge(task, cache_dir, sandbox)
    record.parent.mkdir(parents=True, exist_ok=True)
    _write(record, task, result)
    return result


def validate_pool(pool: Pool, cache_dir: Path, sandbox: Sandbox) -> list[Validation]:
    """Every task of the pool, in order; the directories that did not load are invalid."""
    verdicts = [validate_task(task, cache_dir, sandbox) for task in pool.tasks]
    verdicts += [Validation(bad.task_id, Verdict.INVALID, bad.reason) for bad in pool.invalid]
    return sorted(verdicts, key=lambda v: v.task_id)


def valid_tasks(pool: Pool, cache_dir: Path) -> list[Task]:
    found = []
    for task in pool.tasks:
        try:
            record = _record_path(task, cache_dir)
        except TaskError:
            continue  # a base commit that does not resolve never validated
        if record.is_file():
            known = _Record.model_validate_json(record.read_bytes())
            if known.verdict is Verdict.VALID:
                found.append(task)
    return found


def _judge(task: Task, cache_dir: Path, sandbox: Sandbox) -> Validation:
    try:
        image = build_image(task, cache_dir, sandbox)
    except EnvSetupFailure as exc:
        return Validation(task.id, Verdict.ENV_SETUP_FAILURE, exc.reason)
    except TaskError as exc:
        return Validation(task.id, Verdict.INVALID, exc.message)
    rules = load_rules()
    scratch = Path(tempfile.mkdtemp(prefix=f"lego-validate-{task.id}-"))
    try:
        reference = new_workspace(image, scratch / "reference")
        try:
            apply_patch(image, reference, task.solution_patch.read_bytes(), sandbox)
        except TaskError as exc:
            return Validation(task.id, Verdict.INVALID, f"solution.patch: {exc.message}")
        fixed = grade(task, image, reference, sandbox, rules=rules)
        if (problem := _expect(fixed, 1.0, "the reference patch")) is not None:
            return Validation(task.id, Verdict.INVALID, problem)
        empty = grade(task, image, new_workspace(image, scratch / "empty"), sandbox, rules=rules)
        if (problem := _expect(empty, 0.0, "the empty patch")) is not None:
            return Validation(task.id, Verdict.INVALID, problem)
        return Validation(task.id, Verdict.VALID)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _expect(result: GradeResult, reward: float, what: str) -> str | None:
    if result.termination is GradeTermination.GRADER_ERROR:
        return f"grader_error grading {what}: {result.detail}"
    if result.reward != reward:
        return f"{what} gets reward {result.reward} (must get {reward}): {result.detail}"
    return None


def _record_path(task: Task, cache_dir: Path) -> Path:
    key = image_key(task, resolve_base(task), ensure_toolchain(cache_dir).key)
    return cache_dir / "validity" / f"{task.id}-{key}-v{VALIDATION_FORMAT}.json"


def _write(path: Path, task: Task, result: Validation) -> None:
    record = _Record(
        format=VALIDATION_FORMAT,
        task_id=task.id,
        key=path.stem,
        verdict=result.verdict,
        reason=result.reason,
    )
    staged = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    staged.write_text(record.model_dump_json(indent=2))
    staged.replace(path)
