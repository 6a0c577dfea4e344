"""Server-rendered SVG charts for the Live UI (no JavaScript, no build step).

Contract: each function takes plain numbers and labels and returns ``Markup`` holding one
self-contained ``<svg>`` element; every label is escaped. ``stacked_bars`` draws one bar
per category split by series; ``line_chart`` draws one polyline per series over shared x
labels, skipping ``None`` points. Colours come from a fixed palette keyed by series
position so a series keeps its colour across charts that list series in the same order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from markupsafe import Markup, escape

WIDTH = 520
HEIGHT = 200
_PAD_LEFT = 44
_PAD_BOTTOM = 34
_PAD_TOP = 10
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


def colour(index: int) -> str:
    return _PALETTE[index % len(_PALETTE)]


def _number(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}"


def _frame(body: list[str], title: str, lo: float, hi: float) -> Markup:
    plot_h = HEIGHT - _PAD_BOTTOM - _PAD_TOP
    axis = [
        f'<line x1="{_PAD_LEFT}" y1="{_PAD_TOP}" x2="{_PAD_LEFT}" y2="{_PAD_TOP + plot_h}" '
        'stroke="#888"/>',
        f'<line x1="{_PAD_LEFT}" y1="{_PAD_TOP + plot_h}" x2="{WIDTH}" y2="{_PAD_TOP + plot_h}" '
        'stroke="#888"/>',
        f'<text x="{_PAD_LEFT - 4}" y="{_PAD_TOP + 8}" text-anchor="end">{_number(hi)}</text>',
        f'<text x="{_PAD_LEFT - 4}" y="{_PAD_TOP + plot_h}" text-anchor="end">{_number(lo)}</text>',
    ]
    return Markup(
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{escape(title)}"><title>{escape(title)}</title>'
        + "".join(axis + body)
        + "</svg>"
    )


def _x_labels(labels: Sequence[str], step: float, offset: float) -> list[str]:
    every = max(1, len(labels) // 8)  # at most ~8 labels, so they never overlap
    y = HEIGHT - _PAD_BOTTOM + 14
    return [
        f'<text x="{_PAD_LEFT + offset + i * step:.1f}" y="{y}" text-anchor="middle">'
        f"{escape(label[:12])}</text>"
        for i, label in enumerate(labels)
        if i % every == 0
    ]


def stacked_bars(
    title: str, categories: Sequence[str], series: Mapping[str, Sequence[int]]
) -> Markup:
    totals = [sum(values[i] for values in series.values()) for i in range(len(categories))]
    top = max(totals, default=0) or 1
    plot_h = HEIGHT - _PAD_BOTTOM - _PAD_TOP
    step = (WIDTH - _PAD_LEFT) / max(1, len(categories))
    bar = max(1.0, step * 0.7)
    body: list[str] = []
    for i in range(len(categories)):
        y: float = _PAD_TOP + plot_h
        for s, (name, values) in enumerate(series.items()):
            if not values[i]:
                continue
            h = values[i] / top * plot_h
            y -= h
            body.append(
                f'<rect x="{_PAD_LEFT + i * step + (step - bar) / 2:.1f}" y="{y:.1f}" '
                f'width="{bar:.1f}" height="{h:.1f}" fill="{colour(s)}">'
                f"<title>{escape(categories[i])} {escape(name)}: {values[i]}</title></rect>"
            )
    body += _x_labels(categories, step, step / 2)
    return _frame(body, title, 0, top)


def line_chart(
    title: str, labels: Sequence[str], series: Mapping[str, Sequence[float | None]]
) -> Markup:
    values = [v for vs in series.values() for v in vs if v is not None]
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    if hi == lo:
        lo, hi = lo - 0.5, hi + 0.5
    plot_h = HEIGHT - _PAD_BOTTOM - _PAD_TOP
    step = (WIDTH - _PAD_LEFT - 10) / max(1, len(labels) - 1)
    body: list[str] = []
    for s, (name, points) in enumerate(series.items()):
        xy = [
            (_PAD_LEFT + 5 + i * step, _PAD_TOP + (hi - v) / (hi - lo) * plot_h)
            for i, v in enumerate(points)
            if v is not None
        ]
        if len(xy) > 1:
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
            body.append(
                f'<polyline points="{path}" fill="none" stroke="{colour(s)}" stroke-width="2">'
                f"<title>{escape(name)}</title></polyline>"
            )
        body += [
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{colour(s)}"/>'
            for x, y in xy[-200:]  # dots only where they stay distinguishable
        ]
    body += _x_labels(labels, step, 5)
    return _frame(body, title, lo, hi)
