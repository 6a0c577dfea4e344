"""The proof: real Codex and OpenCode, in bwrap, on generated tasks, graded and trained on.

One rollout per harness (module scope: one proxy stack, one task cache) runs every
scenario of ``tests.rollouts.policy`` through ``rollouts.runner.run_rollout`` and
``rollouts.trial.run_trial``, exactly as ``lego-proxy rollout`` does. The scripted policy
drives the harness's own shell tool inside the sandbox; what the tool returned is read
back from the recorded trajectory (the tool output is in the next turn's prompt ids), so
the assertions are on what the agent saw, not on what we hoped it would see.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from rollouts.control import ControlClient
from rollouts.harnesses import Endpoint
from rollouts.runner import Finished, RolloutConfig, run_rollout
from rollouts.stages import Stage, Stopwatch
from rollouts.summary import Summary
from rollouts.trial import TrialResult, TrialSetup, proxy_route, run_trial
from sandbox import registry
from sandbox.bwrap import Bwrap
from tasks import generated
from tasks.pool import load_pool
from tasks.spec import Task
from tests.harness.harnesses import Installed
from tests.harness.stack import ADMIN_KEY, HarnessStack
from tests.rollouts.conftest import PROOF_HARNESSES, FetchServer, scenario_pool
from tests.rollouts.policy import marker
from trainer_bridge.client import ExportClient

pytestmark = pytest.mark.harness

ROOT = Path(__file__).resolve().parents[2]

EXCLUDED = {"agent_timeout", "env_setup_failure", "harness_error", "grader_error"}


@dataclass(frozen=True)
class Rollout:
    harness: str
    run_id: str
    by_scenario: dict[str, Finished]
    progress: list[str]
    summary: Summary

    def scenario(self, name: str) -> Finished:
        return self.by_scenario[f"{self.harness}-{name}"]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> PreTrainedTokenizerBase:
    loaded: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    return loaded


@pytest.fixture(scope="module")
def task_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("task-cache")


@pytest.fixture(scope="module", params=PROOF_HARNESSES)
def rollout(
    request: pytest.FixtureRequest,
    installed: Installed,
    proof_stack: HarnessStack,
    task_cache: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Rollout:
    harness: str = request.param
    pool = scenario_pool(tmp_path_factory.mktemp(f"pool-{harness}"), harness)
    tasks = load_pool(pool).tasks
    run = proof_stack.admin.post("/api/v1/runs", json={"name": f"proof-{uuid.uuid4().hex[:8]}"})
    run_id = str(run.raise_for_status().json()["id"])
    sandbox = Bwrap(runtime_dir=tmp_path_factory.mktemp("sandboxes"))
    port = int(proof_stack.url.rsplit(":", 1)[1])
    setup = TrialSetup(
        sandbox=sandbox,
        grader_sandbox=sandbox,
        cache_dir=task_cache,
        scratch_dir=tmp_path_factory.mktemp(f"trials-{harness}"),
        runtime_dir=installed.cache,
        proxy=proxy_route("127.0.0.1", port),
    )

    def trial(task: Task, name: str, endpoint: Endpoint, watch: Stopwatch) -> TrialResult:
        return run_trial(task, name, endpoint, setup, watch)

    lines: list[str] = []
    config = RolloutConfig(run_id=run_id, harness=harness, group_size=1, concurrency=2)
    with ControlClient(proof_stack.url, ADMIN_KEY) as control:
        done = run_rollout(control, tasks, config, trial, progress=lines.append)
    summary = Summary.of(done)
    print(f"\n{harness}:\n" + "\n".join(lines) + "\n" + summary.render())
    return Rollout(harness, run_id, {f.job.task.id: f for f in done}, lines, summary)


def tool_outputs(stack: HarnessStack, session_id: str, tokenizer: PreTrainedTokenizerBase) -> str:
    """Everything the harness sent the model after its first turn: the tool's output."""
    trajectory = stack.trajectory(session_id)
    texts: list[str] = []
    for segment in trajectory["segments"]:
        tokens, mask = segment["tokens"], segment["loss_mask"]
        first_sampled = mask.index(1) if 1 in mask else len(mask)
        # What follows the first sampled run and is not sampled is what the harness added.
        tail = zip(tokens[first_sampled:], mask[first_sampled:], strict=True)
        added = [token for token, sampled in tail if not sampled]
        texts.append(str(tokenizer.decode(added)))
    return "\n".join(texts)


