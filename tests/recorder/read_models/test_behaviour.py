"""Behaviour indicators (LEGO-RL Table 9) on synthetic sessions of each real harness: each
indicator with a session that shows it and one that does not, harnesses an indicator does
not understand left out of its denominator, the first vs last third of a run, pass@k and
pass^k worked by hand; then the same numbers read from a recorded run (SQLite, Postgres)."""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Callable

import pytest

from kernel.errors import NotFound
from proxy.canonical import ChatRequest, Message, ToolCall
from recorder.read_models.behaviour import (
    INDICATORS,
    SessionBehaviour,
    behaviour_of,
    load_behaviour,
    measure,
)
from recorder.read_models.pass_k import PassK
from recorder.read_models.traces import (
    SessionTrace,
    TracedCall,
    TracedRun,
    TracedTurn,
    load_traces,
)
from recorder.records import SessionSpec, TurnRecord, TurnStatus
from recorder.store import Store
from tests.proxy.test_conversations import SYSTEM, USER, Harness

HARNESSES = ("claude-code", "opencode", "codex", "openhands")
TOOL_INDICATORS = tuple(i.key for i in INDICATORS if i.harnesses is not None)
FILE = "src/calc.py"
OTHER = "src/util.py"

# -- synthetic sessions, each harness with its own tools ------------------------------------


def call(name: str, result: str | None = None, **arguments: object) -> TracedCall:
    return TracedCall(name, json.dumps(arguments), result)


def shell(harness: str, command: str, result: str | None = None) -> TracedCall:
    if harness == "claude-code":
        return call("Bash", result, command=command, description="run")
    if harness == "opencode":
        return call("bash", result, command=command, description="run")
    if harness == "codex":
        return call("exec_command", result, cmd=command)
    return call("terminal", result, command=command, summary="run", security_risk="LOW")


def read(harness: str, path: str) -> TracedCall:
    absolute = f"/repo/{path}"  # file tools name files absolutely
    if harness == "claude-code":
        return call("Read", "1\tdef clamp", file_path=absolute)
    if harness == "opencode":
        return call("read", "1: def clamp", filePath=absolute)
    if harness == "codex":
        return shell(harness, f"sed -n '1,80p' {path}", "Process exited with code 0")
    return call("file_editor", "def clamp", command="view", path=absolute)


def edit(harness: str, path: str) -> TracedCall:
    absolute = f"/repo/{path}"
    if harness == "claude-code":
        return call("Edit", "ok", file_path=absolute, old_string="low", new_string="high")
    if harness == "opencode":
        return call("edit", "ok", filePath=absolute, oldString="low", newString="high")
    if harness == "codex":
        patch = f"apply_patch <<'EOF'\n*** Begin Patch\n*** Update File: {path}\n*** End Patch\nEOF"
        return shell(harness, patch, "Process exited with code 0\nOutput:\nDone!")
    return call("file_editor", "ok", command="str_replace", path=absolute, old_str="a")


FAILED = {
    "claude-code": "Exit code 1\nFAILED tests/test_calc.py::test_clamp",
    "codex": "Chunk ID: 1\nProcess exited with code 1\nOutput:\n1 failed",
    "openhands": "1 failed\n[Command finished with exit code 1]",
    "opencode": "1 failed",  # OpenCode's result never says
}
PASSED = {
    "claude-code": "3 passed",
    "codex": "Chunk ID: 2\nProcess exited with code 0\nOutput:\n3 passed",
    "openhands": "3 passed\n[Command finished with exit code 0]",
    "opencode": "3 passed",
}


def turn(
    *calls: TracedCall,
    text: str = "",
    reasoning: str | None = None,
    malformed: int = 0,
    finish: str | None = None,
) -> TracedTurn:
    reason = finish or ("tool_calls" if calls else "stop")
    return TracedTurn(text, reasoning, calls, malformed, reason)


DONE = turn(text="Fixed: clamp returns the upper bound.")


