"""The closed loop: validation run, then rollouts and trainer steps side by side.

``run_loop(config, parts)`` runs LEGO-RL's workflow (Figure 2) as one job:

1. **Validation run.** ``config.check_trials`` trials (one per task, the first tasks of the
   pool) with purpose ``check``: each must end graded. One that ends excluded (the image
   does not build, the grader fails, the harness times out) stops the loop with that
   trial's task, termination and reason, before anything is trained.
2. **Rollouts**, on their own thread, one epoch at a time (every kept task, ``group_size``
   samples, group ``<task>.e<epoch>``). They keep going while the trainer steps, at most
   ``max_staleness`` epochs ahead of it (the export holds back older groups anyway). After
   each epoch the groups' in-batch success counts feed task selection (``loop.selection``).
3. **Trainer steps**, through ``parts.train`` (``trainer_bridge.train.run`` in this
   process, or an external trainer the loop only watches). Each step publishes its weights
   to the backend, which labels every later turn with the new version. After each step:
   every ``validate_every`` steps a held-out evaluation (one sample per held-out task at
   ``validation_temperature``, purpose ``validation``, group ``val-s<step>.<task>.e0``);
   then the collapse rules (``loop.collapse``) over the steps so far. A rule that trips
   stops the loop, or pauses the run at the proxy (``on_collapse``), and says which series.

Everything reaches the proxy over HTTP (``rollouts.control``); trials are
``rollouts.trial.run_trial`` bound by the caller. The outcome (``LoopResult``) holds the
wall time of each phase, the step reports, the validation points, the selection and why
the loop ended.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from kernel.errors import LegoError
from loop.collapse import DEFAULT_RULES, CollapseRule, Tripped, check
from loop.selection import GroupOutcome, Selection
from rollouts.control import ControlClient
from rollouts.runner import Finished, Progress, RolloutConfig, Trial, run_rollout
from tasks.spec import Task

OnCollapse = Literal["stop", "pause"]


class LoopStopped(LegoError):
    """The loop could not go on (its validation run failed, every task was set aside)."""


@dataclass(frozen=True, slots=True)
class LoopConfig:
    run_id: str
    harness: str
    group_size: int
    steps: int
    concurrency: int = 1
    check_trials: int = 2
    validate_every: int | None = None  # K: a held-out evaluation every K steps
    validation_temperature: float = 0.7
    max_staleness: int = 1
    set_aside_after: int | None = None
    collapse_rules: tuple[CollapseRule, ...] = DEFAULT_RULES
    on_collapse: OnCollapse = "stop"

    def __post_init__(self) -> None:
        for name in ("group_size", "steps", "concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.validate_every is not None and self.validate_every < 1:
            raise ValueError("validate_every must be at least 1 (or None: never)")
        if self.check_trials < 0 or self.max_staleness < 0:
            raise ValueError("check_trials and max_staleness must not be negative")


@dataclass(frozen=True, slots=True)
class StepSeen:
    """One trainer step as the loop saw it (from its report, or the proxy's record)."""

    step: int
    weight_version: str
    metrics: dict[str, float | None]
    flagged: bool
    reasons: tuple[str, ...]
    claim_s: float = 0.0
    optimize_s: float = 0.0
    publish_s: float = 0.0


# The trainer: called with (after_step, stop); returns when done. after_step(step) -> go on?
Train = Callable[[Callable[[StepSeen], bool], threading.Event], None]


@dataclass(frozen=True, slots=True)
class LoopParts:
    control: ControlClient
    trial: Trial
    tasks: Sequence[Task]
    held_out: Sequence[Task]
    train: Train
    progress: Progress = print


@dataclass(frozen=True, slots=True)
class ValidationPoint:
    step: int
    mean_reward: float | None  # None: no held-out trial graded
    graded: int
    trials: int


@dataclass
class Phases:
    """Wall seconds per phase. Rollouts and training overlap: their sum exceeds the total."""

    check: float = 0.0
    rollouts: float = 0.0
    train_wait: float = 0.0
    train_optimize: float = 0.0
    train_publish: float = 0.0
    validation: float = 0.0
    total: float = 0.0

    def lines(self) -> list[str]:
        rows = [
            ("validation run (before training)", self.check),
            ("rollouts (own thread)", self.rollouts),
            ("trainer: waiting for groups", self.train_wait),
            ("trainer: optimizing", self.train_optimize),
            ("trainer: publishing weights", self.train_publish),
            ("held-out validation", self.validation),
            ("total wall time", self.total),
        ]
        return [f"  {name:<36} {seconds:8.1f} s" for name, seconds in rows]


@dataclass(frozen=True, slots=True)
class LoopResult:
    ended: str  # why the loop ended, in words
    steps: tuple[StepSeen, ...]
    validation: tuple[ValidationPoint, ...]
    selection: Selection
    epochs: int
    trials: int
    phases: Phases
    collapse: tuple[Tripped, ...] = ()

    def render(self) -> str:
        lines = [f"loop ended: {self.ended}", f"{len(self.steps)} trainer step(s):"]
        for s in self.steps:
            flag = f"  FLAGGED: {'; '.join(s.reasons)}" if s.flagged else ""
            reward = s.metrics.get("mean_reward")
            shown = "-" if reward is None else f"{reward:.3f}"
            lines.append(f"  step {s.step}: published {s.weight_version}, reward {shown}{flag}")
        for point in self.validation:
            shown = "-" if point.mean_reward is None else f"{point.mean_reward:.3f}"
            lines.append(
                f"validation after step {point.step}: reward {shown} "
                f"({point.graded}/{point.trials} graded)"
            )
        for epoch in range(self.epochs):
            stats = self.selection.epoch(epoch)
            share = stats.zero_variance_share
            hist = ", ".join(
                f"{k}/{self_n(self.selection, epoch)}: {n}" for k, n in stats.histogram
            )
            lines.append(
                f"epoch {epoch}: {stats.groups} group(s), successes [{hist}], zero-variance "
                f"{'-' if share is None else f'{share:.0%}'}"
            )
        for task_id, why in self.selection.set_aside().items():
            lines.append(f"set aside: {task_id} ({why})")
        lines.append(f"{self.trials} training trial(s); wall time by phase:")
        lines += self.phases.lines()
        return "\n".join(lines)


def self_n(selection: Selection, epoch: int) -> str:
    """The N of "k/N" in an epoch's histogram (the group size, or "N" if it varied)."""
    sizes = {o.graded for o in selection.outcomes if o.epoch == epoch and o.graded}
    return str(sizes.pop()) if len(sizes) == 1 else "N"


def group_outcomes(done: Sequence[Finished]) -> list[GroupOutcome]:
    """k of N per (task, epoch) group of an epoch's finished trials."""
    groups: dict[tuple[str, int], list[float | None]] = {}
    for item in done:
        groups.setdefault((item.job.task.id, item.job.epoch), []).append(item.result.reward)
    return [
        GroupOutcome(
            task_id,
            epoch,
            successes=sum(1 for r in rewards if r is not None and r > 0),
            graded=sum(1 for r in rewards if r is not None),
        )
        for (task_id, epoch), rewards in groups.items()
    ]


@dataclass
class _State:
    lock: threading.Lock = field(default_factory=threading.Lock)
    steps: list[StepSeen] = field(default_factory=list)
    validation: list[ValidationPoint] = field(default_factory=list)
    selection: Selection = field(default_factory=Selection)
    epochs: int = 0
    trials: int = 0
    ended: str | None = None
    tripped: tuple[Tripped, ...] = ()
    error: BaseException | None = None
    stepped: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self.stepped = threading.Condition(self.lock)

    def end(self, why: str) -> None:
        with self.lock:
            if self.ended is None:
                self.ended = why
            self.stepped.notify_all()


def run_loop(config: LoopConfig, parts: LoopParts) -> LoopResult:
    began = time.monotonic()
    phases = Phases()
    state = _State(selection=Selection(config.set_aside_after))
    stop = threading.Event()
    say = parts.progress

    parts.control.check_run(config.run_id)
    if not parts.tasks:
        raise LoopStopped("the pool has no task to train on")
    at = time.monotonic()
    _validation_run(config, parts)
    phases.check = time.monotonic() - at

    def rollouts() -> None:
        try:
            _rollouts(config, parts, state, stop, phases)
        except BaseException as exc:
            with state.lock:
                state.error = state.error or exc
            state.end(f"the rollouts failed: {exc}")
            stop.set()

    def after_step(step: StepSeen) -> bool:
        last = step.step >= config.steps
        if last:
            stop.set()  # before the rollouts hear of this step: no epoch nobody trains on
        with state.lock:
            state.steps.append(step)
            phases.train_wait += step.claim_s
            phases.train_optimize += step.optimize_s
            phases.train_publish += step.publish_s
            state.stepped.notify_all()
        say(f"trainer step {step.step} published {step.weight_version}")
        if config.validate_every and step.step % config.validate_every == 0 and parts.held_out:
            at = time.monotonic()
            state.validation.append(_held_out(config, parts, step.step))
            phases.validation += time.monotonic() - at
        tripped = check(config.collapse_rules, [s.metrics for s in state.steps])
        if tripped:
            state.tripped = tuple(tripped)
            what = "; ".join(t.describe() for t in tripped)
            if config.on_collapse == "pause":
                parts.control.pause(config.run_id)
                state.end(f"collapse: {what}; the run is paused at the proxy")
            else:
                state.end(f"collapse: {what}")
            stop.set()
            return False
        if last:
            state.end(f"{config.steps} trainer step(s) done")
            return False
        return not stop.is_set()

    producer = threading.Thread(target=rollouts, name="loop-rollouts", daemon=True)
    producer.start()
    try:
        parts.train(after_step, stop)
    except BaseException as exc:
        with state.lock:
            state.error = state.error or exc
        raise
    finally:
        state.end("the trainer stopped")
        stop.set()
        producer.join()
    if state.error is not None:
        raise state.error
    phases.total = time.monotonic() - began
    return LoopResult(
        ended=state.ended or "done",
        steps=tuple(state.steps),
        validation=tuple(state.validation),
        selection=state.selection,
        epochs=state.epochs,
        trials=state.trials,
        phases=phases,
        collapse=state.tripped,
    )


def _validation_run(config: LoopConfig, parts: LoopParts) -> None:
    if config.check_trials == 0:
        return
    tasks = list(parts.tasks[: config.check_trials])
    parts.progress(f"validation run: {len(tasks)} trial(s) that must all grade")
    rollout = RolloutConfig(
        run_id=config.run_id,
        harness=config.harness,
        group_size=1,
        concurrency=config.concurrency,
        purpose="check",
        group_prefix="check.",
    )
    done = run_rollout(parts.control, tasks, rollout, parts.trial, parts.progress)
    failed = [item for item in done if item.result.reward is None]
    if failed:
        why = "; ".join(
            f"task {f.job.task.id}: {f.termination}: {f.result.ending.detail[:300]}" for f in failed
        )
        raise LoopStopped(f"the environment failed its validation run, nothing was trained ({why})")


def _rollouts(
    config: LoopConfig, parts: LoopParts, state: _State, stop: threading.Event, phases: Phases
) -> None:
    ids = [task.id for task in parts.tasks]
    epoch = 0
    while not stop.is_set():
        with state.lock:
            # Within the staleness bound: epoch e waits until step e - max_staleness is done.
            while epoch - len(state.steps) > config.max_staleness and not stop.is_set():
                state.stepped.wait(timeout=1.0)
        if stop.is_set():
            return
        kept = set(state.selection.keep(ids))
        tasks = [task for task in parts.tasks if task.id in kept]
        if not tasks:
            state.end("every task is set aside (0/N or N/N for the last epochs): nothing to learn")
            stop.set()
            return
        at = time.monotonic()
        rollout = RolloutConfig(
            run_id=config.run_id,
            harness=config.harness,
            group_size=config.group_size,
            concurrency=config.concurrency,
            first_epoch=epoch,
        )
        done = run_rollout(parts.control, tasks, rollout, parts.trial, parts.progress)
        phases.rollouts += time.monotonic() - at
        outcomes = group_outcomes(done)
        before = state.selection.set_aside()
        with state.lock:
            state.selection = state.selection.with_groups(outcomes)
            state.trials += len(done)
            state.epochs = epoch + 1
        stats = state.selection.epoch(epoch)
        share = stats.zero_variance_share
        parts.progress(
            f"epoch {epoch} done: {stats.groups} group(s), zero-variance "
            f"{'-' if share is None else f'{share:.0%}'}"
        )
        for task_id, why in state.selection.set_aside().items():
            if task_id not in before:
                parts.progress(f"set aside {task_id}: {why}")
        epoch += 1


def _held_out(config: LoopConfig, parts: LoopParts, step: int) -> ValidationPoint:
    rollout = RolloutConfig(
        run_id=config.run_id,
        harness=config.harness,
        group_size=1,
        concurrency=config.concurrency,
        purpose="validation",
        group_prefix=f"val-s{step}.",
        sampling=(("temperature", config.validation_temperature),),
    )
    done = run_rollout(parts.control, parts.held_out, rollout, parts.trial, parts.progress)
    rewards = [item.result.reward for item in done if item.result.reward is not None]
    mean = sum(rewards) / len(rewards) if rewards else None
    parts.progress(f"validation after step {step}: reward {mean} over {len(rewards)} graded")
    return ValidationPoint(step, mean, len(rewards), len(done))
