"""The runner against a real proxy on loopback: sessions made, trials' results finished.

The trial is a plain function here (the harness suite runs the real one): what is under
test is the runner's bookkeeping with the control API, its threads and its errors.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cli.main import main
from kernel.errors import ConfigurationError
from kernel.threaded import free_port
from rollouts.control import ControlClient
from rollouts.harnesses import Endpoint
from rollouts.runner import RolloutConfig, finish_body, jobs, run_rollout
from rollouts.stages import Stage, Stopwatch
from rollouts.trial import Ending, HarnessOutcome, Termination, TrialResult
from tasks import generated
from tasks.events import DefenseEvent, DefenseKind
from tasks.grading import Expectation, GradeResult, GradeTermination
from tasks.grading import TestResult as GradedTest
from tasks.spec import Task, load_task
from tests.support.control_proxy import control_proxy

ADMIN_KEY = "runner-test-admin-key"
REVERTED = DefenseEvent(DefenseKind.TEST_PATH_REVERTED, "1 file restored", ("tests/t.py",))


@pytest.fixture(scope="module")
def proxy(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data_dir = tmp_path_factory.mktemp("runner-proxy")
    with control_proxy(tiny_model_dir, data_dir, ADMIN_KEY) as (url, _):
        yield url


@pytest.fixture
def admin(proxy: str) -> Iterator[httpx.Client]:
    headers = {"authorization": f"Bearer {ADMIN_KEY}"}
    with httpx.Client(base_url=proxy, headers=headers, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> list[Task]:
    pool = tmp_path_factory.mktemp("pool")
    return [load_task(generated.make_task(pool, name)) for name in ("alpha", "beta")]


def new_run(admin: httpx.Client) -> str:
    name = f"runner-{uuid.uuid4().hex[:8]}"
    return str(admin.post("/api/v1/runs", json={"name": name}).raise_for_status().json()["id"])


def graded(reward: float) -> GradeResult:
    test = GradedTest("tests/t.py::test_x", Expectation.FAIL_TO_PASS, "PASSED", reward == 1.0)
    return GradeResult(GradeTermination.COMPLETED, reward, (test,), (REVERTED,), "")


def scripted_trial(task: Task, harness: str, endpoint: Endpoint, watch: Stopwatch) -> TrialResult:
    """alpha is solved, beta times out; each stage takes a little real time."""
    assert endpoint.openai_base_url.endswith(f"/s/{endpoint.key}/v1")
    with watch.stage(Stage.AGENT_EXECUTION):
        pass
    agent = HarnessOutcome(0, False, 0.1, "", "")
    if task.id == "alpha":
        ending = Ending(Termination.COMPLETED, "", (REVERTED,), agent, graded(1.0))
    else:
        ending = Ending(Termination.AGENT_TIMEOUT, "ran past 20 s", (), agent)
    return TrialResult(task.id, harness, ending, watch.stages())


def test_every_sample_of_every_epoch_is_a_finished_session(
    proxy: str, admin: httpx.Client, tasks: list[Task]
) -> None:
    run_id = new_run(admin)
    config = RolloutConfig(run_id, "codex", group_size=2, epochs=2, concurrency=3)
    lines: list[str] = []
    with ControlClient(proxy, ADMIN_KEY) as control:
        done = run_rollout(control, tasks, config, scripted_trial, progress=lines.append)
    assert len(done) == len(lines) == 8
    assert sorted(lines)[0].startswith("[1/8] ")
    seen = set()
    for finished in done:
        body = admin.get(f"/api/v1/sessions/{finished.session_id}").raise_for_status().json()
        job = finished.job
        seen.add((body["task_id"], body["group_id"], body["sample_index"]))
        assert body["harness"] == "codex"
        assert body["status"] == "finished"
        assert set(body["stages"]) == {stage.value for stage in Stage}
        if job.task.id == "alpha":
            assert (body["termination"], body["reward"], body["excluded"]) == (
                "completed",
                1.0,
                False,
            )
            assert body["reward_details"]["tests"] == [
                {
                    "id": "tests/t.py::test_x",
                    "expected": "fail_to_pass",
                    "status": "PASSED",
                    "passed": True,
                }
            ]
            assert body["defense_events"] == [
                {"kind": "test_path_reverted", "detail": "1 file restored", "items": ["tests/t.py"]}
            ]
        else:
            assert (body["termination"], body["reward"], body["excluded"]) == (
                "agent_timeout",
                None,
                True,
            )
            assert body["reward_details"] == {"reason": "ran past 20 s", "harness_exit": 0}
    assert seen == {
        (task, f"{task}.e{epoch}", index)
        for task in ("alpha", "beta")
        for epoch in range(2)
        for index in range(2)
    }


def test_jobs_keep_a_group_together(tasks: list[Task]) -> None:
    order = [(j.group_id, j.sample_index) for j in jobs(tasks, RolloutConfig("r", "opencode", 2))]
    assert order == [("alpha.e0", 0), ("alpha.e0", 1), ("beta.e0", 0), ("beta.e0", 1)]


def test_an_excluded_trial_never_reports_a_zero() -> None:
    ending = Ending(
        Termination.GRADER_ERROR,
        "no test result in the log",
        grade=GradeResult(GradeTermination.GRADER_ERROR, None, (), (), "no test result in the log"),
    )
    result = TrialResult("t", "codex", ending, Stopwatch().stages())
    assert result.reward is None
    assert finish_body(result).reward is None
    assert finish_body(result).termination == "grader_error"


def test_bad_settings_are_named_before_anything_runs(
    proxy: str, admin: httpx.Client, tasks: list[Task]
) -> None:
    calls: list[str] = []

    def never(task: Task, harness: str, endpoint: Endpoint, watch: Stopwatch) -> TrialResult:
        calls.append(task.id)
        raise AssertionError("no trial may start")

    config = RolloutConfig(new_run(admin), "codex", group_size=1)
    with (
        ControlClient(proxy, "wrong-key") as control,
        pytest.raises(ConfigurationError, match="refused the admin key"),
    ):
        run_rollout(control, tasks, config, never)
    unknown = RolloutConfig("no-such-run", "codex", group_size=1)
    with (
        ControlClient(proxy, ADMIN_KEY) as control,
        pytest.raises(ConfigurationError, match="run 'no-such-run' does not exist"),
    ):
        run_rollout(control, tasks, unknown, never)
    dead = f"http://127.0.0.1:{free_port()}"
    with (
        ControlClient(dead, ADMIN_KEY) as control,
        pytest.raises(ConfigurationError, match="cannot be reached"),
    ):
        run_rollout(control, tasks, config, never)
    assert calls == []


def test_a_runner_error_stops_new_trials_and_is_raised(
    proxy: str, admin: httpx.Client, tasks: list[Task]
) -> None:
    started: list[str] = []
    lock = threading.Lock()

    def crashing(task: Task, harness: str, endpoint: Endpoint, watch: Stopwatch) -> TrialResult:
        with lock:
            started.append(task.id)
        raise RuntimeError("the runner's own bug")

    run_id = new_run(admin)
    config = RolloutConfig(run_id, "codex", group_size=3, concurrency=1)
    with ControlClient(proxy, ADMIN_KEY) as control, pytest.raises(RuntimeError, match="bug"):
        run_rollout(control, tasks, config, crashing)
    assert started == ["alpha"]  # one worker: nothing after the failure started


def test_bad_rollout_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown harness"):
        RolloutConfig("r", "aider", group_size=1)
    with pytest.raises(ValueError, match="group_size must be at least 1"):
        RolloutConfig("r", "codex", group_size=0)


def test_the_command_line_names_what_is_wrong(
    proxy: str,
    admin: httpx.Client,
    tasks: list[Task],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    harness_dir = tmp_path / "harness"
    (harness_dir / "npm").mkdir(parents=True)
    pool = tasks[0].root.parent
    base = ["rollout", "--tasks", str(pool), "--harness", "codex", "--group-size", "1"]
    base += ["--harness-dir", str(harness_dir), "--cache", str(tmp_path / "cache")]
    cases = [
        (["--proxy-url", proxy, "--admin-key", "wrong", "--run-id", new_run(admin)], "admin key"),
        (["--proxy-url", proxy, "--admin-key", ADMIN_KEY, "--run-id", "nope"], "'nope' does not"),
        (["--proxy-url", "ftp://x", "--admin-key", ADMIN_KEY, "--run-id", "r"], "http://HOST:PORT"),
        (
            [
                "--proxy-url",
                proxy,
                "--admin-key",
                ADMIN_KEY,
                "--run-id",
                "r",
                "--sandbox",
                "docker",
            ],
            "sandbox needs an image",
        ),
    ]
    for extra, message in cases:
        with pytest.raises(SystemExit) as exited:
            main([*base, *extra])
        assert exited.value.code == 1
        assert message in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SystemExit):
        main(
            [
                *base[:-4],
                "--harness-dir",
                str(empty),
                "--proxy-url",
                proxy,
                "--run-id",
                "r",
                "--admin-key",
                ADMIN_KEY,
            ]
        )
    assert "make harness-install" in capsys.readouterr().err
    assert not (tmp_path / "cache").exists()  # nothing was built for a rollout that cannot run
