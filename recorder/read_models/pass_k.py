"""pass@k and pass^k over prompt groups: how often k samples of a prompt solve it.

Owns ``PassK`` and ``passes(samples, k)`` over (group id, reward) pairs, one per graded
sample; pure. A reward of None (ungraded, or a vector with no threshold) is no sample. A
sample passes with a reward above zero. A group of ``n >= k`` samples, ``c`` of them
passing, counts ``pass_at_k(n, c, k) = 1 - C(n-c, k) / C(n, k)`` towards pass@k (the
unbiased estimator of Chen et al. 2021, "Evaluating Large Language Models Trained on
Code": the chance that at least one of k samples drawn without replacement passes; 0 or 1
when ``k == n``) and ``pass_hat_k(n, c, k) = C(c, k) / C(n, k)`` towards pass^k (the
chance that all k pass); each is the mean over the groups counted. Groups with fewer than
``k`` samples are left out and counted (``left_out``). ``group_size`` is the most common
group size, the larger on a tie: the k a run's groups were sampled for.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from math import comb

Sample = tuple[str, float | None]  # (group id, reward)


@dataclass(frozen=True, slots=True)
class PassK:
    k: int | None
    groups: int  # groups with at least k samples
    left_out: int  # groups with fewer
    pass_at_k: float | None
    pass_hat_k: float | None


def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance that at least one of ``k`` of ``n`` samples (``c`` passing) passes."""
    _check(n, c, k)
    return 1.0 - comb(n - c, k) / comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """The chance that all of ``k`` of ``n`` samples (``c`` passing) pass."""
    _check(n, c, k)
    return comb(c, k) / comb(n, k)


def _check(n: int, c: int, k: int) -> None:
    if not 0 < k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 < k <= n and 0 <= c <= n, got {n=}, {c=}, {k=}")


def _groups(samples: Iterable[Sample]) -> dict[str, tuple[int, int]]:
    """group id -> (samples, passing samples)."""
    counts: dict[str, tuple[int, int]] = {}
    for group, reward in samples:
        if reward is not None:
            n, c = counts.get(group, (0, 0))
            counts[group] = (n + 1, c + (reward > 0))
    return counts


def group_size(samples: Iterable[Sample]) -> int | None:
    """The most common group size (the largest of the most common); None without groups."""
    sizes = Counter(n for n, _ in _groups(samples).values())
    if not sizes:
        return None
    return max(sizes, key=lambda size: (sizes[size], size))


def passes(samples: Iterable[Sample], k: int | None) -> PassK:
    groups = _groups(samples)
    counted = [(n, c) for n, c in groups.values() if k is not None and n >= k]
    if k is None or not counted:
        return PassK(k, 0, len(groups), None, None)
    at_k = sum(pass_at_k(n, c, k) for n, c in counted) / len(counted)
    hat_k = sum(pass_hat_k(n, c, k) for n, c in counted) / len(counted)
    return PassK(k, len(counted), len(groups) - len(counted), at_k, hat_k)
