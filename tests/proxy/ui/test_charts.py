"""The SVG charts: axes whose labels tell close values apart and fit in the box, bars that
add up, excluded terminations below the zero line, and fixed colours per termination."""

from __future__ import annotations

import re

import pytest

from proxy.ui import charts
from proxy.ui.charts import CHAR_WIDTH, HEIGHT, WIDTH, tick_label, ticks


def y_labels(svg: str) -> list[str]:
    return re.findall(r'<text class="y-tick"[^>]*>([^<]*)</text>', svg)


def attr(tag: str, name: str) -> float:
    match = re.search(rf'{name}="([-\d.]+)"', tag)
    assert match, (name, tag)
    return float(match.group(1))


def test_close_pearson_values_get_distinct_labels() -> None:
    values = [0.9991, 0.9993, 0.9995, 0.9999]
    svg = charts.line_chart("pearson_r", ["0", "1", "2", "3"], {"pearson_r": values})
    labels = y_labels(svg)
    assert labels == ["0.9990", "0.9992", "0.9994", "0.9996", "0.9998", "1.0000"]
    assert len(set(labels)) == len(labels)


@pytest.mark.parametrize(
    ("lo", "hi", "expected"),
    [
        (0.0007, 0.0027, ["0.0005", "0.0010", "0.0015", "0.0020", "0.0025", "0.0030"]),
        (0.05, 0.351, ["0", "0.1", "0.2", "0.3", "0.4"]),
        (2276.0, 12170.0, ["0", "5000", "10,000", "15,000"]),
        (-0.2, 0.2, ["-0.2", "-0.1", "0", "0.1", "0.2"]),
    ],
)
def test_ticks_are_nice_and_cover_the_values(lo: float, hi: float, expected: list[str]) -> None:
    values, decimals = ticks(lo, hi)
    assert [tick_label(v, decimals) for v in values] == expected
    assert values[0] <= lo
    assert values[-1] >= hi


def test_counts_get_whole_ticks() -> None:
    values, decimals = ticks(0, 3, integer=True)
    assert (values, decimals) == ([0.0, 1.0, 2.0, 3.0], 0)
    assert ticks(0, 1, integer=True)[0] == [0.0, 1.0]


def test_every_label_fits_inside_the_chart() -> None:
    tiny = [0.00071234, 0.00269, 0.0012]
    svg = charts.line_chart("p99", ["10", "11", "12"], {"abs_dlogp_p99": tiny}, x_title="step")
    long_ends = charts.line_chart("z", ["epoch 0", "epoch 1", "epoch 12345678"], {"z": [1, 2, 3]})
    for tag in re.findall(r"<text [^>]*>[^<]*</text>", svg + long_ends):
        text = re.sub(r"<[^>]+>", "", tag)
        x, y = attr(tag, "x"), attr(tag, "y")
        width = CHAR_WIDTH * len(text)
        if 'text-anchor="end"' in tag:
            left, right = x - width, x
        elif 'text-anchor="middle"' in tag:
            left, right = x - width / 2, x + width / 2
        else:
            left, right = x, x + width
        assert left >= 0
        assert right <= WIDTH
        assert 8 <= y <= HEIGHT, tag
    lowest = y_labels(svg)[0]
    assert lowest == "0.0005"


def test_a_chart_without_points_says_so() -> None:
    svg = charts.line_chart("entropy", [], {"entropy": []})
    assert "no data yet" in svg
    assert "<polyline" not in svg


def test_flagged_steps_are_ringed() -> None:
    svg = charts.line_chart("r", ["0", "1", "2"], {"r": [0.99, 0.97, 0.99]}, marks=[1])
    assert svg.count('class="mark"') == 1


def test_diverging_bars_put_excluded_below_the_zero_line() -> None:
    svg = charts.diverging_bars(
        "t",
        ["v0", "v1"],
        {"completed": [3, 2], "max_turns": [1, 0]},
        {"agent_timeout": [2, 0]},
        colours=charts.TERMINATION_COLOURS,
    )
    [zero_line] = re.findall(r'<line class="zero"[^>]*>', svg)
    zero = attr(zero_line, "y1")
    ups = re.findall(r'<rect class="up"[^>]*>', svg)
    downs = re.findall(r'<rect class="down"[^>]*>', svg)
    assert len(ups) == 3  # a zero count draws nothing
    assert len(downs) == 1
    for rect in ups:
        assert attr(rect, "y") + attr(rect, "height") <= zero + 0.1
    assert attr(downs[0], "y") == pytest.approx(zero, abs=0.1)
    # Two units above and below scale alike: 4 completed+max_turns vs 2 timeouts at v0.
    up_height = sum(attr(r, "height") for r in ups[:2])
    assert up_height == pytest.approx(2 * attr(downs[0], "height"), abs=0.2)
    assert y_labels(svg)[0] == "2"  # below the line, counts read positive
    assert f'fill="{charts.TERMINATION_COLOURS["agent_timeout"]}"' in downs[0]


def test_a_termination_keeps_its_colour_whatever_the_order() -> None:
    one = charts.stacked_bars(
        "a", ["v"], {"completed": [1], "harness_error": [1]}, colours=charts.TERMINATION_COLOURS
    )
    other = charts.stacked_bars(
        "b", ["v"], {"harness_error": [1], "completed": [1]}, colours=charts.TERMINATION_COLOURS
    )
    for svg in (one, other):
        assert re.search(r'fill="#59a14f"><title>v completed', svg)
        assert re.search(r'fill="#9c755f"><title>v harness_error', svg)
    unknown = charts.stacked_bars("c", ["v"], {"new": [1]}, colours=charts.TERMINATION_COLOURS)
    assert f'fill="{charts.UNKNOWN_COLOUR}"' in unknown


def test_grouped_bars_draw_one_bar_per_series_and_category() -> None:
    series = {"epoch 0": [1, 0, 3], "epoch 1": [2, 2, 0]}
    svg = charts.grouped_bars("h", ["0/2", "1/2", "2/2"], series)
    bars = re.findall(r"<rect [^>]*><title>([^<]*)</title>", svg)
    assert bars == ["epoch 0 0/2: 1", "epoch 1 0/2: 2", "epoch 1 1/2: 2", "epoch 0 2/2: 3"]
    assert y_labels(svg) == ["0", "1", "2", "3"]


def test_labels_are_escaped() -> None:
    svg = charts.stacked_bars("<t>", ["<v>"], {"<s>": [1]})
    assert "<v>" not in svg
    assert "&lt;v&gt;" in svg
    assert "&lt;s&gt;" in svg
