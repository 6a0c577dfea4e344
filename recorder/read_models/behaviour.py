"""Agent behaviour before vs after training (LEGO-RL Table 9), from the recorded tool calls.

Owns ``INDICATORS`` (what is measured, per session), ``measure(trace)`` (one session's
samples), ``behaviour_of(run, k)`` (a run's numbers: every indicator for the first and
the last third of its graded sessions by creation time, and for all of them, with pass@k
and pass^k over prompt groups) and ``load_behaviour(store, run_id, k)``, which reads the
run through ``recorder.read_models.traces`` (the most recent ``SESSION_LIMIT`` graded
sessions). Everything but ``load_behaviour`` is pure. ``docs/analytics.md`` defines each
indicator for users.

Contract:
- Each indicator names the harnesses whose tools it understands
  (``recorder.read_models.harness_tools``; None: any harness). A session of another
  harness is left out of that indicator and counted in ``not_understood``, never read as
  "no". A session with nothing to measure (no edit, for an indicator about the first
  edit) is counted in ``not_applicable``.
- A value is ``sum(sample.value) / sum(sample.weight)`` over the measured sessions: a
  share of sessions or a mean per session (weight 1 each), or, for the malformed-call
  share, a ratio of pooled counts (malformed blocks over all tool calls).
- The thirds are ``n // 3`` sessions each (none when fewer than three were read).
- pass@k and pass^k (``recorder.read_models.pass_k``) count each slice's prompt groups;
  ``k`` defaults to the most common group size of the whole read, so the thirds are
  compared at the same k.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from recorder.read_models.harness_tools import VOCABULARIES, Vocabulary, exit_status, tool_use
from recorder.read_models.pass_k import PassK, group_size, passes
from recorder.read_models.shell_commands import EXPLORING, Action, ActionKind, same_file
from recorder.read_models.traces import SESSION_LIMIT, SessionTrace, TracedRun, load_traces
from recorder.store import Store


class Unit(StrEnum):
    SESSIONS = "share of sessions"
    COUNT = "mean per session"
    CALLS = "share of tool calls"  # counts pooled over sessions
    FRACTION = "mean fraction per session"

    @property
    def percent(self) -> bool:
        return self is not Unit.COUNT


@dataclass(frozen=True, slots=True)
class Indicator:
    key: str
    label: str
    unit: Unit
    harnesses: frozenset[str] | None  # whose tools it understands; None: any harness
    definition: str


TOOL_HARNESSES = frozenset(VOCABULARIES)
EXIT_HARNESSES = frozenset(h for h, v in VOCABULARIES.items() if v.exit_status is not None)

INDICATORS: tuple[Indicator, ...] = (
    Indicator(
        "reads_back_edit",
        "reads back a file it edited",
        Unit.SESSIONS,
        TOOL_HARNESSES,
        "of sessions that edited a named file: a read of that file after an edit of it",
    ),
    Indicator(
        "runs_tests",
        "runs the test suite",
        Unit.SESSIONS,
        TOOL_HARNESSES,
        "of sessions: a shell command that runs the tests (pytest, tox, make test, ...)",
    ),
    Indicator(
        "explored_before_edit",
        "files explored before the first edit",
        Unit.COUNT,
        TOOL_HARNESSES,
        "per session that edited: distinct paths read, listed or searched before it",
    ),
    Indicator(
        "explicit_finish",
        "ends with an explicit finish",
        Unit.SESSIONS,
        TOOL_HARNESSES,
        "of sessions: the last answer is a final text (stop, no tool call) or finish",
    ),
    Indicator(
        "reproduces_before_edit",
        "reproduces the failure before editing",
        Unit.SESSIONS,
        TOOL_HARNESSES,
        "of sessions that edited: the tests or a script ran before the first edit",
    ),
    Indicator(
        "solves_despite_failure",
        "solves despite a failed command",
        Unit.SESSIONS,
        EXIT_HARNESSES,
        "of graded sessions where a shell command exited non-zero: reward above zero",
    ),
    Indicator(
        "malformed_calls",
        "malformed tool calls",
        Unit.CALLS,
        None,
        "of all tool calls: blocks the parser could not read",
    ),
    Indicator(
        "reasoning_share",
        "reasoning share of the response",
        Unit.FRACTION,
        None,
        "per session: reasoning characters over all answer characters (text, calls)",
    ),
)


@dataclass(frozen=True, slots=True)
class Sample:
    value: float
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class SessionBehaviour:
    id: str
    group_id: str
    harness: str
    created_at: float
    reward: float | None
    # Per indicator that understands the harness: its sample, None when nothing to measure.
    samples: Mapping[str, Sample | None]


@dataclass(frozen=True, slots=True)
class IndicatorValue:
    value: float | None
    sessions: int  # measured (the denominator's sessions)
    not_applicable: int  # understood, nothing to measure
    not_understood: int  # a harness whose tools the indicator does not understand


@dataclass(frozen=True, slots=True)
class Slice:
    name: str
    sessions: int
    since: float | None  # creation time of its first session
    until: float | None  # and of its last
    harnesses: Mapping[str, int]
    indicators: Mapping[str, IndicatorValue]
    passes: PassK


@dataclass(frozen=True, slots=True)
class Behaviour:
    run_id: str
    run_name: str
    graded: int  # graded sessions the run has
    limit: int  # the most recent ones read, at most
    indicators: tuple[Indicator, ...]
    first: Slice
    last: Slice
    all: Slice

    @property
    def read(self) -> int:
        return self.all.sessions


# -- one session ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Walk:
    """A session's tool calls as actions, in order, and what their results showed."""

    actions: tuple[Action, ...]
    failed_command: bool

    @classmethod
    def of(cls, trace: SessionTrace, vocabulary: Vocabulary) -> _Walk:
        actions: list[Action] = []
        failed = False
        for turn in trace.turns:
            for call in turn.calls:
                use = tool_use(vocabulary, call.name, call.arguments)
                actions += use.actions
                if use.shell and call.result is not None:
                    status = exit_status(vocabulary, call.result)
                    failed = failed or (status is not None and status > 0)
        return cls(tuple(actions), failed)

    def first_edit(self) -> int | None:
        return next((i for i, a in enumerate(self.actions) if a.kind is ActionKind.EDIT), None)