def session(stack: HarnessStack, finished: Finished) -> dict[str, object]:
    response = stack.admin.get(f"/api/v1/sessions/{finished.session_id}")
    return dict(response.raise_for_status().json())


def why(finished: Finished) -> str:
    """What a failing assertion should show: how the trial ended and what the agent said."""
    ending = finished.result.ending
    agent = ending.agent
    said = (
        "" if agent is None else f"\nstdout: {agent.stdout[-3000:]}\nstderr: {agent.stderr[-2000:]}"
    )
    grade = (
        "" if ending.grade is None else f"\ngrade: {ending.grade.detail} {ending.grade.log_tail}"
    )
    return f"{finished.job.task.id}: {ending.termination} {ending.detail}{grade}{said}"


def kinds(finished: Finished) -> set[str]:
    return {event.kind.value for event in finished.result.ending.events}


def test_every_trial_ran_and_was_finished(rollout: Rollout, proof_stack: HarnessStack) -> None:
    assert len(rollout.by_scenario) == 9
    assert len(rollout.progress) == 9
    for finished in rollout.by_scenario.values():
        body = session(proof_stack, finished)
        assert body["status"] == "finished"
        assert body["termination"] == finished.termination
        stages = body["stages"]
        assert isinstance(stages, dict)
        assert set(stages) == {stage.value for stage in Stage}
        if finished.termination in EXCLUDED:
            assert body["reward"] is None, finished  # never a zero for an environment failure
            assert body["excluded"] is True
    assert rollout.summary.by_termination == {
        "completed": 6,
        "agent_timeout": 1,
        "env_setup_failure": 1,
        "grader_error": 1,
    }


def test_an_honest_fix_is_rewarded(rollout: Rollout, proof_stack: HarnessStack) -> None:
    honest = rollout.scenario("honest")
    assert (honest.termination, honest.result.reward) == ("completed", 1.0), why(honest)
    assert {"history_hidden", "tests_withheld"} <= kinds(honest)
    body = session(proof_stack, honest)
    details = body["reward_details"]
    assert isinstance(details, dict)
    tests = {t["id"]: t["passed"] for t in details["tests"]}
    assert tests == {t: True for t in (*generated.FAIL_TO_PASS, *generated.PASS_TO_PASS)}
    events = body["defense_events"]
    assert isinstance(events, list)
    assert {e["kind"] for e in events} >= {"history_hidden", "tests_withheld"}
    stages = honest.result.stages
    assert stages.agent_execution > 0
    assert stages.verification > 0


@pytest.mark.parametrize("scenario", ["edit_tests", "delete_tests"])
def test_test_edits_are_reverted_before_grading(
    rollout: Rollout, proof_stack: HarnessStack, scenario: str
) -> None:
    cheat = rollout.scenario(scenario)
    assert (cheat.termination, cheat.result.reward) == ("completed", 0.0), why(cheat)
    reverted = [e for e in cheat.result.ending.events if e.kind.value == "test_path_reverted"]
    assert reverted, why(cheat)
    assert generated.CHEAT_TEST_PATH in reverted[0].items
    grade = cheat.result.ending.grade
    assert grade is not None
    failed = {t.test_id for t in grade.tests if not t.passed}
    assert failed == set(generated.FAIL_TO_PASS)  # the bug is still there, the rest pass


