"""HTML rendering of the Live UI: Jinja2 templates shipped in ``proxy/ui/templates``.

Contract: ``Pages()`` builds one autoescaping Jinja2 environment (per router, nothing at
import time); each method takes the frozen results of the recorder's read models
(``recorder.read_models``) and returns a complete HTML document as ``str``. Numbers and
rewards (a vector as ``[1.0, 0.0]``) and a trial's defense events' details (compact
JSON) are formatted here, sampled token ids are turned into
text here with the decoder the caller passes (the served tokenizer), charts come from
``charts``, the collapse table from ``kernel.trend``; nothing here touches the database.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import orjson
from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup

from kernel.trend import Trend, trend
from proxy.ui import charts
from recorder.read_models.behaviour import Behaviour
from recorder.read_models.overview import NO_VERSION, Overview, VersionStats
from recorder.read_models.session_view import SessionView
from recorder.read_models.tables import TASK_SORTS, Page, RunRow, SessionRow, TaskRow

MISSING = "\u2013"  # an en dash stands for "no value"
REFRESH_S = 10  # how often live pages reload themselves while the "live" box is ticked

# (label, attribute of VersionStats or a derived name) of the series charted per version.
VERSION_SERIES = (
    ("mean reward", "mean_reward"),
    ("solve rate", "solve_rate"),
    ("turns per trajectory", "turns_per_trajectory"),
    ("response length (tokens)", "response_tokens"),
    ("tokens per turn", "tokens_per_turn"),
    ("malformed tool calls per turn", "malformed_per_turn"),
    ("zero-variance group share", "zero_variance_share"),
)


@dataclass(frozen=True, slots=True)
class TrendRow:
    axis: str  # "weight versions" | "trainer steps"
    trend: Trend


def version_value(stats: VersionStats, name: str) -> float | None:
    if name == "tokens_per_turn":
        if stats.response_tokens is None or not stats.turns_per_trajectory:
            return None
        return stats.response_tokens / stats.turns_per_trajectory
    value = getattr(stats, name)
    return None if value is None else float(value)


def collapse_rows(overview: Overview) -> list[TrendRow]:
    """One trend per per-version series and per alignment metric, flagged rows first."""
    versions = [v for v in overview.versions if v.version != NO_VERSION]
    rows = [
        TrendRow("weight versions", trend(label, [version_value(v, name) for v in versions]))
        for label, name in VERSION_SERIES
    ]
    for metric in alignment_metrics(overview):
        values = [p.metrics.get(metric) for p in overview.alignment]
        rows.append(TrendRow("trainer steps", trend(metric, values)))
    return sorted(rows, key=lambda r: not r.trend.flagged)


def alignment_metrics(overview: Overview) -> list[str]:
    seen: dict[str, None] = {}
    for point in overview.alignment:
        seen.update(dict.fromkeys(point.metrics))
    return list(seen)


def fmt(value: float | int | None, digits: int = 3) -> str:
    if value is None:
        return MISSING
    if isinstance(value, int):
        return str(value)
    if math.isinf(value):
        return "∞" if value > 0 else "-∞"
    return f"{value:.{digits}g}" if abs(value) < 1000 else f"{value:,.0f}"


def reward(value: float | tuple[float, ...] | None) -> str:
    if isinstance(value, tuple):
        return "[" + ", ".join(str(float(x)) for x in value) + "]"
    return fmt(value, 4)


def pct(value: float | None) -> str:
    return MISSING if value is None else f"{value * 100:.1f}%"


def compact_json(value: object) -> str:
    # Plain text, escaped by the template like any other (Jinja's tojson escapes for
    # scripts, which would show "\u003c" on the page).
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def token_style(logprob: float) -> str:
    # Green for a confident token, through yellow, to red for an unlikely one.
    probability = math.exp(max(logprob, -50.0))
    return f"background: hsl({probability * 120:.0f}, 75%, 82%)"


class Pages:
    def __init__(self) -> None:
        self._env = Environment(
            loader=PackageLoader("proxy.ui", "templates"),
            autoescape=select_autoescape(default=True),
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self._env.filters.update(
            fmt=fmt, pct=pct, reward=reward, token_style=token_style, compact_json=compact_json
        )
        self._env.globals.update(refresh_s=REFRESH_S, page_links=page_links)

    def _render(self, name: str, **context: object) -> str:
        return self._env.get_template(name).render(**context)

    def login(self, error: str | None, next_url: str) -> str:
        return self._render("login.html", error=error, next_url=next_url)

    def error(self, status: int, message: str) -> str:
        return self._render("error.html", status=status, message=message)

    def runs(self, page: Page[RunRow]) -> str:
        return self._render("runs.html", page=page, live=True)

    def overview(self, overview: Overview) -> str:
        versions = [v.version for v in overview.versions]
        reasons = list(overview.termination_reasons)
        terminations = charts.stacked_bars(
            "sessions by termination reason per weight version",
            versions,
            {r: [v.terminations.get(r, 0) for v in overview.versions] for r in reasons},
        )
        per_version: list[tuple[str, Markup]] = [
            (
                label,
                charts.line_chart(
                    label, versions, {label: [version_value(v, name) for v in overview.versions]}
                ),
            )
            for label, name in VERSION_SERIES
        ]
        steps = [str(p.step) for p in overview.alignment]
        alignment = [
            (
                metric,
                charts.line_chart(
                    metric, steps, {metric: [p.metrics.get(metric) for p in overview.alignment]}
                ),
            )
            for metric in ("pearson_r", "abs_dlogp_p99")
        ]
        return self._render(
            "overview.html",
            overview=overview,
            live=True,
            reasons=reasons,
            legend=[(r, charts.colour(i)) for i, r in enumerate(reasons)],
            terminations=terminations,
            per_version=per_version,
            alignment=alignment,
            flagged_steps=sum(p.flagged for p in overview.alignment),
            trends=collapse_rows(overview),
        )

    def tasks(self, run_id: str, page: Page[TaskRow], sort: str) -> str:
        return self._render(
            "tasks.html", run_id=run_id, page=page, sort=sort, sorts=TASK_SORTS, live=True
        )

    def sessions(self, run_id: str, page: Page[SessionRow]) -> str:
        return self._render("sessions.html", run_id=run_id, page=page, live=True)

    def behaviour(self, view: Behaviour, asked_k: bool) -> str:
        return self._render("behaviour.html", view=view, run_id=view.run_id, asked_k=asked_k)

    def session(self, view: SessionView, token_text: Callable[[int], str]) -> str:
        """``token_text`` decodes one sampled id; it is only called for the tokens shown."""
        live = view.status != "finished"
        return self._render("session.html", view=view, live=live, token_text=token_text)


def page_links(page: Page[object]) -> Sequence[int]:
    """Page numbers worth linking: the ends and a window around the current page."""
    wanted = {1, page.pages, *range(max(1, page.page - 2), min(page.pages, page.page + 2) + 1)}
    return sorted(wanted)