def trace(
    harness: str,
    *turns: TracedTurn,
    reward: float | None = 1.0,
    group: str = "g",
    created: float = 0.0,
) -> SessionTrace:
    return SessionTrace(uuid.uuid4().hex, group, harness, created, reward, turns)


def sample(harness: str, key: str, *turns: TracedTurn, reward: float | None = 1.0) -> float | None:
    """The indicator's sample for one session (None: nothing to measure)."""
    measured = measure(trace(harness, *turns, reward=reward)).samples
    assert key in measured, f"{key} should understand {harness}"
    found = measured[key]
    return None if found is None else found.value / found.weight


# -- each indicator: a session that shows it, one that does not -------------------------------


@pytest.mark.parametrize("harness", HARNESSES)
def test_reads_back_a_file_it_edited(harness: str) -> None:
    key = "reads_back_edit"
    back = sample(harness, key, turn(read(harness, FILE)), turn(edit(harness, FILE)))
    assert back == 0.0  # read before the edit only
    back = sample(harness, key, turn(edit(harness, FILE)), turn(read(harness, FILE)), DONE)
    assert back == 1.0
    other = sample(harness, key, turn(edit(harness, FILE)), turn(read(harness, OTHER)), DONE)
    assert other == 0.0
    assert sample(harness, key, turn(read(harness, FILE)), DONE) is None  # never edited


@pytest.mark.parametrize("harness", HARNESSES)
def test_runs_the_test_suite(harness: str) -> None:
    key = "runs_tests"
    tests = turn(shell(harness, "cd /repo && python -m pytest -q tests", PASSED[harness]))
    assert sample(harness, key, turn(edit(harness, FILE)), tests, DONE) == 1.0
    listing = turn(shell(harness, "ls tests && cat tests/test_calc.py", PASSED[harness]))
    assert sample(harness, key, listing, turn(edit(harness, FILE)), DONE) == 0.0


@pytest.mark.parametrize("harness", HARNESSES)
def test_files_explored_before_the_first_edit(harness: str) -> None:
    key = "explored_before_edit"
    explore = turn(shell(harness, "ls src && grep -rn clamp src tests", "..."))
    reads = turn(read(harness, FILE), read(harness, OTHER), read(harness, FILE))
    later = turn(read(harness, "README.md"))
    # ls src, grep src + tests, the two files (one read twice); README comes after the edit.
    explored = sample(harness, key, explore, reads, turn(edit(harness, FILE)), later, DONE)
    assert explored == 4.0
    assert sample(harness, key, turn(edit(harness, FILE)), reads, DONE) == 0.0
    assert sample(harness, key, explore, reads, DONE) is None  # no edit


@pytest.mark.parametrize("harness", HARNESSES)
def test_ends_with_an_explicit_finish(harness: str) -> None:
    key = "explicit_finish"
    assert sample(harness, key, turn(edit(harness, FILE)), DONE) == 1.0
    assert sample(harness, key, turn(read(harness, FILE)), turn(edit(harness, FILE))) == 0.0
    cut = turn(text="I will now", finish="length")  # the token budget ended it
    assert sample(harness, key, turn(edit(harness, FILE)), cut) == 0.0
    broken = turn(text='<tool_call>\n{"name": oops}\n</tool_call>', malformed=1)
    assert sample(harness, key, turn(edit(harness, FILE)), broken) == 0.0
    assert sample(harness, key) is None  # no turn at all


def test_openhands_finishes_with_its_finish_tool_too() -> None:
    finish = turn(call("finish", "", message="Fixed."))
    assert sample("openhands", "explicit_finish", turn(edit("openhands", FILE)), finish) == 1.0
    # The same name is no finish for a harness that has no such tool.
    finish = turn(call("finish", "", message="Fixed."))
    assert sample("codex", "explicit_finish", turn(edit("codex", FILE)), finish) == 0.0


