"""The rollout runner: every (epoch, task, sample) becomes a session, a trial, a finish.

``run_rollout(control, tasks, config, trial)`` checks the run first (wrong admin key,
unknown run, unreachable proxy: a ``ConfigurationError`` before anything starts), then
runs ``config.concurrency`` trials at a time on worker threads. Each job

1. creates its session (task id, group id ``<task>.e<epoch>``, sample index, group size,
   harness) through the control API,
2. runs ``trial(task, harness, endpoint, stopwatch)`` (``rollouts.trial.run_trial`` bound
   to a ``TrialSetup``; the stopwatch started before the session was made, so the
   bookkeeping is the ``other`` stage),
3. finishes the session with the trial's termination, reward, per-test results, stage
   times and defense events (``finish_body``).

A progress line goes to ``progress`` after each trial. An error of the runner itself (the
control API refuses a finish) stops new jobs, lets the running ones end, and is raised;
nothing here kills sandboxes: each backend ties its sandboxes to this process's life.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from pydantic import JsonValue

from rollouts.control import ControlClient, Finish, NewSession
from rollouts.harnesses import HARNESSES, Endpoint
from rollouts.stages import Stages, Stopwatch
from rollouts.trial import TrialResult
from tasks.events import DefenseEvent
from tasks.spec import Task

Trial = Callable[[Task, str, Endpoint, Stopwatch], TrialResult]
Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class RolloutConfig:
    run_id: str
    harness: str
    group_size: int
    epochs: int = 1
    concurrency: int = 1
    first_epoch: int = 0  # the loop runs one epoch at a time: e3 is its fourth pass
    purpose: str = "train"  # recorder.records.PURPOSES: only "train" is ever exported
    group_prefix: str = ""  # e.g. "val-s3." for the held-out evaluation after step 3
    sampling: tuple[tuple[str, float], ...] = ()  # pinned per session (temperature, ...)

    def __post_init__(self) -> None:
        if self.harness not in HARNESSES:
            raise ValueError(f"unknown harness {self.harness!r}; one of {', '.join(HARNESSES)}")
        for name in ("group_size", "epochs", "concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")


@dataclass(frozen=True, slots=True)
class Job:
    task: Task
    epoch: int
    sample_index: int
    prefix: str = ""

    @property
    def group_id(self) -> str:
        return f"{self.prefix}{self.task.id}.e{self.epoch}"


@dataclass(frozen=True, slots=True)
class Finished:
    job: Job
    session_id: str
    result: TrialResult

    @property
    def termination(self) -> str:
        return self.result.termination

    @property
    def stages(self) -> Stages:
        return self.result.stages


def jobs(tasks: Sequence[Task], config: RolloutConfig) -> list[Job]:
    """Epoch by epoch, task by task, every sample of a group next to each other."""
    return [
        Job(task, epoch, index, config.group_prefix)
        for epoch in range(config.first_epoch, config.first_epoch + config.epochs)
        for task in tasks
        for index in range(config.group_size)
    ]


def reward_details(result: TrialResult) -> dict[str, JsonValue] | None:
    """Per-test results (SWE-bench's rule per test), and why an excluded trial ended."""
    ending = result.ending
    details: dict[str, JsonValue] = {}
    if ending.detail:
        details["reason"] = ending.detail
    if ending.grade is not None:
        details["tests"] = [
            {
                "id": test.test_id,
                "expected": test.expected.value,
                "status": test.status,
                "passed": test.passed,
            }
            for test in ending.grade.tests
        ]
    if ending.agent is not None:
        details["harness_exit"] = ending.agent.returncode
    return details or None


def finish_body(result: TrialResult) -> Finish:
    ending = result.ending
    details = reward_details(result)
    return Finish(
        termination=result.termination,
        reward=result.reward,
        reward_details=details,
        stages=result.stages.as_json(),
        events=[_event_json(event) for event in ending.events],
    )


def _event_json(event: DefenseEvent) -> dict[str, JsonValue]:
    return {"kind": event.kind.value, "detail": event.detail, "items": list(event.items)}


def run_rollout(
    control: ControlClient,
    tasks: Sequence[Task],
    config: RolloutConfig,
    trial: Trial,
    progress: Progress = print,
) -> list[Finished]:
    control.check_run(config.run_id)
    todo = jobs(tasks, config)
    done: list[Finished] = []
    lock = threading.Lock()
    stop = threading.Event()

    def one(job: Job) -> None:
        if stop.is_set():
            return
        try:
            trial_job(job)
        except BaseException:
            stop.set()  # here, in the worker, so that no later job of any worker starts
            raise

    def trial_job(job: Job) -> None:
        watch = Stopwatch()
        body = NewSession(
            task_id=job.task.id,
            group_id=job.group_id,
            sample_index=job.sample_index,
            group_size=config.group_size,
            harness=config.harness,
            purpose=config.purpose,
            sampling=dict(config.sampling),
        )
        session = control.create_session(config.run_id, body)
        endpoint = Endpoint(session.key, session.openai_base_url, session.anthropic_base_url)
        result = trial(job.task, config.harness, endpoint, watch)
        control.finish(session.id, finish_body(result))
        with lock:
            done.append(Finished(job, session.id, result))
            count = len(done)
        reward = "-" if result.reward is None else f"{result.reward:g}"
        why = f": {result.ending.detail[:300]}" if result.reward is None else ""
        progress(
            f"[{count}/{len(todo)}] {job.group_id} #{job.sample_index} {config.harness}: "
            f"{result.termination} reward={reward} ({result.stages.total:.1f} s){why}"
        )

    with ThreadPoolExecutor(config.concurrency, thread_name_prefix="trial") as pool:
        futures: list[Future[None]] = [pool.submit(one, job) for job in todo]
        finished, _ = wait(futures, return_when=FIRST_EXCEPTION)
        failed = [f for f in finished if f.exception() is not None]
        if failed:
            for future in futures:
                future.cancel()
            wait(futures)
            error = failed[0].exception()
            assert error is not None
            raise error
    return done