def _share(yes: bool) -> Sample:
    return Sample(1.0 if yes else 0.0)


def _reads_back_edit(trace: SessionTrace, walk: _Walk) -> Sample | None:
    edited: list[str] = []
    for action in walk.actions:
        if action.kind is ActionKind.EDIT:
            edited += action.paths
        elif action.kind is ActionKind.READ and any(
            same_file(path, done) for path in action.paths for done in edited
        ):
            return _share(True)
    return _share(False) if edited else None


def _runs_tests(trace: SessionTrace, walk: _Walk) -> Sample | None:
    return _share(any(a.kind is ActionKind.TEST for a in walk.actions))


def _explored_before_edit(trace: SessionTrace, walk: _Walk) -> Sample | None:
    first = walk.first_edit()
    if first is None:
        return None
    seen = {p for a in walk.actions[:first] if a.kind in EXPLORING for p in a.paths}
    return Sample(float(len(seen)))


def _explicit_finish(trace: SessionTrace, walk: _Walk) -> Sample | None:
    if not trace.turns:
        return None
    last = trace.turns[-1]
    final_text = not last.calls and not last.malformed and last.finish_reason == "stop"
    finish_tools = VOCABULARIES[trace.harness].finish
    return _share(final_text or any(c.name in finish_tools for c in last.calls))


def _reproduces_before_edit(trace: SessionTrace, walk: _Walk) -> Sample | None:
    first = walk.first_edit()
    if first is None:
        return None
    runs = (ActionKind.TEST, ActionKind.SCRIPT)
    return _share(any(a.kind in runs for a in walk.actions[:first]))


def _solves_despite_failure(trace: SessionTrace, walk: _Walk) -> Sample | None:
    if trace.reward is None or not walk.failed_command:
        return None
    return _share(trace.reward > 0)


