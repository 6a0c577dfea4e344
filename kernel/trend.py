"""The trend check: which logged series trend, and in which direction (LEGO-RL Table 8).

Contract: ``trend(name, values)`` fits a least-squares line to ``values`` over their index
(the logged steps or weight versions, in order; ``None`` entries are skipped but keep their
position) and returns the slope's t-statistic (slope / its standard error) together with
the means of the first and last few points. A series with fewer than three points has no
t (``None``). ``flagged`` is ``|t| >= 2``: below that the movement is read as noise. A
perfectly straight, non-flat series has an infinite t. Pure functions, no IO.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

T_THRESHOLD = 2.0
ENDPOINT_POINTS = 5  # Table 8 compares the first five with the last five steps


@dataclass(frozen=True, slots=True)
class Trend:
    series: str
    points: int
    first: float | None  # mean of the first few points
    last: float | None  # mean of the last few points
    slope: float | None  # per logged step
    t: float | None

    @property
    def flagged(self) -> bool:
        return self.t is not None and abs(self.t) >= T_THRESHOLD

    @property
    def direction(self) -> str:
        if not self.flagged or self.t is None:
            return "flat"
        return "rising" if self.t > 0 else "falling"


def slope_t(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float] | None:
    """(slope, t) of the least-squares line through the points; None under three points."""
    n = len(xs)
    if n < 3:
        return None
    mean_x = sum(xs) / n
    mean_y = sum(ys) / n
    sxx = sum((x - mean_x) ** 2 for x in xs)
    if sxx == 0:
        return None
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sxx
    intercept = mean_y - slope * mean_x
    residual = sum((y - intercept - slope * x) ** 2 for x, y in zip(xs, ys, strict=True))
    # Rounding leaves tiny residuals on exact lines; treat them as exact.
    scale = max(1.0, sum(y * y for y in ys))
    if residual <= 1e-24 * scale:
        return slope, 0.0 if slope == 0 else math.copysign(math.inf, slope)
    stderr = math.sqrt(residual / (n - 2) / sxx)
    return slope, slope / stderr


def trend(series: str, values: Sequence[float | None]) -> Trend:
    points = [(float(i), v) for i, v in enumerate(values) if v is not None and math.isfinite(v)]
    ys = [v for _, v in points]
    k = min(ENDPOINT_POINTS, max(1, len(ys) // 2))
    first = sum(ys[:k]) / k if ys else None
    last = sum(ys[-k:]) / k if ys else None
    fit = slope_t([x for x, _ in points], ys)
    return Trend(
        series=series,
        points=len(ys),
        first=first,
        last=last,
        slope=fit[0] if fit else None,
        t=fit[1] if fit else None,
    )
