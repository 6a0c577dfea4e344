"""HTML rendering of the Live UI: Jinja2 templates shipped in ``proxy/ui/templates``.

Contract: ``Pages()`` builds one autoescaping Jinja2 environment (per router, nothing at
import time); each method takes the frozen results of the recorder's read models
(``recorder.read_models``) and returns a complete HTML document as ``str``. Numbers and
rewards (a vector as ``[1.0, 0.0]``) and a trial's defense events' details (compact
JSON) are formatted here, sampled token ids are turned into
text here with the decoder the caller passes (the served tokenizer), charts come from
``charts``, the collapse table from ``kernel.trend``; nothing here touches the database.

What each run page charts, after LEGO-RL: the overview the training curves (Figure 3:
train reward, validation reward, policy entropy, response length) and the trainer's
flagged steps with their reasons; ``steps`` the stage times (Table 4) and the
termination profile (Figure 4, graded terminations above the zero line and excluded
ones below it, each termination in its own fixed colour); ``epochs`` the in-batch
success histogram and the zero-variance share per epoch (Figure 5).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import orjson
from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup

from kernel.trend import Trend, trend
from proxy.ui import charts
from proxy.ui.queries import SessionsQuery
from recorder.read_models.behaviour import Behaviour
from recorder.read_models.epochs import Epochs
from recorder.read_models.forks import MAX_COMPARED
from recorder.read_models.overview import NO_VERSION, Overview, VersionStats
from recorder.read_models.session_view import SessionView
from recorder.read_models.steps import TOTAL, Steps, StepTrials
from recorder.read_models.tables import (
    TASK_SORTS,
    Page,
    RunRow,
    SessionChoices,
    SessionRow,
    TaskRow,
)
from recorder.records import EXCLUDED_TERMINATIONS, STAGES

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
# The series the overview's training curves already chart are left out of its grid.
CURVE_SERIES = ("mean_reward", "response_tokens")
ALIGNMENT_CHARTS = ("pearson_r", "abs_dlogp_p99")
ENTROPY = "entropy"  # the trainer's per-step policy entropy estimate (trainer_bridge.series)


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
        grid: list[tuple[str, Markup]] = [
            (
                label,
                charts.line_chart(
                    label,
                    versions,
                    {label: [version_value(v, name) for v in overview.versions]},
                    x_title="weight version",
                ),
            )
            for label, name in VERSION_SERIES
            if name not in CURVE_SERIES
        ]
        steps = [str(p.step) for p in overview.alignment]
        flagged = [i for i, p in enumerate(overview.alignment) if p.flagged]
        alignment = [
            (
                metric,
                charts.line_chart(
                    metric,
                    steps,
                    {metric: [p.metrics.get(metric) for p in overview.alignment]},
                    x_title="trainer step",
                    marks=flagged,
                ),
            )
            for metric in ALIGNMENT_CHARTS
        ]
        validation = {v.version: v for v in overview.validation}
        return self._render(
            "overview.html",
            overview=overview,
            live=True,
            curves=training_curves(overview),
            per_version=grid,
            validation=validation,
            alignment=alignment,
            flagged=[p for p in overview.alignment if p.flagged],
            trends=collapse_rows(overview),
        )

    def steps(self, steps: Steps) -> str:
        versions = [v.version for v in steps.versions]
        reported = [s for s in STAGES if any(v.stage(s) for v in steps.versions)]
        graded, excluded = split_terminations(steps.termination_reasons)
        stage_chart = charts.stacked_bars(
            "mean seconds per stage per weight version",
            versions,
            {s: [_stage_mean(v, s) for v in steps.versions] for s in reported},
            x_title="weight version",
            colours=charts.STAGE_COLOURS,
            integer=False,
        )
        total_chart = charts.line_chart(
            "trial total: p50, p90, p99 seconds per weight version",
            versions,
            {
                f"p{p}": [_total_percentile(v, p) for v in steps.versions]
                for p in ("50", "90", "99")
            },
            x_title="weight version",
        )
        terminations = charts.diverging_bars(
            "sessions per termination per weight version: graded above, excluded below",
            versions,
            {r: [v.terminations.get(r, 0) for v in steps.versions] for r in graded},
            {r: [v.terminations.get(r, 0) for v in steps.versions] for r in excluded},
            x_title="weight version",
            colours=charts.TERMINATION_COLOURS,
        )
        return self._render(
            "steps.html",
            run_id=steps.run_id,
            steps=steps,
            live=True,
            graded=graded,
            excluded=excluded,
            colours=charts.TERMINATION_COLOURS,
            excluded_of=lambda scope: sum(scope.terminations.get(r, 0) for r in excluded),
            stage_colours=[(s, charts.STAGE_COLOURS[s]) for s in reported],
            stage_chart=stage_chart,
            total_chart=total_chart,
            terminations=terminations,
            total=TOTAL,
        )

    def epochs(self, epochs: Epochs) -> str:
        bins = epochs.bins()
        labels = [f"{k}/{n}" for k, n in bins]
        names = [epoch_name(e.epoch) for e in epochs.epochs]
        per_epoch = zip(names, epochs.epochs, strict=True)
        histogram = charts.grouped_bars(
            "prompt groups by successes k of N graded samples, per epoch",
            labels,
            {name: [e.histogram.get(b, 0) for b in bins] for name, e in per_epoch},
            x_title="successes k / N in the group",
        )
        zero_variance = charts.line_chart(
            "share of zero-variance groups (0/N or N/N) per epoch",
            names,
            {"zero-variance share": [e.zero_variance_share for e in epochs.epochs]},
            x_title="epoch",
        )
        return self._render(
            "epochs.html",
            run_id=epochs.run_id,
            epochs=epochs,
            live=True,
            bins=bins,
            names=names,
            legend=[(name, charts.colour(i)) for i, name in enumerate(names)],
            histogram=histogram,
            zero_variance=zero_variance,
        )

    def tasks(self, run_id: str, page: Page[TaskRow], sort: str) -> str:
        return self._render(
            "tasks.html",
            run_id=run_id,
            page=page,
            sort=sort,
            sorts=TASK_SORTS,
            live=True,
            sessions_of=lambda task: SessionsQuery(task=task).link(),
        )

    def sessions(
        self,
        run_id: str,
        page: Page[SessionRow],
        query: SessionsQuery | None = None,
        choices: SessionChoices | None = None,
    ) -> str:
        query = query or SessionsQuery()
        return self._render(
            "sessions.html",
            run_id=run_id,
            page=page,
            live=True,
            query=query,
            choices=choices or SessionChoices((), (), ()),
            excluded_terminations=EXCLUDED_TERMINATIONS,
            extra_query="&" + query.link(page=None)[1:],
        )

    def behaviour(self, view: Behaviour, asked_k: bool) -> str:
        return self._render("behaviour.html", view=view, run_id=view.run_id, asked_k=asked_k)

    def session(self, view: SessionView, token_text: Callable[[int], str]) -> str:
        """``token_text`` decodes one sampled id; it is only called for the tokens shown."""
        live = view.status != "finished"
        return self._render(
            "session.html",
            view=view,
            live=live,
            token_text=token_text,
            max_compared=MAX_COMPARED,
        )


def training_curves(overview: Overview) -> list[tuple[str, Markup]]:
    """Figure 3: train and validation reward and response length over weight versions
    (training sessions; validation ones for the validation curve), policy entropy over
    trainer steps (the trainer's estimate)."""
    labels = overview.curve_versions()
    train = {v.version: v for v in overview.versions}
    held_out = {v.version: v for v in overview.validation}

    def over_versions(label: str, values: Sequence[float | None]) -> tuple[str, Markup]:
        return label, charts.line_chart(label, labels, {label: values}, x_title="weight version")

    steps = [str(p.step) for p in overview.alignment]
    entropy = [p.metrics.get(ENTROPY) for p in overview.alignment]
    return [
        over_versions("train reward", [_get(train, v, "mean_reward") for v in labels]),
        over_versions("validation reward", [_get(held_out, v, "mean_reward") for v in labels]),
        (
            "policy entropy",
            charts.line_chart(
                "policy entropy", steps, {"policy entropy": entropy}, x_title="trainer step"
            ),
        ),
        over_versions(
            "mean response length (tokens)", [_get(train, v, "response_tokens") for v in labels]
        ),
    ]


def _get(by_version: Mapping[str, object], version: str, name: str) -> float | None:
    stats = by_version.get(version)
    value = getattr(stats, name, None) if stats is not None else None
    return None if value is None else float(value)


def split_terminations(reasons: Sequence[str]) -> tuple[list[str], list[str]]:
    """(graded, excluded): graded ones (and unfinished sessions) count for training."""
    order = list(charts.TERMINATION_COLOURS)
    ranked = sorted(reasons, key=lambda r: (order.index(r) if r in order else len(order), r))
    return (
        [r for r in ranked if r not in EXCLUDED_TERMINATIONS],
        [r for r in ranked if r in EXCLUDED_TERMINATIONS],
    )


def epoch_name(epoch: int | None) -> str:
    return "unnamed groups" if epoch is None else f"epoch {epoch}"


def _stage_mean(scope: StepTrials, stage: str) -> float:
    stats = scope.stage(stage)
    return 0.0 if stats is None else stats.mean


def _total_percentile(scope: StepTrials, percentile: str) -> float | None:
    stats = scope.stage(TOTAL)
    return None if stats is None else float(getattr(stats, f"p{percentile}"))


def page_links(page: Page[object]) -> Sequence[int]:
    """Page numbers worth linking: the ends and a window around the current page."""
    wanted = {1, page.pages, *range(max(1, page.page - 2), min(page.pages, page.page + 2) + 1)}
    return sorted(wanted)
