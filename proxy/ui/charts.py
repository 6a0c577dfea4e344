"""Server-rendered SVG charts for the Live UI (no JavaScript, no build step).

Contract: each function takes plain numbers and labels and returns ``Markup`` holding one
self-contained ``<svg class="chart">`` of ``WIDTH`` x ``HEIGHT`` user units; every label is
escaped, and every label stays inside that box (the left margin grows with the longest
y label, x labels are cut to 12 characters and thinned to at most ~8).

- ``line_chart``: one polyline per series over shared x labels, skipping ``None`` points;
  ``marks`` ringed in red (a flagged trainer step).
- ``stacked_bars``: one bar per category split by series.
- ``diverging_bars``: the same with two stacks per bar, ``above`` the zero line and
  ``below`` it (graded terminations up, excluded ones down), both read as counts.
- ``grouped_bars``: one bar per series side by side in each category (a histogram per
  epoch).

The y axis has "nice" ticks (1, 2 or 5 times a power of ten) and each tick label carries
as many decimals as its step needs, so close values read apart (0.9992 and 0.9998 are
not both "1"); ``integer=True`` keeps ticks whole (counts). Colours: ``colour(i)`` is a
fixed palette keyed by series position; a caller that names series which must keep one
colour everywhere passes ``colours`` (``TERMINATION_COLOURS``, ``STAGE_COLOURS``).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence

from markupsafe import Markup, escape

WIDTH = 520
HEIGHT = 200
CHAR_WIDTH = 6.2  # user units per character of a 10-unit label, generous for digits
_PAD_TOP = 10
_PAD_RIGHT = 10
_PAD_BOTTOM = 36  # x labels, then the x axis title
_PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#e15759",
    "#76b7b2",
    "#59a14f",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
)
# One colour per termination (recorder.records.Termination) on every chart and legend:
# greens and yellows are graded, reds, purples and browns are environment failures.
TERMINATION_COLOURS: Mapping[str, str] = {
    "completed": "#59a14f",
    "max_turns": "#edc948",
    "context_exhausted": "#f28e2b",
    "active": "#76b7b2",
    "agent_timeout": "#e15759",
    "env_setup_failure": "#b07aa1",
    "harness_error": "#9c755f",
    "grader_error": "#ff9da7",
    "aborted": "#bab0ac",
}
STAGE_COLOURS: Mapping[str, str] = {  # recorder.records.STAGES
    "sandbox_setup": "#4e79a7",
    "agent_setup": "#76b7b2",
    "agent_execution": "#f28e2b",
    "verification": "#59a14f",
    "other": "#bab0ac",
}
UNKNOWN_COLOUR = "#555555"


def colour(index: int) -> str:
    return _PALETTE[index % len(_PALETTE)]


def ticks(lo: float, hi: float, count: int = 4, integer: bool = False) -> tuple[list[float], int]:
    """Tick values covering [lo, hi] about ``count`` steps apart, and their decimals."""
    if hi < lo:
        lo, hi = hi, lo
    if hi == lo:
        pad = abs(lo) * 0.05 or 0.5
        lo, hi = lo - pad, hi + pad
    raw = (hi - lo) / count
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw * (1 - 1e-9))
    if integer:
        step = max(1.0, round(step))
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    decimals = 0 if integer else max(0, -math.floor(math.log10(step) + 1e-9))
    return [round(i * step, decimals + 2) for i in range(first, last + 1)], decimals


def tick_label(value: float, decimals: int) -> str:
    if decimals == 0 and abs(value) >= 10_000:
        return f"{value:,.0f}"
    text = f"{value:.{decimals}f}"
    return "0" if float(text) == 0 else text  # never "-0.00"


class _Axis:
    """The y axis of one chart: its ticks, the margin their labels need, the mapping."""

    def __init__(self, lo: float, hi: float, integer: bool = False, absolute: bool = False):
        values, decimals = ticks(lo, hi, integer=integer)
        self.lo, self.hi = values[0], values[-1]
        labels = [tick_label(abs(v) if absolute else v, decimals) for v in values]
        self.ticks = list(zip(values, labels, strict=True))
        self.left = max(30.0, 8 + CHAR_WIDTH * max(len(label) for label in labels))
        self.plot_w = WIDTH - self.left - _PAD_RIGHT
        self.plot_h = HEIGHT - _PAD_TOP - _PAD_BOTTOM

    def y(self, value: float) -> float:
        return _PAD_TOP + (self.hi - value) / (self.hi - self.lo) * self.plot_h

    def svg(self) -> list[str]:
        bottom = _PAD_TOP + self.plot_h
        parts = [
            f'<line x1="{self.left:.1f}" y1="{_PAD_TOP}" x2="{self.left:.1f}" y2="{bottom}" '
            'stroke="#888"/>',
            f'<line x1="{self.left:.1f}" y1="{bottom}" x2="{WIDTH - _PAD_RIGHT}" y2="{bottom}" '
            'stroke="#888"/>',
        ]
        for value, label in self.ticks:
            y = self.y(value)
            parts.append(
                f'<line class="grid" x1="{self.left:.1f}" y1="{y:.1f}" x2="{WIDTH - _PAD_RIGHT}" '
                f'y2="{y:.1f}" stroke="#eee"/>'
                f'<text class="y-tick" x="{self.left - 4:.1f}" y="{y + 3.5:.1f}" '
                f'text-anchor="end">{label}</text>'
            )
        return parts


def _frame(body: list[str], title: str, axis: _Axis, x_title: str) -> Markup:
    head = (
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{escape(title)}"><title>{escape(title)}</title>'
    )
    foot = (
        f'<text class="x-title" x="{axis.left + axis.plot_w / 2:.1f}" y="{HEIGHT - 3}" '
        f'text-anchor="middle">{escape(x_title)}</text>'
        if x_title
        else ""
    )
    return Markup(head + "".join(axis.svg() + body) + foot + "</svg>")


def _x_labels(labels: Sequence[str], left: float, step: float, offset: float) -> list[str]:
    every = max(1, math.ceil(len(labels) / 8))  # at most ~8 labels, so they never overlap
    y = HEIGHT - _PAD_BOTTOM + 13
    parts = []
    for i, label in enumerate(labels):
        if i % every:
            continue
        shown = label[:12]
        half = CHAR_WIDTH * len(shown) / 2
        # A label under the last point would stick out of the box: keep it inside.
        x = min(max(left + offset + i * step, half + 1), WIDTH - half - 1)
        parts.append(
            f'<text class="x-tick" x="{x:.1f}" y="{y}" text-anchor="middle">{escape(shown)}</text>'
        )
    return parts


def _empty(axis: _Axis) -> str:
    return (
        f'<text class="empty" x="{axis.left + axis.plot_w / 2:.1f}" '
        f'y="{_PAD_TOP + axis.plot_h / 2:.1f}" text-anchor="middle" fill="#777">no data yet</text>'
    )


def _fill(name: str, index: int, colours: Mapping[str, str] | None) -> str:
    if colours is None:
        return colour(index)
    return colours.get(name, UNKNOWN_COLOUR)


def line_chart(
    title: str,
    labels: Sequence[str],
    series: Mapping[str, Sequence[float | None]],
    *,
    x_title: str = "",
    marks: Collection[int] = (),
) -> Markup:
    values = [v for vs in series.values() for v in vs if v is not None]
    axis = _Axis(min(values), max(values)) if values else _Axis(0.0, 1.0)
    step = (axis.plot_w - 10) / max(1, len(labels) - 1)
    body: list[str] = [] if values else [_empty(axis)]
    for s, (name, points) in enumerate(series.items()):
        x0 = axis.left + 5
        xy = [(i, v, x0 + i * step, axis.y(v)) for i, v in enumerate(points) if v is not None]
        if len(xy) > 1:
            path = " ".join(f"{x:.1f},{y:.1f}" for _, _, x, y in xy)
            body.append(
                f'<polyline points="{path}" fill="none" stroke="{colour(s)}" stroke-width="2">'
                f"<title>{escape(name)}</title></polyline>"
            )
        for i, v, x, y in xy[-200:]:  # dots only where they stay distinguishable
            label = labels[i] if i < len(labels) else ""
            body.append(
                f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{colour(s)}">'
                f"<title>{escape(label)}: {v:.6g}</title></circle>"
            )
            if i in marks:
                body.append(
                    f'<circle class="mark" cx="{x:.1f}" cy="{y:.1f}" r="5.5" fill="none" '
                    'stroke="#d00" stroke-width="1.5"/>'
                )
    body += _x_labels(labels, axis.left, step, 5)
    return _frame(body, title, axis, x_title)


def _bar_x(axis: _Axis, count: int) -> tuple[float, float]:
    step = axis.plot_w / max(1, count)
    return step, max(1.0, step * 0.7)


def stacked_bars(
    title: str,
    categories: Sequence[str],
    series: Mapping[str, Sequence[float]],
    *,
    x_title: str = "",
    colours: Mapping[str, str] | None = None,
    integer: bool = True,
) -> Markup:
    totals = [sum(values[i] for values in series.values()) for i in range(len(categories))]
    axis = _Axis(0, max(totals, default=0) or 1, integer=integer)
    step, bar = _bar_x(axis, len(categories))
    body: list[str] = []
    for i, category in enumerate(categories):
        y = axis.y(0)
        for s, (name, values) in enumerate(series.items()):
            if not values[i]:
                continue
            h = axis.y(0) - axis.y(values[i])
            y -= h
            body.append(
                f'<rect x="{axis.left + i * step + (step - bar) / 2:.1f}" y="{y:.1f}" '
                f'width="{bar:.1f}" height="{h:.1f}" fill="{_fill(name, s, colours)}">'
                f"<title>{escape(category)} {escape(name)}: {values[i]:g}</title></rect>"
            )
    body += _x_labels(categories, axis.left, step, step / 2)
    return _frame(body, title, axis, x_title)


def diverging_bars(
    title: str,
    categories: Sequence[str],
    above: Mapping[str, Sequence[int]],
    below: Mapping[str, Sequence[int]],
    *,
    x_title: str = "",
    colours: Mapping[str, str] | None = None,
) -> Markup:
    up = [sum(v[i] for v in above.values()) for i in range(len(categories))]
    down = [sum(v[i] for v in below.values()) for i in range(len(categories))]
    axis = _Axis(-max(down, default=0), max(up, default=0) or 1, integer=True, absolute=True)
    step, bar = _bar_x(axis, len(categories))
    zero = axis.y(0)
    body = [
        f'<line class="zero" x1="{axis.left:.1f}" y1="{zero:.1f}" x2="{WIDTH - _PAD_RIGHT}" '
        f'y2="{zero:.1f}" stroke="#333"/>'
    ]
    for i, category in enumerate(categories):
        x = axis.left + i * step + (step - bar) / 2
        for side, stacks in ((1, above), (-1, below)):
            edge = zero
            for s, (name, values) in enumerate(stacks.items()):
                if not values[i]:
                    continue
                h = zero - axis.y(values[i])
                top = edge - h if side > 0 else edge
                edge = top if side > 0 else edge + h
                body.append(
                    f'<rect class="{"up" if side > 0 else "down"}" x="{x:.1f}" y="{top:.1f}" '
                    f'width="{bar:.1f}" height="{h:.1f}" fill="{_fill(name, s, colours)}">'
                    f"<title>{escape(category)} {escape(name)}: {values[i]}</title></rect>"
                )
    body += _x_labels(categories, axis.left, step, step / 2)
    return _frame(body, title, axis, x_title)


def grouped_bars(
    title: str,
    categories: Sequence[str],
    series: Mapping[str, Sequence[float]],
    *,
    x_title: str = "",
    integer: bool = True,
) -> Markup:
    top = max((v for values in series.values() for v in values), default=0)
    axis = _Axis(0, top or 1, integer=integer)
    step, width = _bar_x(axis, len(categories))
    bar = width / max(1, len(series))
    body: list[str] = []
    for i, category in enumerate(categories):
        for s, (name, values) in enumerate(series.items()):
            if not values[i]:
                continue
            y = axis.y(values[i])
            body.append(
                f'<rect x="{axis.left + i * step + (step - width) / 2 + s * bar:.1f}" '
                f'y="{y:.1f}" width="{bar:.1f}" height="{axis.y(0) - y:.1f}" fill="{colour(s)}">'
                f"<title>{escape(name)} {escape(category)}: {values[i]:g}</title></rect>"
            )
    body += _x_labels(categories, axis.left, step, step / 2)
    return _frame(body, title, axis, x_title)
