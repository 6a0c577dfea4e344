"""Rollout-to-training alignment: how well the trainer reproduces what the backend sampled.

Owns ``AlignmentMetrics``, ``AlignmentThresholds``, ``RoutingTally`` / ``tally_routing``,
``measure_alignment``, ``is_flagged`` and ``flag_reasons`` (what a flagged step is outside of).

Inputs are flat arrays over the sampled tokens only (the caller selects them with the loss
mask): ``rollout`` and ``recomputed`` logprobs of the same tokens, and optionally the
``RoutingTally`` of the recorded expert ids ``[tokens, moe_layers, top_k]`` against the ids
the trainer's router chose on its own for the same rows. A tally is counts, so the tallies
of disjoint sets of tokens (micro-batches, data-parallel ranks) add up to the tally of
their union: routing is measured piece by piece without holding every row at once.
Definitions (float64 throughout):

- ``pearson_r``: Pearson correlation of rollout vs recomputed logprobs (1.0 for identical
  arrays even when they are constant; 0.0 for a constant array against a varying one).
- ``k3_kl``: mean of ``exp(d) - 1 - d`` with ``d = recomputed - rollout``: the k3 estimator
  of KL(rollout || trainer) from tokens the rollout sampled; >= 0 per token.
- ``abs_dp_mean``: mean ``|p_rollout - p_trainer|`` in probability space (LEGO-RL Table 7).
- ``abs_dlogp_mean`` / ``_p50`` / ``_p90`` / ``_p99``: token-level ``|d|`` statistics.
- ``expert_overlap``: mean over tokens x MoE layers of ``|recorded ∩ natural| / top_k``.
- ``top1_agreement``: share of tokens x layers whose highest-weight expert is the same.
  Both ``None`` without routing. A replay misaligned by one row collapses both towards
  chance (``top_k / num_experts`` and ``1 / num_experts``): that is how it is detected.

A step is flagged when ``pearson_r`` is below ``min_pearson_r``, ``abs_dlogp_p99`` above
``max_abs_dlogp_p99``, or the expert overlap (when measured) below ``min_expert_overlap``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import numpy.typing as npt

from kernel.errors import InvalidRequest

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class AlignmentMetrics:
    tokens: int
    pearson_r: float
    k3_kl: float
    abs_dp_mean: float
    abs_dlogp_mean: float
    abs_dlogp_p50: float
    abs_dlogp_p90: float
    abs_dlogp_p99: float
    expert_overlap: float | None = None
    top1_agreement: float | None = None

    def as_dict(self) -> dict[str, float | None]:
        return {k: (None if v is None else float(v)) for k, v in asdict(self).items()}


@dataclass(frozen=True, slots=True)
class AlignmentThresholds:
    min_pearson_r: float = 0.99
    max_abs_dlogp_p99: float = 0.05
    min_expert_overlap: float = 0.9


def _pearson(a: Floats, b: Floats) -> float:
    da, db = a - a.mean(), b - b.mean()
    denom = float(np.sqrt((da * da).sum() * (db * db).sum()))
    if denom == 0.0:
        return 1.0 if np.array_equal(a, b) else 0.0
    return float((da * db).sum() / denom)


@dataclass(frozen=True, slots=True)
class RoutingTally:
    """What the routing agreement is computed from; ``a + b`` is the tally of both."""

    rows: int = 0  # tokens x MoE layers compared
    slots: int = 0  # rows x top_k
    hits: int = 0  # recorded ids that the natural top-k of the same row also holds
    top1_hits: int = 0  # rows whose highest-weight expert is the same

    def __add__(self, other: RoutingTally) -> RoutingTally:
        return RoutingTally(
            self.rows + other.rows,
            self.slots + other.slots,
            self.hits + other.hits,
            self.top1_hits + other.top1_hits,
        )

    @property
    def expert_overlap(self) -> float:
        return self.hits / self.slots if self.slots else 1.0

    @property
    def top1_agreement(self) -> float:
        return self.top1_hits / self.rows if self.rows else 1.0


def tally_routing(recorded: Ints, natural: Ints) -> RoutingTally:
    """The tally of two ``[tokens, layers, top_k]`` id arrays."""
    if recorded.shape != natural.shape or recorded.ndim != 3:
        raise InvalidRequest(f"routing arrays {recorded.shape} and {natural.shape} differ")
    rows = recorded.shape[0] * recorded.shape[1]
    # Pairwise comparison of the two top-k sets; ids within one row are distinct.
    hits = (recorded[..., :, None] == natural[..., None, :]).any(axis=-1)
    top1 = recorded[..., 0] == natural[..., 0]
    return RoutingTally(rows, rows * recorded.shape[2], int(hits.sum()), int(top1.sum()))


def routing_agreement(recorded: Ints, natural: Ints) -> tuple[float, float]:
    """``(expert_overlap, top1_agreement)`` of two ``[tokens, layers, top_k]`` id arrays."""
    tally = tally_routing(recorded, natural)
    return tally.expert_overlap, tally.top1_agreement


def measure_alignment(
    rollout: Floats, recomputed: Floats, routing: RoutingTally | None = None
) -> AlignmentMetrics:
    """Alignment over the sampled tokens given (see the module doc for definitions)."""
    if rollout.shape != recomputed.shape or rollout.ndim != 1:
        raise InvalidRequest(f"logprob arrays {rollout.shape} and {recomputed.shape} differ")
    if rollout.size == 0:
        raise InvalidRequest("alignment needs at least one sampled token")
    d = recomputed.astype(np.float64) - rollout.astype(np.float64)
    abs_d = np.abs(d)
    p50, p90, p99 = (float(q) for q in np.quantile(abs_d, [0.5, 0.9, 0.99]))
    overlap = None if routing is None else routing.expert_overlap
    top1 = None if routing is None else routing.top1_agreement
    return AlignmentMetrics(
        tokens=int(rollout.size),
        pearson_r=_pearson(rollout.astype(np.float64), recomputed.astype(np.float64)),
        k3_kl=float(np.mean(np.expm1(d) - d)),
        abs_dp_mean=float(np.mean(np.abs(np.exp(rollout) - np.exp(recomputed)))),
        abs_dlogp_mean=float(abs_d.mean()),
        abs_dlogp_p50=p50,
        abs_dlogp_p90=p90,
        abs_dlogp_p99=p99,
        expert_overlap=overlap,
        top1_agreement=top1,
    )


def flag_reasons(metrics: AlignmentMetrics, thresholds: AlignmentThresholds) -> list[str]:
    """Which thresholds the step's alignment is outside of, as readable phrases."""
    reasons = []
    if metrics.pearson_r < thresholds.min_pearson_r:
        reasons.append(f"pearson_r {metrics.pearson_r:.4f} < {thresholds.min_pearson_r}")
    if metrics.abs_dlogp_p99 > thresholds.max_abs_dlogp_p99:
        reasons.append(f"|dlogp| p99 {metrics.abs_dlogp_p99:.4f} > {thresholds.max_abs_dlogp_p99}")
    overlap = metrics.expert_overlap
    if overlap is not None and overlap < thresholds.min_expert_overlap:
        reasons.append(f"expert overlap {overlap:.3f} < {thresholds.min_expert_overlap}")
    return reasons


def is_flagged(metrics: AlignmentMetrics, thresholds: AlignmentThresholds) -> bool:
    return bool(flag_reasons(metrics, thresholds))
