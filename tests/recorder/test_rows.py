"""The row codec's two rules at their home: side-request re-labels and rewards, as every
reader (turns, arrays, sessions) applies them, whatever order the rows were written in."""

from __future__ import annotations

from dataclasses import replace

import pytest

from recorder.records import DefenseEvent, SessionInfo, SessionSpec, SessionStatus, StageTimes
from recorder.rows import (
    SideRequests,
    arrays_of,
    encode_turn,
    reward_of,
    reward_values,
    session_of,
    session_values,
    trial_values,
    turns_of,
)
from tests.recorder.builders import make_turn


def test_a_root_named_as_a_side_request_reads_back_as_a_fork_in_either_order() -> None:
    title, other = make_turn("s", 0), make_turn("s", 1, prompt=(9,))
    continued = replace(make_turn("s", 2), classification="extend", parent_turn_id=None)
    main = replace(make_turn("s", 3, prompt=(7, 8)), side_requests=(title.id, continued.id))
    stray = replace(make_turn("s", 4, prompt=(6,)), side_requests=("not-recorded",))
    rows = [encode_turn(t).row for t in (title, other, continued, main, stray)]
    want = {
        title.id: ("fork", "side_request"),
        other.id: ("root", None),
        continued.id: ("extend", None),  # only a root becomes a side request
        main.id: ("root", None),
        stray.id: ("root", None),
    }
    for order in (rows, rows[::-1]):  # the naming row may be the one written first
        got = {t.id: (t.classification, t.fork_reason) for t in turns_of("s", order)}
        assert got == want
        arrays = {t.id: t.classification for t in arrays_of("s", order)}
        assert arrays == {turn_id: label for turn_id, (label, _) in want.items()}
    labels = SideRequests.of_rows(rows)
    assert labels.named_by == {title.id: main.id, continued.id: main.id, "not-recorded": stray.id}
    # The lists themselves read back as written.
    assert [t.side_requests for t in turns_of("s", rows)][3:] == [
        main.side_requests,
        ("not-recorded",),
    ]


def test_a_row_spooled_before_side_requests_existed_names_nothing() -> None:
    row = {k: v for k, v in encode_turn(make_turn("s", 0)).row.items() if k != "side_requests"}
    assert SideRequests.of_rows([row]).named_by == {}
    assert turns_of("s", [row])[0].side_requests == ()


@pytest.mark.parametrize(
    ("reward", "vector", "want"),
    [
        (None, None, None),
        (0.5, None, 0.5),
        (1, None, 1.0),
        (None, [1, 0], (1.0, 0.0)),
        (0.5, [0.25], (0.25,)),  # the vector wins
    ],
)
def test_the_reward_rule(reward: float | None, vector: list[float] | None, want: object) -> None:
    got = reward_of(reward, vector)
    assert got == want
    assert type(got) is type(want)


def test_a_session_round_trips_through_its_row_with_either_kind_of_reward() -> None:
    spec = SessionSpec(run_id="r", task_id="t", group_id="g", sample_index=2, harness="h")
    info = SessionInfo(
        id="s", key="lego-sk-x", spec=spec, status=SessionStatus.ACTIVE, created_at=1.0
    )
    for reward in (0.5, (1.0, 0.0), None):
        row = {
            **session_values(info),
            **reward_values(reward),
            "status": "finished",
            "termination": "completed",
            "reward_details": {"tests": 3},
            **trial_values(None, ()),
        }
        assert (row["reward"] is None) == (not isinstance(reward, float))
        assert session_of(row, 4) == replace(
            info,
            status=SessionStatus.FINISHED,
            termination="completed",
            reward=reward,
            reward_details={"tests": 3},
            turn_count=4,
        )


def test_a_trial_report_round_trips_through_its_row_and_none_reads_as_none() -> None:
    spec = SessionSpec(run_id="r", task_id="t", group_id="g", sample_index=0, harness="h")
    info = SessionInfo(id="s", key="k", spec=spec, status=SessionStatus.FINISHED, created_at=1.0)
    stages = StageTimes(sandbox_setup=0.5, agent_execution=12.25, other=0.0)
    events = (
        DefenseEvent("test_path_reverted", {"path": "tests/test_a.py", "lines": [1, 2]}),
        DefenseEvent("history_hidden"),
    )
    base = {**session_values(info), **reward_values(1.0), "termination": "completed"}
    stored = trial_values(stages, events)
    assert stored == {
        "stages": {"sandbox_setup": 0.5, "agent_execution": 12.25, "other": 0.0},
        "defense_events": [
            {"kind": "test_path_reverted", "path": "tests/test_a.py", "lines": [1, 2]},
            {"kind": "history_hidden"},
        ],
    }
    got = session_of({**base, "reward_details": None, **stored}, 0)
    assert (got.stages, got.defense_events) == (stages, events)
    # A session finished without a report (or before migration 0009) stores NULLs.
    assert trial_values(None, ()) == {"stages": None, "defense_events": None}
    empty = session_of({**base, "reward_details": None, **trial_values(None, ())}, 0)
    assert (empty.stages, empty.defense_events) == (None, ())
