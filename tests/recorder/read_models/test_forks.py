"""What a fork changed against its parent, as pure diffs: message spans, token spans past
the shared prefix, and the bounds that keep a huge prompt's diff cheap."""

from __future__ import annotations

from recorder.read_models import forks
from recorder.read_models.forks import HistoryEdit, diff_messages, diff_tokens, history_edit


def test_an_edited_message_is_a_change_between_unchanged_ones() -> None:
    before = ["sys", "task", "answer 0", "result 0", "answer 1"]
    after = ["sys", "task (edited)", "answer 0", "result 0", "answer 1", "result 1"]
    spans = diff_messages(before, after, str.lower)
    assert [(s.kind, s.before, s.after) for s in spans] == [
        ("same", ("sys",), ("sys",)),
        ("changed", ("task",), ("task (edited)",)),
        ("same", ("answer 0", "result 0", "answer 1"), ("answer 0", "result 0", "answer 1")),
        ("added", (), ("result 1",)),
    ]
    assert [(s.parent_start, s.fork_start) for s in spans] == [(0, 0), (1, 1), (2, 2), (5, 5)]


def test_the_key_decides_what_counts_as_a_change() -> None:
    # A pruned tool output is a removal; a difference the key ignores is none.
    spans = diff_messages(["Task", "big output", "Answer"], ["task", "answer"], str.lower)
    assert [(s.kind, s.before) for s in spans] == [
        ("same", ("Task",)),
        ("removed", ("big output",)),
        ("same", ("Answer",)),
    ]


def test_token_spans_start_where_the_prompts_part() -> None:
    parent = [1, 2, 3, 100, 101, 102]
    fork = [1, 2, 7, 100, 101, 102, 60, 61]
    spans = diff_tokens(parent, fork, shared=2)
    assert [(s.kind, s.start, s.count, s.ids) for s in spans] == [
        ("removed", 2, 1, (3,)),
        ("added", 2, 1, (7,)),
        ("same", 3, 3, (100, 101, 102)),
        ("added", 6, 2, (60, 61)),
    ]


def test_a_history_edit_measures_the_shared_prefix_itself() -> None:
    edit = history_edit(
        "parent",
        ["task", "answer"],
        ["task!", "answer", "result"],
        str,
        parent_tokens=[1, 2, 3, 4],
        fork_prompt=[1, 2, 9, 4, 5],
    )
    assert (edit.shared_tokens, edit.parent_tokens, edit.fork_tokens) == (2, 4, 5)
    assert edit.changed_messages == 1
    assert not edit.truncated
    assert [s.kind for s in edit.tokens] == ["removed", "added", "same", "added"]


def test_long_spans_keep_their_count_but_not_all_their_ids() -> None:
    shared = [5] * 10
    parent = [*shared, *range(1000, 1000 + forks.MAX_COMPARED + 50)]
    fork = [*shared, *range(9000, 9000 + forks.MAX_SHOWN + 3)]
    edit: HistoryEdit[str] = history_edit("p", [], [], str, parent, fork)
    assert edit.shared_tokens == 10
    assert edit.truncated  # the parent runs past the compared window
    removed, added = edit.tokens
    assert (removed.kind, removed.count, len(removed.ids)) == (
        "removed",
        forks.MAX_COMPARED,
        forks.MAX_SHOWN,
    )
    assert (added.kind, added.count, added.ids[:2]) == ("added", forks.MAX_SHOWN + 3, (9000, 9001))