@pytest.mark.parametrize("harness", HARNESSES)
def test_reproduces_the_failure_before_editing(harness: str) -> None:
    key = "reproduces_before_edit"
    for run in ("python -m pytest tests/test_calc.py", "python reproduce.py"):
        first = turn(shell(harness, run, FAILED[harness]))
        assert sample(harness, key, first, turn(edit(harness, FILE)), DONE) == 1.0
    after = turn(shell(harness, "python -m pytest", PASSED[harness]))
    assert sample(harness, key, turn(edit(harness, FILE)), after, DONE) == 0.0
    assert sample(harness, key, after, DONE) is None  # no edit


@pytest.mark.parametrize("harness", ["claude-code", "codex", "openhands"])
def test_solves_despite_a_failed_command(harness: str) -> None:
    key = "solves_despite_failure"
    failed = turn(shell(harness, "python -m pytest", FAILED[harness]))
    passed = turn(shell(harness, "python -m pytest", PASSED[harness]))
    fixed = (failed, turn(edit(harness, FILE)), passed, DONE)
    assert sample(harness, key, *fixed, reward=1.0) == 1.0
    assert sample(harness, key, *fixed, reward=0.0) == 0.0
    assert sample(harness, key, passed, DONE, reward=1.0) is None  # nothing failed
    assert sample(harness, key, *fixed, reward=None) is None  # ungraded or a vector
    unanswered = turn(shell(harness, "python -m pytest"))  # no result came back
    assert sample(harness, key, unanswered, reward=1.0) is None


def test_opencode_results_carry_no_exit_status_so_failures_are_not_read_from_them() -> None:
    failed = turn(shell("opencode", "python -m pytest", "Exit code 1\n1 failed"))
    measured = measure(trace("opencode", failed, DONE)).samples
    assert "solves_despite_failure" not in measured


def test_malformed_tool_calls_are_a_share_of_all_calls_pooled_over_sessions() -> None:
    first = trace(
        "opencode", turn(edit("opencode", FILE), malformed=1), turn(read("opencode", FILE))
    )
    second = trace("codex", turn(shell("codex", "ls")), DONE)
    silent = trace("codex", DONE)  # no call at all: nothing to measure
    sessions = [measure(t) for t in (first, second, silent)]
    value = behaviour_of(run(sessions)).all.indicators["malformed_calls"]
    # (1 malformed) / (1 malformed + 2 calls + 1 call), not the mean of 1/3 and 0/1.
    assert value.value == pytest.approx(1 / 4)
    assert (value.sessions, value.not_applicable, value.not_understood) == (2, 1, 0)


def test_reasoning_share_counts_characters_of_reasoning_over_the_whole_answer() -> None:
    bash = call("bash", None, command="ls")  # name "bash" + arguments '{"command": "ls"}'
    thinking = turn(bash, reasoning="x" * 30, text="y" * 10)
    calls = len("bash") + len(bash.arguments)
    share = sample("opencode", "reasoning_share", thinking, turn(text="z" * 20))
    assert share == pytest.approx(30 / (30 + 10 + calls + 20))
    assert sample("opencode", "reasoning_share", turn(text="no reasoning")) == 0.0
    assert sample("opencode", "reasoning_share") is None


# -- a run --------------------------------------------------------------------------------------


def run(sessions: list[SessionBehaviour], graded: int | None = None) -> TracedRun[SessionBehaviour]:
    count = len(sessions) if graded is None else graded
    return TracedRun("run", "a run", count, 2000, tuple(sessions))


def test_an_unknown_harness_is_left_out_of_the_tool_indicators_never_counted_as_no() -> None:
    known = measure(trace("codex", turn(shell("codex", "pytest", FAILED["codex"])), DONE))
    unknown = measure(trace("my-harness", turn(call("run", None, cmd="pytest")), DONE))
    assert set(unknown.samples) == {"malformed_calls", "reasoning_share"}
    result = behaviour_of(run([known, unknown])).all
    tests = result.indicators["runs_tests"]
    assert (tests.value, tests.sessions, tests.not_understood) == (1.0, 1, 1)
    for key in TOOL_INDICATORS:
        assert result.indicators[key].not_understood == 1
    assert result.indicators["malformed_calls"].not_understood == 0
    assert result.harnesses == {"codex": 1, "my-harness": 1}


