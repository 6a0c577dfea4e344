"""The loop's orchestration against a real proxy on loopback, with plain-function trials.

The trials here are functions (the harness suite runs real ones, tests/loop/
test_closed_loop.py the whole loop) and the trainer is a stand-in that claims groups over
the real export API, announces a version per step and reports the metrics a test gives
it: what is under test is the loop's phases, its bookkeeping and its stop rules.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from loop.collapse import parse_rule
from loop.orchestrator import (
    LoopConfig,
    LoopParts,
    LoopStopped,
    OnCollapse,
    StepSeen,
    run_loop,
)
from recorder.export import ExportStore
from rollouts.control import ControlClient
from rollouts.harnesses import Endpoint
from rollouts.stages import Stage, Stopwatch
from rollouts.trial import Ending, HarnessOutcome, Termination, TrialResult
from tasks import generated
from tasks.grading import Expectation, GradeResult, GradeTermination
from tasks.grading import TestResult as GradedTest
from tasks.spec import Task, load_task
from tests.support.control_proxy import control_proxy
from trainer_bridge.client import ExportClient

ADMIN_KEY = "loop-test-admin-key"


@dataclass(frozen=True)
class Proxy:
    url: str
    database_url: str


@pytest.fixture(scope="module")
def proxy(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    data_dir = tmp_path_factory.mktemp("loop-proxy")
    with control_proxy(tiny_model_dir, data_dir, ADMIN_KEY) as (url, database_url):
        yield Proxy(url, database_url)


@pytest.fixture
def admin(proxy: Proxy) -> Iterator[httpx.Client]:
    headers = {"authorization": f"Bearer {ADMIN_KEY}"}
    with httpx.Client(base_url=proxy.url, headers=headers, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Task]:
    root = tmp_path_factory.mktemp("pool")
    names = ("mixed", "solved", "broken", "held")
    return {name: load_task(generated.make_task(root, name)) for name in names}


def new_run(admin: httpx.Client) -> str:
    name = f"loop-{uuid.uuid4().hex[:8]}"
    return str(admin.post("/api/v1/runs", json={"name": name}).raise_for_status().json()["id"])


def graded(reward: float) -> Ending:
    test = GradedTest("tests/t.py::test_x", Expectation.FAIL_TO_PASS, "PASSED", reward == 1.0)
    grade = GradeResult(GradeTermination.COMPLETED, reward, (test,), (), "")
    return Ending(Termination.COMPLETED, "", (), HarnessOutcome(0, False, 0.1, "", ""), grade)


@dataclass
class Trials:
    """mixed: 1, 0, 1, 0, ... over its own trials (so each of its groups of two is 1/2);
    solved and held: 1; broken: the image fails."""

    flips: Iterator[int] = field(default_factory=lambda: itertools.cycle((1, 0)))
    lock: threading.Lock = field(default_factory=threading.Lock)
    seen: list[str] = field(default_factory=list)

    def __call__(
        self, task: Task, harness: str, endpoint: Endpoint, watch: Stopwatch
    ) -> TrialResult:
        with watch.stage(Stage.AGENT_EXECUTION), self.lock:
            self.seen.append(task.id)
            flip = next(self.flips) if task.id == "mixed" else 1
        if task.id == "broken":
            ending = Ending(Termination.ENV_SETUP_FAILURE, "pip install failed", (), None)
        else:
            ending = graded(float(flip) if task.id == "mixed" else 1.0)
        return TrialResult(task.id, harness, ending, watch.stages())


@dataclass
class StandInTrainer:
    """Claims ``groups`` groups per step over the export API, announces ``v<step>``, and
    reports ``metrics[step - 1]``; records every group it was handed."""

    url: str
    run_id: str
    groups: int
    metrics: Sequence[dict[str, float | None]]
    claimed: list[str] = field(default_factory=list)
    started: bool = False

    def __call__(self, after: Callable[[StepSeen], bool], stop: threading.Event) -> None:
        self.started = True
        with ExportClient(self.url, ADMIN_KEY, self.run_id) as export:
            for step in itertools.count(1):
                held = 0
                while held < self.groups and not stop.is_set():
                    batch = export.claim(self.groups - held, None, 600)
                    held += len(batch.groups)
                    self.claimed += [group.group_id for group in batch.groups]
                    if batch.batch_id is not None:
                        export.ack(batch.batch_id)
                    elif stop.wait(0.05):
                        return
                if stop.is_set():
                    return
                export.announce_weight_version(f"v{step}")
                metrics = self.metrics[min(step, len(self.metrics)) - 1]
                if not after(StepSeen(step, f"v{step}", metrics, False, ())):
                    return


def sessions(admin: httpx.Client, run_id: str) -> list[dict[str, object]]:
    body = admin.get(f"/api/v1/runs/{run_id}/trajectories", params={"limit": 1000})
    return list(body.raise_for_status().json()["items"])


def test_the_loop_checks_trains_validates_and_sets_tasks_aside(
    proxy: Proxy, admin: httpx.Client, pool: dict[str, Task]
) -> None:
    run_id = new_run(admin)
    trainer = StandInTrainer(proxy.url, run_id, groups=2, metrics=[{"mean_reward": 0.5}])
    config = LoopConfig(
        run_id, "codex", group_size=2, steps=2, check_trials=2, validate_every=1,
        set_aside_after=1, collapse_rules=(),
    )  # fmt: skip
    lines: list[str] = []
    with ControlClient(proxy.url, ADMIN_KEY) as control:
        parts = LoopParts(
            control, Trials(), [pool["mixed"], pool["solved"]], [pool["held"]], trainer,
            lines.append,
        )  # fmt: skip
        result = run_loop(config, parts)

    assert result.ended == "2 trainer step(s) done"
    assert [s.weight_version for s in result.steps] == ["v1", "v2"]
    assert [(p.step, p.mean_reward, p.graded) for p in result.validation] == [
        (1, 1.0, 1),
        (2, 1.0, 1),
    ]
    # "solved" was 2/2 in epoch 0: set aside, never rolled out again.
    assert result.selection.set_aside() == {"solved": "2/2 in epoch(s) 0"}
    assert result.selection.epoch(0).histogram == ((1, 1), (2, 1))
    recorded = sessions(admin, run_id)
    by_purpose: dict[object, set[object]] = {}
    for s in recorded:
        by_purpose.setdefault(s["purpose"], set()).add(s["group_id"])
    assert by_purpose["check"] == {"check.mixed.e0", "check.solved.e0"}
    assert by_purpose["validation"] == {"val-s1.held.e0", "val-s2.held.e0"}
    assert "solved.e0" in by_purpose["train"]
    assert not any(str(g).startswith("solved.e") and g != "solved.e0" for g in by_purpose["train"])
    # The trainer was only ever handed training groups.
    assert trainer.claimed
    assert all(g in by_purpose["train"] for g in trainer.claimed)
    assert result.phases.check > 0
    assert result.phases.rollouts > 0
    assert "validation after step 2: reward 1.0" in "\n".join(lines)


def test_a_validation_run_that_does_not_grade_stops_the_loop_before_any_training(
    proxy: Proxy, admin: httpx.Client, pool: dict[str, Task]
) -> None:
    run_id = new_run(admin)
    trainer = StandInTrainer(proxy.url, run_id, groups=1, metrics=[{}])
    config = LoopConfig(run_id, "codex", group_size=2, steps=1, check_trials=2)
    with ControlClient(proxy.url, ADMIN_KEY) as control:
        parts = LoopParts(control, Trials(), [pool["mixed"], pool["broken"]], [], trainer)
        with pytest.raises(LoopStopped, match="task broken: env_setup_failure: pip install"):
            run_loop(config, parts)
    assert not trainer.started
    assert {s["purpose"] for s in sessions(admin, run_id)} == {"check"}


@pytest.mark.parametrize("action", ["stop", "pause"])
def test_a_collapse_rule_ends_the_loop_and_says_which_series(
    proxy: Proxy, admin: httpx.Client, pool: dict[str, Task], action: OnCollapse
) -> None:
    run_id = new_run(admin)
    falling: list[dict[str, float | None]] = [{"mean_reward": r} for r in (0.9, 0.7, 0.4, 0.2, 0.1)]
    trainer = StandInTrainer(proxy.url, run_id, groups=1, metrics=falling)
    config = LoopConfig(
        run_id, "codex", group_size=2, steps=20, check_trials=0,
        collapse_rules=(parse_rule("mean_reward:falling:3:3"),), on_collapse=action,
    )  # fmt: skip
    with ControlClient(proxy.url, ADMIN_KEY) as control:
        parts = LoopParts(control, Trials(), [pool["mixed"]], [], trainer)
        result = run_loop(config, parts)
    assert result.ended.startswith("collapse: mean_reward is falling (t = -")
    assert len(result.steps) == 3  # tripped at the first step with three points
    paused = asyncio.run(_paused(proxy.database_url))
    assert (run_id in paused) == (action == "pause")


async def _paused(url: str) -> frozenset[str]:
    exports = ExportStore.open(url)
    try:
        return await exports.paused_runs()
    finally:
        await exports.close()


def test_every_task_set_aside_ends_the_loop_with_the_reason(
    proxy: Proxy, admin: httpx.Client, pool: dict[str, Task]
) -> None:
    run_id = new_run(admin)
    trainer = StandInTrainer(proxy.url, run_id, groups=1, metrics=[{}])
    config = LoopConfig(
        run_id, "codex", group_size=2, steps=5, check_trials=0, set_aside_after=1,
        collapse_rules=(),
    )  # fmt: skip
    with ControlClient(proxy.url, ADMIN_KEY) as control:
        result = run_loop(config, LoopParts(control, Trials(), [pool["solved"]], [], trainer))
    assert result.ended.startswith("every task is set aside")
    assert result.epochs == 1
