"""Validation: only a task whose grader tells the reference fix from no fix enters rollouts;
``lego-proxy tasks validate`` prints one JSON line per task and a summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox.bwrap import Bwrap
from tasks.generated import PASS_TO_PASS, make_task
from tasks.pool import load_pool
from tasks.validate import Validation, Verdict, valid_tasks, validate_pool

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def mixed_pool(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pool = tmp_path_factory.mktemp("mixed-pool")
    make_task(pool, "ok")
    make_task(pool, "setup-fails", variant="setup_fails")
    make_task(pool, "broken-tests", variant="broken_test_command")
    (make_task(pool, "fix-does-not-fix") / "solution.patch").write_text("")
    passes_already = make_task(pool, "passes-already")
    spec = json.loads((passes_already / "task.json").read_text())
    spec["fail_to_pass"] = [PASS_TO_PASS[0]]
    (passes_already / "task.json").write_text(json.dumps(spec))
    (pool / "malformed").mkdir()
    (pool / "malformed" / "task.json").write_text('{"id": "malformed"}')
    return pool


def _verdicts(results: list[Validation]) -> dict[str, tuple[Verdict, str | None]]:
    return {r.task_id: (r.verdict, r.reason) for r in results}


def test_validation_sorts_tasks_by_what_their_grader_can_tell(
    mixed_pool: Path, tmp_path: Path, bwrap: Bwrap
) -> None:
    cache = tmp_path / "cache"
    verdicts = _verdicts(validate_pool(load_pool(mixed_pool), cache, bwrap))
    assert verdicts["ok"] == (Verdict.VALID, None)
    assert verdicts["setup-fails"] == (
        Verdict.ENV_SETUP_FAILURE,
        "setup_command exited 3: setup: libcalc-dev is not installed",
    )
    verdict, reason = verdicts["broken-tests"]
    assert verdict is Verdict.INVALID
    assert reason is not None
    assert reason.startswith("grader_error grading the reference patch: no test result")
    verdict, reason = verdicts["fix-does-not-fix"]
    assert verdict is Verdict.INVALID
    assert reason is not None
    assert reason.startswith("the reference patch gets reward 0.0 (must get 1.0)")
    verdict, reason = verdicts["passes-already"]
    assert verdict is Verdict.INVALID
    assert reason is not None
    assert reason.startswith("the empty patch gets reward 1.0 (must get 0.0)")
    verdict, reason = verdicts["malformed"]
    assert verdict is Verdict.INVALID
    assert reason is not None
    assert "instruction: Field required" in reason

    pool = load_pool(mixed_pool)
    assert [task.id for task in valid_tasks(pool, cache)] == ["ok"]
    again = validate_pool(pool, cache, bwrap)
    assert _verdicts(again) == verdicts
    assert {r.task_id for r in again if r.cached} == set(verdicts) - {"malformed"}


def test_an_unvalidated_pool_has_no_valid_task(mixed_pool: Path, tmp_path: Path) -> None:
    assert valid_tasks(load_pool(mixed_pool), tmp_path / "empty-cache") == []


def test_an_edited_task_is_validated_again(tmp_path: Path, bwrap: Bwrap) -> None:
    pool_dir = tmp_path / "pool"
    root = make_task(pool_dir, "ok", variant="no_setup")
    cache = tmp_path / "cache"
    assert [t.id for t in valid_tasks(load_pool(pool_dir), cache)] == []
    validate_pool(load_pool(pool_dir), cache, bwrap)
    assert [t.id for t in valid_tasks(load_pool(pool_dir), cache)] == ["ok"]
    (root / "solution.patch").write_text("")
    assert valid_tasks(load_pool(pool_dir), cache) == []
    [verdict] = validate_pool(load_pool(pool_dir), cache, bwrap)
    assert (verdict.verdict, verdict.cached) == (Verdict.INVALID, False)


def test_the_command_prints_a_line_per_task_and_a_summary(mixed_pool: Path, tmp_path: Path) -> None:
    env = {**os.environ, "LEGO_SANDBOX_DIR": str(tmp_path / "runtime")}
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "tasks", "validate", str(mixed_pool)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    *lines, summary = [json.loads(line) for line in done.stdout.splitlines()]
    assert {line["task"]: line["status"] for line in lines} == {
        "broken-tests": "invalid",
        "fix-does-not-fix": "invalid",
        "malformed": "invalid",
        "ok": "valid",
        "passes-already": "invalid",
        "setup-fails": "env_setup_failure",
    }
    assert all(set(line) == {"task", "status", "reason", "cached"} for line in lines)
    assert summary == {"summary": {"valid": 1, "invalid": 4, "env_setup_failure": 1, "total": 6}}
    assert (mixed_pool / ".cache" / "validity").is_dir()  # the default cache: POOL/.cache


def test_the_command_refuses_a_missing_pool(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "tasks", "validate", str(tmp_path / "nowhere")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 1
    assert done.stderr.strip() == f"lego-proxy: task pool {tmp_path / 'nowhere'} is not a directory"
