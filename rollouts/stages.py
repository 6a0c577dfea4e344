"""A trial's stages (Table 4 of the paper) and the stopwatch that times them.

``Stopwatch.stage(Stage.X)`` times one stage (a stage entered twice adds up);
``Stopwatch.stages()`` closes the books: ``other`` is the wall time since the stopwatch
started that no named stage holds (session bookkeeping, directory clean-up). The result,
``Stages``, is what the finish body's ``stages`` carries, in seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum


class Stage(StrEnum):
    SANDBOX_SETUP = "sandbox_setup"  # task image from the cache, per-trial directories
    AGENT_SETUP = "agent_setup"  # harness config written, runtime mounted
    AGENT_EXECUTION = "agent_execution"  # the harness CLI in the sandbox
    VERIFICATION = "verification"  # the grader in a fresh sandbox
    OTHER = "other"  # everything else the trial's wall time holds


@dataclass(frozen=True, slots=True)
class Stages:
    sandbox_setup: float = 0.0
    agent_setup: float = 0.0
    agent_execution: float = 0.0
    verification: float = 0.0
    other: float = 0.0

    def get(self, stage: Stage) -> float:
        value: float = getattr(self, stage.value)
        return value

    @property
    def total(self) -> float:
        return sum(self.get(stage) for stage in Stage)

    def as_json(self) -> dict[str, float]:
        return {stage.value: round(self.get(stage), 6) for stage in Stage}


class Stopwatch:
    """Not thread-safe: one per trial."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._start = clock()
        self._spent: dict[Stage, float] = {}

    @contextmanager
    def stage(self, stage: Stage) -> Iterator[None]:
        if stage is Stage.OTHER:
            raise ValueError("'other' is what no named stage holds; it is not timed itself")
        began = self._clock()
        try:
            yield
        finally:
            self._spent[stage] = self._spent.get(stage, 0.0) + self._clock() - began

    def stages(self) -> Stages:
        named = {stage.value: seconds for stage, seconds in self._spent.items()}
        other = max(0.0, self._clock() - self._start - sum(named.values()))
        return Stages(**named, other=other)
