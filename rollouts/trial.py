"""One trial: a task's image, the real harness in a sandbox, the grader, a termination.

``run_trial(task, harness, endpoint, setup)`` runs Table 4's stages, each timed:

1. ``sandbox_setup``: the task image from the cache (``tasks.images.build_image``: built
   once, a one-commit repository), the trial's own directories (overlay upper/work, HOME).
2. ``agent_setup``: the harness's launch plan (``rollouts.harnesses``) laid out for the
   sandbox and its files written under HOME; the harness runtime is *mounted* read-only
   at ``RUNTIME_TARGET``, never installed per trial.
3. ``agent_execution``: the harness CLI in the sandbox as the unprivileged user, with
   ``Network.PROXY_ONLY`` (``127.0.0.1:<inside_port>`` is the proxy; nothing else is
   reachable) and the task's ``agent_timeout_s`` as its wall-clock limit.
4. ``verification``: ``tasks.grading.grade`` in a fresh sandbox with no network, over
   what the agent left in the overlay's upper layer.

Terminations: an image or sandbox that cannot be made is ``env_setup_failure``; the limit
reached ``agent_timeout``; a harness that exits non-zero ``harness_error``; a grader that
cannot grade ``grader_error``; else ``completed`` with reward 1.0 or 0.0. Only
``completed`` carries a reward: an excluded trial never reports a zero. The trial's
directories are removed at the end (``other``), whatever happened.
"""

from __future__ import annotations

import shutil
import uuid
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from kernel.errors import SandboxError, TaskError
from rollouts.harnesses import Endpoint, Layout, plan_for
from rollouts.stages import Stage, Stages, Stopwatch
from sandbox.spec import Mount, Network, ProxyRoute, Sandbox, SandboxSpec, Workspace
from tasks.events import DefenseEvent
from tasks.grading import GradeResult, GradeTermination, grade
from tasks.images import build_image
from tasks.sandboxing import SANDBOX_GID, SANDBOX_UID, WORKSPACE_TARGET
from tasks.spec import Task
from tasks.swebench_rules import Rules, load_rules

RUNTIME_TARGET = "/opt/lego/harness"
HOME_TARGET = "/home/agent"
INSIDE_PORT = 8000
OUTPUT_TAIL = 20_000  # characters of the harness's output kept with the result


class Termination(StrEnum):
    """The control API's terminations a trial ends with."""

    COMPLETED = "completed"
    AGENT_TIMEOUT = "agent_timeout"
    ENV_SETUP_FAILURE = "env_setup_failure"
    HARNESS_ERROR = "harness_error"
    GRADER_ERROR = "grader_error"


@dataclass(frozen=True, slots=True)
class TrialSetup:
    """What every trial of a rollout shares."""

    sandbox: Sandbox  # agent phase
    grader_sandbox: Sandbox  # verification (may be the same backend)
    cache_dir: Path  # task images (and the grading toolchain)
    scratch_dir: Path  # per-trial directories live here while a trial runs
    runtime_dir: Path  # what ``make harness-install`` installed, on the host
    proxy: ProxyRoute  # where the runner reaches the proxy, and where the sandbox sees it
    # SWE-bench's grading rules, loaded once per rollout: their first load patches
    # ``sys.modules``, which concurrent trial threads must not race on.
    rules: Rules = field(default_factory=load_rules)


@dataclass(frozen=True, slots=True)
class HarnessOutcome:
    returncode: int | None
    timed_out: bool
    wall_s: float
    stdout: str  # the tail
    stderr: str  # the tail


@dataclass(frozen=True, slots=True)
class Ending:
    """How the stages ended, before the stopwatch is read."""

    termination: Termination
    detail: str = ""  # why, for the excluded ones
    events: tuple[DefenseEvent, ...] = ()
    agent: HarnessOutcome | None = None
    grade: GradeResult | None = None


@dataclass(frozen=True, slots=True)
class TrialResult:
    task_id: str
    harness: str
    ending: Ending
    stages: Stages

    @property
    def termination(self) -> str:
        return self.ending.termination.value

    @property
    def reward(self) -> float | None:
        """Only a completed trial has one: an excluded trial never reports a zero."""
        graded = self.ending.grade
        if self.ending.termination is not Termination.COMPLETED or graded is None:
            return None
        return graded.reward


