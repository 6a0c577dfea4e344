"""Rendering of the read models' frozen results: sampled ids decoded by the caller's
decoder (and escaped), rewards as the recorder reads them, a vector included; turns by
their number; an edited-history fork's diff; the run pages' tables and charts; the
sessions list's filters and links."""

from __future__ import annotations

import re
from html import unescape

from proxy.ui.pages import Pages, split_terminations
from proxy.ui.queries import SessionsQuery
from recorder.read_models.epochs import Epochs, EpochStats
from recorder.read_models.forks import HistoryEdit, MessageSpan, TokenSpan
from recorder.read_models.overview import AlignmentPoint, Overview, ValidationStats, VersionStats
from recorder.read_models.session_view import SampledToken, SessionView, ShownMessage, TurnView
from recorder.read_models.steps import TOTAL, StageStats, Steps, StepTrials
from recorder.read_models.tables import Page, SessionChoices, SessionRow

REPLY = ShownMessage("assistant", "Done.", None, (("bash", "{}"),), None)


def turn(number: int = 1, **changes: object) -> TurnView:
    values: dict[str, object] = {
        "id": f"t{number}",
        "seq": 1_733_000_000_000_000 + number,  # the recorder's clock, never shown as a count
        "number": number,
        "parent_number": None,
        "depth": 0,
        "parent_turn_id": None,
        "classification": "root",
        "fork_reason": None,
        "status": "completed",
        "finish_reason": "stop",
        "weight_version": "v0",
        "adapter": "openai_chat",
        "error": None,
        "prompt_tokens": 3,
        "output_tokens": 5,
        "malformed_tool_calls": 0,
        "first_token_s": 0.01,
        "finished_s": 0.05,
        "backend_s": 0.04,
        "new_messages": (ShownMessage("user", "Fix it.", None, (), None),),
        "reply": REPLY,
        "tokens": (SampledToken(100, -0.01), SampledToken(101, -2.5)),
        **changes,
    }
    return TurnView(**values)  # type: ignore[arg-type]


def session_view(
    reward: float | tuple[float, ...] | None, turns: tuple[TurnView, ...] = ()
) -> SessionView:
    return SessionView(
        id="s" * 32,
        run_id="r",
        task_id="task",
        group_id="g",
        sample_index=0,
        harness="h",
        status="finished",
        termination="completed",
        reward=reward,
        turns=turns or (turn(),),
    )


def session_row(reward: float | tuple[float, ...] | None, **changes: object) -> SessionRow:
    values: dict[str, object] = {
        "id": "s" * 32,
        "task_id": "task",
        "group_id": "g",
        "sample_index": 0,
        "status": "finished",
        "termination": "completed",
        "reward": reward,
        "version": "v0",
        "turns": 1,
        "output_tokens": 5,
        "malformed": 0,
        **changes,
    }
    return SessionRow(**values)  # type: ignore[arg-type]


def cell(html: str, row_attr: str, field: str) -> str:
    row = re.search(rf"<tr {row_attr}[^>]*>(.*?)</tr>", html, re.S)
    assert row, row_attr
    value = re.search(rf'data-field="{field}">([^<]*)<', row.group(1))
    assert value, (row_attr, field)
    return unescape(value.group(1)).strip()


def test_the_session_page_decodes_only_the_shown_ids_with_the_callers_decoder() -> None:
    asked: list[int] = []

    def decode(token: int) -> str:
        asked.append(token)
        return f"<{token}>"

    html = Pages().session(session_view(1.0), decode)
    assert asked == [100, 101]
    assert "&lt;100&gt;" in html
    assert "&lt;101&gt;" in html
    assert "… 3 more" in html  # five sampled, two shown
    assert "Fix it." in html
    assert "reward 1," in html


def test_turns_are_labelled_by_their_order_in_the_session() -> None:
    turns = (turn(1), turn(2, parent_number=1, parent_turn_id="t1", depth=1))
    html = Pages().session(session_view(1.0, turns), str)
    assert re.findall(r'class="turn-number"[^>]*>#(\d+)<', html) == ["1", "2"]
    assert "after #1" in html
    assert "1733000000000001" not in html  # the seq clock is no label


