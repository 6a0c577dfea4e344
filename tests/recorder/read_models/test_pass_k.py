"""pass@k and pass^k worked by hand: the estimators, and their means over prompt groups
with k the group size or asked, groups too small left out, ungraded samples ignored."""

from __future__ import annotations

import pytest

from recorder.read_models.pass_k import PassK, group_size, pass_at_k, pass_hat_k, passes


def group(name: str, rewards: list[float | None]) -> list[tuple[str, float | None]]:
    return [(name, reward) for reward in rewards]


def test_the_estimators_by_hand() -> None:
    assert pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(5, 2, 3) == pytest.approx(1 - 1 / 10)  # 1 - C(3,3)/C(5,3)
    assert pass_at_k(5, 2, 1) == pytest.approx(2 / 5)  # pass@1 is the solve rate
    assert pass_hat_k(5, 2, 3) == 0.0  # C(2,3) = 0
    assert pass_hat_k(5, 4, 3) == pytest.approx(4 / 10)  # C(4,3)/C(5,3)
    assert pass_hat_k(4, 4, 4) == 1.0
    for bad in ((2, 1, 3), (2, 3, 1), (2, 1, 0)):
        with pytest.raises(ValueError, match="k <= n"):
            pass_at_k(*bad)
        with pytest.raises(ValueError, match="k <= n"):
            pass_hat_k(*bad)


def test_over_prompt_groups_with_k_the_group_size_or_asked() -> None:
    samples = [
        *group("one-solved", [1.0, 0.0, 0.0, 0.0]),
        *group("all-solved", [1.0, 0.5, 1.0, 1.0]),  # a reward above zero passes
        *group("none-solved", [0.0, 0.0, 0.0, 0.0]),
        *group("pair", [1.0, 1.0, None]),  # the ungraded sample does not count
    ]
    assert group_size(samples) == 4
    by_size = passes(samples, 4)
    assert (by_size.k, by_size.groups, by_size.left_out) == (4, 3, 1)
    assert by_size.pass_at_k == pytest.approx(2 / 3)
    assert by_size.pass_hat_k == pytest.approx(1 / 3)
    asked = passes(samples, 2)
    assert (asked.groups, asked.left_out) == (4, 0)
    # one-solved: 1 - C(3,2)/C(4,2) = 1/2; all: 1; none: 0; pair: 1.
    assert asked.pass_at_k == pytest.approx((0.5 + 1 + 0 + 1) / 4)
    # one-solved: C(1,2)/C(4,2) = 0; all: 1; none: 0; pair: 1.
    assert asked.pass_hat_k == pytest.approx((0 + 1 + 0 + 1) / 4)
    assert passes(samples, 5) == PassK(5, 0, 4, None, None)


def test_without_graded_samples_there_is_no_k_and_no_value() -> None:
    vectors = group("vectors", [None, None])
    assert group_size(vectors) is None
    assert passes(vectors, None) == PassK(None, 0, 0, None, None)
    assert passes([], 3) == PassK(3, 0, 0, None, None)


def test_a_tie_of_group_sizes_takes_the_larger() -> None:
    assert group_size([*group("two", [1.0, 0.0]), *group("three", [1.0, 0.0, 0.0])]) == 3