def test_the_first_third_and_the_last_third_are_split_by_creation_time() -> None:
    # Seven sessions, given out of order: thirds of two; the early ones never run tests.
    def session(created: float) -> SessionBehaviour:
        command = "pytest" if created >= 5 else "ls"
        return measure(trace("codex", turn(shell("codex", command)), DONE, created=created))

    made = [session(float(t)) for t in (6, 0, 3, 1, 5, 2, 4)]
    behaviour = behaviour_of(run(made, graded=9))
    assert behaviour.graded == 9
    assert behaviour.read == 7
    first, last = behaviour.first, behaviour.last
    assert (first.sessions, first.since, first.until) == (2, 0.0, 1.0)
    assert (last.sessions, last.since, last.until) == (2, 5.0, 6.0)
    assert first.indicators["runs_tests"].value == 0.0
    assert last.indicators["runs_tests"].value == 1.0
    assert behaviour.all.indicators["runs_tests"].value == pytest.approx(2 / 7)
    assert behaviour_of(run(made[:2])).first.sessions == 0  # fewer than three: no thirds


def group(name: str, rewards: list[float | None]) -> list[SessionBehaviour]:
    return [measure(trace("codex", DONE, reward=r, group=name)) for r in rewards]


def test_pass_at_k_is_per_slice_with_k_the_group_size_of_the_whole_read() -> None:
    # Early groups of four (few solved), a vector reward, then pairs that are all solved.
    early = [
        *group("e1", [1.0, 0.0, 0.0, 0.0]),
        *group("e2", [0.0, 0.0, 0.0, 1.0]),
        *group("e3", [0.0, 0.0, 0.0, 0.0]),
    ]
    late = [*group("v", [None]), *group("l1", [1.0, 1.0]), *group("l2", [1.0, 1.0])]
    made = [dataclasses.replace(s, created_at=float(i)) for i, s in enumerate(early + late)]
    behaviour = behaviour_of(run(made))  # thirds of five: e1 + e2's first; v, l1, l2
    assert behaviour.all.passes.k == 4  # three groups of four, two pairs
    # e1 counts (pass@4 1, pass^4 0), e2's one sample is left out; the pairs are too small.
    assert behaviour.first.passes == PassK(4, 1, 1, 1.0, 0.0)
    assert behaviour.last.passes == PassK(4, 0, 2, None, None)
    asked = behaviour_of(run(made), k=2)
    assert asked.last.passes == PassK(2, 2, 0, 1.0, 1.0)
    # e1, e2: 1 - C(3,2)/C(4,2) = 1/2 each; e3: 0; the pairs: 1 each.
    assert asked.all.passes.pass_at_k == pytest.approx((0.5 + 0.5 + 0 + 2) / 5)
    # e1, e2: C(1,2)/C(4,2) = 0; e3: 0; the pairs: 1 each.
    assert asked.all.passes.pass_hat_k == pytest.approx(2 / 5)


# -- read from a recorded run -----------------------------------------------------------------


def chat(*messages: Message) -> ChatRequest:
    return ChatRequest(adapter="openai_chat", model="m", messages=messages)


def assistant(*calls: ToolCall, text: str = "", reasoning: str | None = None) -> Message:
    return Message(role="assistant", content=text, reasoning=reasoning, tool_calls=calls)


def tool(call_id: str, content: str) -> Message:
    return Message(role="tool", content=content, tool_call_id=call_id)


async def recorded_session(
    store: Store,
    run_id: str,
    record: Callable[[Harness], list[TurnRecord]],
    *,
    harness: str = "codex",
    group: str = "g",
    termination: str = "completed",
    reward: float | tuple[float, ...] | None = 1.0,
    purpose: str = "train",
) -> str:
    spec = SessionSpec(
        run_id=run_id, task_id="t", group_id=group, sample_index=0, harness=harness, purpose=purpose
    )
    session = (await store.create_session(spec)).id
    await store.write_turns(record(Harness(session)))
    await store.finish_session(session, termination, reward, None)
    return session