def _malformed_calls(trace: SessionTrace) -> Sample | None:
    malformed = sum(t.malformed for t in trace.turns)
    calls = malformed + sum(len(t.calls) for t in trace.turns)
    return Sample(float(malformed), float(calls)) if calls else None


def _reasoning_share(trace: SessionTrace) -> Sample | None:
    reasoning = sum(len(t.reasoning or "") for t in trace.turns)
    text = sum(
        len(t.content) + sum(len(c.name) + len(c.arguments) for c in t.calls) for t in trace.turns
    )
    total = reasoning + text
    return Sample(reasoning / total) if total else None


_WalkMeasure = Callable[[SessionTrace, _Walk], Sample | None]
_TraceMeasure = Callable[[SessionTrace], Sample | None]
_BY_WALK: Mapping[str, _WalkMeasure] = {
    "reads_back_edit": _reads_back_edit,
    "runs_tests": _runs_tests,
    "explored_before_edit": _explored_before_edit,
    "explicit_finish": _explicit_finish,
    "reproduces_before_edit": _reproduces_before_edit,
    "solves_despite_failure": _solves_despite_failure,
}
_BY_TRACE: Mapping[str, _TraceMeasure] = {
    "malformed_calls": _malformed_calls,
    "reasoning_share": _reasoning_share,
}


def understands(indicator: Indicator, harness: str) -> bool:
    return indicator.harnesses is None or harness in indicator.harnesses


def measure(trace: SessionTrace) -> SessionBehaviour:
    vocabulary = VOCABULARIES.get(trace.harness)
    walk = _Walk.of(trace, vocabulary) if vocabulary is not None else None
    samples: dict[str, Sample | None] = {}
    for indicator in INDICATORS:
        if not understands(indicator, trace.harness):
            continue
        if indicator.key in _BY_TRACE:
            samples[indicator.key] = _BY_TRACE[indicator.key](trace)
        elif walk is not None:
            samples[indicator.key] = _BY_WALK[indicator.key](trace, walk)
    return SessionBehaviour(
        trace.id, trace.group_id, trace.harness, trace.created_at, trace.reward, samples
    )


# -- a run --------------------------------------------------------------------------------------


def aggregate(indicator: Indicator, sessions: Sequence[SessionBehaviour]) -> IndicatorValue:
    measured: list[Sample] = []
    not_applicable = not_understood = 0
    for session in sessions:
        if indicator.key not in session.samples:
            not_understood += 1
            continue
        sample = session.samples[indicator.key]
        if sample is None:
            not_applicable += 1
        else:
            measured.append(sample)
    weight = sum(s.weight for s in measured)
    value = sum(s.value for s in measured) / weight if weight else None
    return IndicatorValue(value, len(measured), not_applicable, not_understood)


def slice_of(name: str, sessions: Sequence[SessionBehaviour], k: int | None) -> Slice:
    return Slice(
        name=name,
        sessions=len(sessions),
        since=sessions[0].created_at if sessions else None,
        until=sessions[-1].created_at if sessions else None,
        harnesses=dict(sorted(Counter(s.harness for s in sessions).items())),
        indicators={i.key: aggregate(i, sessions) for i in INDICATORS},
        passes=passes([(s.group_id, s.reward) for s in sessions], k),
    )


def behaviour_of(run: TracedRun[SessionBehaviour], k: int | None = None) -> Behaviour:
    """``run.items`` oldest first; ``k`` None: the most common group size."""
    ordered = sorted(run.items, key=lambda s: (s.created_at, s.id))
    chosen = k if k is not None else group_size([(s.group_id, s.reward) for s in ordered])
    third = len(ordered) // 3
    return Behaviour(
        run_id=run.run_id,
        run_name=run.run_name,
        graded=run.graded,
        limit=run.limit,
        indicators=INDICATORS,
        first=slice_of("first third", ordered[:third], chosen),
        last=slice_of("last third", ordered[len(ordered) - third :], chosen),
        all=slice_of("all", ordered, chosen),
    )


async def load_behaviour(
    store: Store, run_id: str, k: int | None = None, *, limit: int = SESSION_LIMIT
) -> Behaviour:
    return behaviour_of(await load_traces(store, run_id, measure, limit=limit), k)