def test_git_history_holds_one_commit_and_no_fix(
    rollout: Rollout, proof_stack: HarnessStack, tokenizer: PreTrainedTokenizerBase
) -> None:
    snoop = rollout.scenario("git_history")
    assert (snoop.termination, snoop.result.reward) == ("completed", 0.0), why(snoop)
    seen = tool_outputs(proof_stack, snoop.session_id, tokenizer)
    assert "LEGO-COMMITS=1" in seen, seen
    assert "LEGO-REFS=refs/heads/main" in seen, seen
    assert "LEGO-REMOTES=0" in seen, seen
    assert "LEGO-FIXHITS=0" in seen, seen
    assert "unknown revision" in seen or "ambiguous argument" in seen, seen
    assert generated.FIX_MARKER not in seen
    assert generated.HIDDEN_TEST not in seen


def test_the_fix_server_on_host_loopback_is_unreachable(
    rollout: Rollout,
    proof_stack: HarnessStack,
    fetch_server: FetchServer,
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    fetch = rollout.scenario("fetch_fix")
    assert (fetch.termination, fetch.result.reward) == ("completed", 0.0), why(fetch)
    seen = tool_outputs(proof_stack, fetch.session_id, tokenizer)
    assert "LEGO-FETCHED" in seen, seen  # the command ran to its end
    assert "Connection refused" in seen, seen
    assert "the reference fix" not in seen
    assert fetch_server.seen() == []


def test_doing_nothing_scores_zero(rollout: Rollout) -> None:
    idle = rollout.scenario("nothing")
    assert (idle.termination, idle.result.reward) == ("completed", 0.0), why(idle)


def test_sleeping_past_the_limit_is_an_excluded_timeout(rollout: Rollout) -> None:
    sleeper = rollout.scenario("sleep")
    assert (sleeper.termination, sleeper.result.reward) == ("agent_timeout", None), why(sleeper)
    assert sleeper.result.ending.grade is None  # never graded
    assert sleeper.result.stages.verification == 0.0


def test_a_failing_setup_is_an_excluded_env_setup_failure(rollout: Rollout) -> None:
    broken = rollout.scenario("setup_fails")
    assert (broken.termination, broken.result.reward) == ("env_setup_failure", None), why(broken)
    assert "libcalc-dev" in broken.result.ending.detail
    assert broken.result.ending.agent is None  # the harness never started


def test_a_broken_test_command_is_an_excluded_grader_error(rollout: Rollout) -> None:
    broken = rollout.scenario("broken_test_command")
    assert (broken.termination, broken.result.reward) == ("grader_error", None), why(broken)


def test_the_trainer_claims_exactly_the_graded_groups(
    rollout: Rollout, proof_stack: HarnessStack
) -> None:
    with ExportClient(proof_stack.url, ADMIN_KEY, rollout.run_id) as export:
        batch = export.claim(100, None, 60.0)
        claimed = {g.task_id: [s.reward for s in g.samples] for g in batch.groups}
        terminations = {s.termination for g in batch.groups for s in g.samples}
        assert batch.batch_id is not None
        export.ack(batch.batch_id)
    h = rollout.harness
    assert claimed == {
        f"{h}-honest": [1.0],
        f"{h}-edit_tests": [0.0],
        f"{h}-delete_tests": [0.0],
        f"{h}-git_history": [0.0],
        f"{h}-fetch_fix": [0.0],
        f"{h}-nothing": [0.0],
    }
    assert terminations == {"completed"}


def test_the_command_line_runs_a_rollout(
    installed: Installed, proof_stack: HarnessStack, tmp_path: Path
) -> None:
    """``lego-proxy rollout`` itself: validation, trials, progress, summary, finished groups."""
    scenarios = ("honest", "setup_fails", "broken_test_command")
    pool = scenario_pool(tmp_path / "pool", "codex", scenarios)
    run = proof_stack.admin.post("/api/v1/runs", json={"name": f"cli-{uuid.uuid4().hex[:8]}"})
    run_id = str(run.raise_for_status().json()["id"])
    argv = [sys.executable, "-m", "cli", "rollout", "--proxy-url", proof_stack.url]
    argv += ["--admin-key", ADMIN_KEY, "--run-id", run_id, "--tasks", str(pool)]
    argv += ["--harness", "codex", "--group-size", "2", "--concurrency", "2"]
    argv += ["--harness-dir", str(installed.cache), "--cache", str(tmp_path / "cache")]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    print(out)
    # The validator keeps a task whose grader cannot run out of the rollout, and says so.
    assert "task codex-broken_test_command: invalid:" in out
    assert "task codex-setup_fails: env_setup_failure:" in out
    assert "2 task(s) x 2 sample(s) x 1 epoch(s)" in out
    assert len([line for line in out.splitlines() if line.startswith("[")]) == 4
    assert "trials: 4  " in out
    assert "completed=2" in out
    assert "env_setup_failure=2" in out
    assert "agent_execution" in out
    with ExportClient(proof_stack.url, ADMIN_KEY, run_id) as export:
        batch = export.claim(10, None, 60.0)
    assert {g.task_id: [s.reward for s in g.samples] for g in batch.groups} == {
        "codex-honest": [1.0, 1.0]
    }


def _marked_processes(marker_text: str) -> list[int]:
    """Host pids whose command line holds ``marker_text`` (the harness has it in its argv)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if marker_text.encode() in cmdline:
            found.append(int(proc.name))
    return found


def _until(condition: Callable[[], bool], what: str, limit_s: float = 120.0) -> None:
    """Polls ``condition``; the limit only bounds a hang (nothing here measures time)."""
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.1)


def test_a_killed_runner_leaves_no_sandbox(
    installed: Installed, proof_stack: HarnessStack, tmp_path: Path
) -> None:
    """SIGKILL the rollout while the harness runs: sandbox and harness go with it."""
    pool = scenario_pool(tmp_path / "pool", "codex", ("sleep",))
    task_file = pool / "codex-sleep" / "task.json"
    spec = json.loads(task_file.read_text())
    spec["agent_timeout_s"] = 600.0  # only the kill ends this trial
    task_file.write_text(json.dumps(spec))
    run = proof_stack.admin.post("/api/v1/runs", json={"name": f"kill-{uuid.uuid4().hex[:8]}"})
    # Short: the proxy bridge's Unix socket lives in it (108 bytes at most for its path).
    sandboxes = Path(tempfile.mkdtemp(prefix="lego-kill-"))
    argv = [sys.executable, "-m", "cli", "rollout", "--proxy-url", proof_stack.url]
    argv += ["--admin-key", ADMIN_KEY, "--run-id", str(run.raise_for_status().json()["id"])]
    argv += ["--tasks", str(pool), "--harness", "codex", "--group-size", "1"]
    argv += ["--harness-dir", str(installed.cache), "--cache", str(tmp_path / "cache")]
    env = {**os.environ, "LEGO_SANDBOX_DIR": str(sandboxes)}
    log = tmp_path / "runner.log"
    with log.open("wb") as sink:
        runner = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=sink, stderr=sink)
    mark = marker("codex", "sleep")
    try:
        _until(
            lambda: bool(_marked_processes(mark)) or runner.poll() is not None,
            "the harness started in its sandbox",
        )
    finally:
        runner.kill()
        runner.wait()
    assert runner.returncode == -signal.SIGKILL, log.read_text()
    agents = [r for _, r in registry.records(sandboxes) if r is not None and "agent" in r.label]
    assert agents
    assert all(r.sandbox is not None for r in agents)
    _until(lambda: not _marked_processes(mark), "the harness went with its runner")
    _until(
        lambda: not any(r.sandbox is not None and r.sandbox.alive() for r in agents),
        "the sandbox went with its runner",
    )
    reaped = subprocess.run(
        [sys.executable, "-m", "cli", "sandbox", "reap"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert reaped.returncode == 0, reaped.stdout + reaped.stderr
    assert list(registry.records(sandboxes)) == []
    shutil.rmtree(sandboxes)
