"""Task selection by pass rate: what is set aside, when, and the per-epoch histogram."""

from __future__ import annotations

import pytest

from loop.selection import GroupOutcome, Selection


def outcomes(task: str, *counts: tuple[int, int]) -> list[GroupOutcome]:
    return [GroupOutcome(task, epoch, k, n) for epoch, (k, n) in enumerate(counts)]


def test_nothing_is_set_aside_by_default() -> None:
    selection = Selection().with_groups(outcomes("easy", (4, 4), (4, 4), (4, 4)))
    assert selection.set_aside() == {}
    assert selection.keep(["easy"]) == ["easy"]


def test_a_task_at_zero_or_all_for_the_last_e_epochs_is_set_aside_with_the_counts() -> None:
    selection = Selection(set_aside_after=2).with_groups(
        [
            *outcomes("easy", (2, 4), (4, 4), (4, 4)),  # all solved in the last two
            *outcomes("hard", (0, 4), (0, 4)),  # never solved
            *outcomes("useful", (0, 4), (4, 4), (1, 4)),  # last epoch has signal
            *outcomes("young", (4, 4)),  # one epoch is not enough for E = 2
        ]
    )
    assert selection.set_aside() == {
        "easy": "4/4, 4/4 in epoch(s) 1, 2",
        "hard": "0/4, 0/4 in epoch(s) 0, 1",
    }
    assert selection.keep(["easy", "hard", "useful", "young"]) == ["useful", "young"]


def test_excluded_samples_do_not_count_and_an_all_excluded_group_is_no_evidence() -> None:
    # 2 of 3 graded passed (one sample excluded): variance, so it stays.
    selection = Selection(set_aside_after=1).with_groups(
        [GroupOutcome("t", 0, 2, 3), GroupOutcome("broken", 0, 0, 0)]
    )
    assert selection.set_aside() == {}
    assert selection.epoch(0).groups == 1  # the all-excluded group is not a graded group


def test_the_epoch_histogram_and_zero_variance_share() -> None:
    selection = Selection().with_groups(
        [
            GroupOutcome("a", 0, 0, 4),
            GroupOutcome("b", 0, 2, 4),
            GroupOutcome("c", 0, 4, 4),
            GroupOutcome("d", 0, 2, 4),
            GroupOutcome("a", 1, 1, 4),
        ]
    )
    stats = selection.epoch(0)
    assert stats.histogram == ((0, 1), (2, 2), (4, 1))
    assert stats.zero_variance_share == pytest.approx(0.5)
    assert selection.epoch(1).zero_variance_share == 0.0
    assert selection.epoch(7).zero_variance_share is None


def test_set_aside_after_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Selection(set_aside_after=0)