def test_an_edited_history_fork_shows_what_changed() -> None:
    before = ShownMessage("user", "solve <it>", None, (), None)
    after = ShownMessage("user", "solve it, edited", None, (), None)
    kept = ShownMessage("assistant", "step 0", None, (), None)
    added = ShownMessage("tool", "result 1", None, (), "c1")
    edit = HistoryEdit(
        parent_turn_id="t1",
        shared_tokens=2,
        parent_tokens=7,
        fork_tokens=9,
        messages=(
            MessageSpan("changed", 0, 0, (before,), (after,)),
            MessageSpan("same", 1, 1, (kept,), (kept,)),
            MessageSpan("added", 2, 2, (), (added,)),
        ),
        tokens=(
            TokenSpan("removed", 2, 1, (3,)),
            TokenSpan("added", 2, 1, (7,)),
            TokenSpan("same", 3, 4, (100, 101, 102, 103)),
            TokenSpan("added", 7, 2, (60, 61)),
        ),
        truncated=False,
    )
    fork = turn(
        2,
        parent_number=1,
        parent_turn_id="t1",
        classification="fork",
        fork_reason="edited_history",
        edit=edit,
    )
    html = Pages().session(session_view(1.0, (turn(1), fork)), lambda t: f"[{t}]")
    assert 'data-fork-reason="edited_history"' in html
    start = html.index('class="history-edit"')
    diff = html[start : html.index("</details>", start)]
    assert "against #1" in diff
    assert '<span class="edit-count">1</span> earlier message(s) rewritten' in diff
    assert '<span class="shared-tokens">2</span>' in diff
    assert re.search(r'class="diff-before">.*solve &lt;it&gt;', diff, re.S)
    assert re.search(r'class="diff-after">.*solve it, edited', diff, re.S)
    assert "1 message(s) as before" in diff
    assert "added after the parent&#39;s conversation" in diff
    assert '<span class="tok-removed" data-kind="removed" data-count="1"' in diff
    assert re.search(r'data-kind="added" data-count="1"[^>]*>\[7\]</span>', diff)
    assert "[4 tokens as before]" in diff
    assert "[100]" not in diff  # unchanged tokens are counted, not spelled out
    assert re.search(r'data-count="2"[^>]*>\[60\]\[61\]</span>', diff)


def test_a_vector_reward_renders_as_the_vector() -> None:
    pages = Pages()
    assert "reward [1.0, 0.0]," in pages.session(session_view((1.0, 0.0)), str)
    assert "reward \u2013," in pages.session(session_view(None), str)
    table = pages.sessions("r", Page((session_row((1.0, 0.0)), session_row(0.5)), 2, 1, 50))
    assert 'data-field="reward">[1.0, 0.0]</td>' in table
    assert 'data-field="reward">0.5</td>' in table


def test_the_sessions_list_keeps_its_filters_in_every_link() -> None:
    query = SessionsQuery.parse({"task": "task-1", "fork": "edited_history", "sort": "reward"})
    choices = SessionChoices(("agent_timeout", "completed"), ("train",), ("edited_history",))
    rows = (
        session_row(1.0, purpose="validation", forks=2),
        session_row(None, id="x" * 32, termination="agent_timeout", excluded=True),
    )
    html = Pages().sessions("r", Page(rows, 120, 1, 50), query, choices)
    assert 'name="task" value="task-1"' in html
    assert '<option value="edited_history" selected>edited_history</option>' in html
    assert '<option value="agent_timeout">agent_timeout (excluded)</option>' in html
    # Sorting by reward again reverses it and keeps the filters; the pager keeps them too.
    reward_link = re.search(r'href="([^"]*)" data-sort="reward">reward ▲', html)
    assert reward_link
    assert unescape(reward_link.group(1)) == "?task=task-1&fork=edited_history&sort=-reward"
    assert '<a href="?page=2&amp;task=task-1&amp;fork=edited_history&amp;sort=reward">' in html
    assert '<tr data-session="' + "x" * 32 + '" data-purpose="train" class="excluded">' in html
    assert '<span class="badge excluded">excluded</span>' in html
    assert cell(html, 'data-session="' + "s" * 32 + '"', "forks") == "2"


def stats(version: str, mean_reward: float, response_tokens: float) -> VersionStats:
    return VersionStats(
        version=version,
        sessions=4,
        graded=4,
        mean_reward=mean_reward,
        solve_rate=mean_reward,
        turns_per_trajectory=2.0,
        response_tokens=response_tokens,
        malformed_per_turn=0.0,
    )