def fixed_it(h: Harness) -> list[TurnRecord]:
    """A title side request, a failed attempt, then: tests fail, patch, tests pass, done."""
    failing = ToolCall("c1", "exec_command", json.dumps({"cmd": "python -m pytest"}))
    patch = f"apply_patch <<'EOF'\n*** Update File: {FILE}\nEOF\ncat {FILE}"
    patching = ToolCall("c2", "exec_command", json.dumps({"cmd": patch}))
    title = h.turn(chat(Message(role="user", content="Title this.")), assistant(text="Calc fix"))
    h.turn(chat(SYSTEM, USER), assistant(text="never seen"), status=TurnStatus.FAILED)
    first = assistant(failing, reasoning="Reproduce first.")
    root = h.turn(chat(SYSTEM, USER), first)
    root = dataclasses.replace(root, side_requests=(title.id,))
    h.records[2] = root  # the main root names the title request a side request
    failed = tool("c1", "Process exited with code 1\nOutput:\n1 failed")
    second = h.turn(chat(SYSTEM, USER, first, failed), assistant(patching), root)
    passed = tool("c2", "Process exited with code 0\nOutput:\ndef clamp")
    h.turn(
        chat(SYSTEM, USER, first, failed, assistant(patching), passed),
        assistant(text="Done."),
        second,
    )
    return h.records


async def test_a_recorded_run_is_read_back_as_the_harness_saw_it(store: Store) -> None:
    run_id = (await store.create_run(f"behaviour-{uuid.uuid4().hex[:8]}")).id
    solved = await recorded_session(store, run_id, fixed_it)
    traced = await load_traces(store, run_id, lambda t: t)
    assert [t.id for t in traced.items] == [solved]
    (trace_read,) = traced.items
    # The side request and the failed turn are not the agent's actions.
    assert [len(t.calls) for t in trace_read.turns] == [1, 1, 0]
    assert trace_read.turns[0].reasoning == "Reproduce first."
    results = [c.result for t in trace_read.turns for c in t.calls]
    assert results == [
        "Process exited with code 1\nOutput:\n1 failed",
        "Process exited with code 0\nOutput:\ndef clamp",
    ]
    samples = measure(trace_read).samples
    picked = {k: s.value if s else None for k, s in samples.items() if k in TOOL_INDICATORS}
    assert picked == {
        "reads_back_edit": 1.0,
        "runs_tests": 1.0,
        "explored_before_edit": 0.0,
        "explicit_finish": 1.0,
        "reproduces_before_edit": 1.0,
        "solves_despite_failure": 1.0,
    }


async def test_only_the_most_recent_graded_sessions_are_read(store: Store) -> None:
    run_id = (await store.create_run(f"behaviour-{uuid.uuid4().hex[:8]}")).id

    def answer_only(h: Harness) -> list[TurnRecord]:
        h.turn(chat(SYSTEM, USER), assistant(text="Done."))
        return h.records

    made = [await recorded_session(store, run_id, answer_only, group=f"g{i}") for i in range(4)]
    await recorded_session(store, run_id, answer_only, termination="env_setup_failure")
    for purpose in ("validation", "check"):  # the loop's held-out and check trials
        await recorded_session(store, run_id, answer_only, group=purpose, purpose=purpose)
    vector = await recorded_session(store, run_id, answer_only, reward=(1.0, 0.0))
    traced = await load_traces(store, run_id, lambda t: (t.id, t.reward), limit=3)
    assert traced.graded == 5  # neither the environment failure nor non-training samples
    assert traced.items == ((made[2], 1.0), (made[3], 1.0), (vector, None))
    behaviour = await load_behaviour(store, run_id, limit=3)
    assert behaviour.read == 3
    assert behaviour.all.passes.k == 1
    assert behaviour.all.passes.groups == 2  # the vector's group has no scalar reward
    with pytest.raises(NotFound):
        await load_behaviour(store, "no-such-run")