def interpreter_mounts(runtime_dir: Path) -> tuple[Mount, ...]:
    """The base interpreter of the runtime's Python venv (OpenHands), at its own path.

    A venv's ``bin/python`` is a link to the interpreter it was made from (pyenv's, under
    ``/root``), so that installation is mounted read-only where the link points."""
    python = runtime_dir / "py312" / "bin" / "python"
    if not python.is_symlink():
        return ()
    prefix = python.resolve().parent.parent
    if prefix.is_relative_to(runtime_dir.resolve()):
        return ()
    return (Mount(prefix, str(prefix)),)


def proxy_route(host: str, port: int, inside_port: int = INSIDE_PORT) -> ProxyRoute:
    return ProxyRoute(host=host, port=port, inside_port=inside_port)


def run_trial(
    task: Task,
    harness: str,
    endpoint: Endpoint,
    setup: TrialSetup,
    watch: Stopwatch | None = None,
) -> TrialResult:
    """``watch`` may have started earlier (the runner's session bookkeeping is ``other``)."""
    watch = watch or Stopwatch()
    trial_dir = setup.scratch_dir / f"{task.id}-{uuid.uuid4().hex[:10]}"
    try:
        ending = _stages(task, harness, endpoint, setup, watch, trial_dir)
    finally:
        shutil.rmtree(trial_dir, ignore_errors=True)
    return TrialResult(task.id, harness, ending, watch.stages())


def _stages(
    task: Task,
    harness: str,
    endpoint: Endpoint,
    setup: TrialSetup,
    watch: Stopwatch,
    trial_dir: Path,
) -> Ending:
    with watch.stage(Stage.SANDBOX_SETUP):
        try:
            image = build_image(task, setup.cache_dir, setup.sandbox)
        except (TaskError, SandboxError) as exc:
            return Ending(Termination.ENV_SETUP_FAILURE, exc.message)
        workspace = Workspace(
            lower=image.workspace,
            upper=trial_dir / "upper",
            work=trial_dir / "work",
            target=WORKSPACE_TARGET,
        )
        home = trial_dir / "home"
        for directory in (workspace.upper, workspace.work, home):
            directory.mkdir(parents=True)

    with watch.stage(Stage.AGENT_SETUP):
        # The agent's shell gets the image's toolchain first on PATH (its tests run there).
        path = image.env.get("PATH", "/usr/bin:/bin")
        layout = Layout(HOME_TARGET, WORKSPACE_TARGET, RUNTIME_TARGET, path=path)
        inside = endpoint.rebased(f"http://127.0.0.1:{setup.proxy.inside_port}")
        plan = plan_for(harness, layout, inside, task.instruction)
        plan.write_files(home)
        spec = SandboxSpec(
            label=f"agent-{task.id}",
            workspace=workspace,
            mounts=(
                Mount(setup.runtime_dir, RUNTIME_TARGET),
                *interpreter_mounts(setup.runtime_dir),
                Mount(home, HOME_TARGET, writable=True),
                *image.mounts,
            ),
            network=Network.PROXY_ONLY,
            proxy=setup.proxy,
            env={**image.env, **plan.env},
            cwd=WORKSPACE_TARGET,
            uid=SANDBOX_UID,
            gid=SANDBOX_GID,
            timeout_s=task.agent_timeout_s,
        )

    events = image.events
    with watch.stage(Stage.AGENT_EXECUTION):
        try:
            ran = setup.sandbox.run(spec, plan.argv)
        except SandboxError as exc:
            return Ending(Termination.ENV_SETUP_FAILURE, exc.message, events)
    agent = HarnessOutcome(
        returncode=ran.returncode,
        timed_out=ran.timed_out,
        wall_s=ran.wall_s,
        stdout=ran.stdout[-OUTPUT_TAIL:],
        stderr=ran.stderr[-OUTPUT_TAIL:],
    )
    if ran.timed_out:
        limit = f"the agent ran past its limit of {task.agent_timeout_s:g} s"
        return Ending(Termination.AGENT_TIMEOUT, limit, events, agent)
    if ran.returncode != 0:
        detail = f"{harness} exited {ran.returncode}: {ran.stderr[-500:].strip()}"
        return Ending(Termination.HARNESS_ERROR, detail, events, agent)

    with watch.stage(Stage.VERIFICATION):
        try:
            graded = grade(task, image, workspace, setup.grader_sandbox, rules=setup.rules)
        except (TaskError, SandboxError) as exc:
            return Ending(Termination.GRADER_ERROR, exc.message, events, agent)
    events = (*events, *graded.events)
    if graded.termination is not GradeTermination.COMPLETED or graded.reward is None:
        return Ending(Termination.GRADER_ERROR, graded.detail, events, agent, graded)
    return Ending(Termination.COMPLETED, graded.detail, events, agent, graded)