def test_the_overview_shows_the_training_curves_and_why_a_step_was_flagged() -> None:
    overview = Overview(
        run_id="r",
        run_name="run",
        sessions=11,
        active=0,
        versions=(stats("v0", 0.25, 100.0), stats("v1", 0.5, 80.0)),
        alignment=(
            AlignmentPoint(0, "v0", {"pearson_r": 0.9993, "entropy": 0.13}, False),
            AlignmentPoint(
                1, "v1", {"pearson_r": 0.97, "entropy": 0.2}, True, ("pearson_r 0.97 < 0.99",)
            ),
        ),
        termination_reasons=("completed",),
        validation=(
            ValidationStats("v1", 3, 3, 2 / 3, 2 / 3),
            ValidationStats("v2", 1, 1, 1.0, 1.0),  # after the last step: no training at v2
        ),
        order=("v0", "v1", "v2"),
    )
    html = Pages().overview(overview)
    assert 'id="validation-sessions">4<' in html
    assert cell(html, 'data-version="v2"', "validation_reward") == "1"
    assert cell(html, 'data-version="v2"', "sessions") == "0"
    assert 'id="flagged-count">1<' in html
    flagged = html[html.index('id="flagged-steps"') :]
    reason = r'<tr class="flagged" data-step="1">.*<li>pearson_r 0.97 &lt; 0.99</li>'
    assert re.search(reason, flagged, re.S)
    curves = ("train reward", "validation reward", "policy entropy", "mean response length")
    for name in curves:
        assert f'<figure data-chart="{name}' in html
    assert cell(html, 'data-version="v1"', "validation_reward") == "0.6667"
    assert cell(html, 'data-version="v0"', "validation_reward") == "\u2013"
    assert cell(html, 'data-version="v0"', "mean_reward") == "0.25"
    assert html.count('class="mark"') == len(("pearson_r", "abs_dlogp_p99")) - 1  # p99 unset


def scope(version: str, terminations: dict[str, int], total_mean: float) -> StepTrials:
    return StepTrials(
        version=version,
        timed=2,
        stages=(
            StageStats("sandbox_setup", 2, 2.0, 1.0, 3.0, 3.0, 0.1),
            StageStats("agent_execution", 2, 18.0, 16.0, 20.0, 20.0, 0.9),
            StageStats(TOTAL, 2, total_mean, 17.0, 23.0, 23.0, 1.0),
        ),
        terminations=terminations,
    )


def test_the_steps_page_shows_table_4_and_the_termination_profile() -> None:
    steps = Steps(
        run_id="r",
        run_name="run",
        whole_run=scope("", {"completed": 3, "agent_timeout": 1, "max_turns": 1}, 20.0),
        versions=(
            scope("v0", {"completed": 2, "agent_timeout": 1}, 20.0),
            scope("v1", {"completed": 1, "max_turns": 1}, 20.0),
        ),
        termination_reasons=("agent_timeout", "completed", "max_turns"),
    )
    html = Pages().steps(steps)
    start = html.index('id="stage-table"')
    table = html[start : html.index("</table>", start)]
    assert cell(table, 'data-stage="agent_execution"', "mean") == "18"
    assert cell(table, 'data-stage="agent_execution"', "p90") == "20"
    assert cell(table, 'data-stage="sandbox_setup"', "share") == "10.0%"
    assert cell(table, 'data-stage="total"', "mean") == "20"
    assert html.count('<details class="step"') == 2
    # Graded terminations first, the excluded ones apart; an excluded share per step.
    start = html.index('<table class="data" id="terminations">')
    head = re.findall(r'<th class="num( excluded)?">(\w+)</th>', html[start:])
    assert [(bool(e), r) for e, r in head] == [
        (False, "sessions"),
        (False, "completed"),
        (False, "max_turns"),
        (True, "agent_timeout"),
    ]
    assert cell(html, 'data-version="v0"', "excluded_share") == "33.3%"
    assert cell(html, 'data-version="all"', "excluded_share") == "20.0%"
    assert html.count('<rect class="down"') == 1


def test_terminations_split_into_graded_and_excluded_in_a_fixed_order() -> None:
    graded, excluded = split_terminations(
        ["harness_error", "completed", "active", "agent_timeout", "max_turns"]
    )
    assert graded == ["completed", "max_turns", "active"]
    assert excluded == ["agent_timeout", "harness_error"]


def test_the_epochs_page_shows_the_histogram_per_epoch() -> None:
    epochs = Epochs(
        run_id="r",
        run_name="run",
        epochs=(
            EpochStats(0, {(0, 2): 2, (1, 2): 1, (2, 2): 1}),
            EpochStats(1, {(1, 2): 3, (2, 2): 1}),
        ),
    )
    html = Pages().epochs(epochs)
    assert re.findall(r'<th class="num( zero-variance)?">(\d/\d)</th>', html) == [
        (" zero-variance", "0/2"),
        ("", "1/2"),
        (" zero-variance", "2/2"),
    ]
    assert cell(html, 'data-epoch="0"', "groups") == "4"
    assert cell(html, 'data-epoch="0"', "zero_variance_share") == "75.0%"
    assert cell(html, 'data-epoch="1"', "zero_variance_share") == "25.0%"
    assert '<td class="num" data-bin="0/2">0</td>' in html  # epoch 1 had no 0/2 group
    assert "epoch 1 1/2: 3" in html  # the chart's bar
