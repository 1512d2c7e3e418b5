"""The inline SVG charts: well-formed, escaped, accessible, and drawn to scale."""

from __future__ import annotations

import itertools
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta

import pytest

from controlplane.render.plots import BarSeries, QuotaRow, Series, bar_chart, line_chart, quota_bars

NS = {"svg": "http://www.w3.org/2000/svg"}
HOSTILE = '<script>alert("x")</script>&\'team'
T0 = datetime(2026, 12, 1, tzinfo=UTC)


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)  # raises on anything not well-formed
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    return root


def all_text(root: ET.Element) -> str:
    return " ".join("".join(e.itertext()) for e in root.iter())


def bars(root: ET.Element) -> list[ET.Element]:
    return [e for e in root.iter("{http://www.w3.org/2000/svg}rect") if e.get("class") == "bar"]


def assert_self_contained(svg: str) -> None:
    lowered = svg.lower()
    assert "<script" not in lowered
    assert "href" not in lowered
    assert "http" not in lowered.replace("http://www.w3.org/2000/svg", "")
    assert "@import" not in lowered
    assert "url(" not in lowered


def test_every_chart_is_accessible_and_self_contained() -> None:
    charts = [
        line_chart([Series("a", [(T0, 1.0), (T0 + timedelta(hours=1), 2.0)])], title="Lines", y_unit="GPU-hours"),
        bar_chart(["x"], [BarSeries("a", [1.0])], title="Bars", y_unit="GPU-hours"),
        quota_bars([QuotaRow("q", 1, 1, 0, 2)], title="Quotas"),
    ]
    for svg, title in zip(charts, ["Lines", "Bars", "Quotas"], strict=True):
        root = parse(svg)
        assert root.get("role") == "img"
        assert (root.get("aria-label") or "").startswith(title)
        assert root.findtext("svg:title", namespaces=NS) == title
        assert_self_contained(svg)


def test_a_hostile_name_is_escaped_everywhere() -> None:
    svgs = [
        line_chart([Series(HOSTILE, [(T0, 1.0)])], title=HOSTILE, y_unit=HOSTILE),
        bar_chart([HOSTILE], [BarSeries(HOSTILE, [3.0])], title=HOSTILE, y_unit=HOSTILE, stacked=True),
        quota_bars([QuotaRow(HOSTILE, 1, 2, 1, None)], title=HOSTILE, unit=HOSTILE),
    ]
    for svg in svgs:
        assert "<script" not in svg
        root = parse(svg)
        # The name survives as text (escaped in the markup, intact once parsed).
        assert HOSTILE in all_text(root)
        assert root.findtext("svg:title", namespaces=NS) == HOSTILE


@pytest.mark.parametrize(
    "svg",
    [
        line_chart([], title="t", y_unit="u"),
        line_chart([Series("a", [])], title="t", y_unit="u"),
        line_chart([Series("a", [(T0, float("nan")), (T0, None)])], title="t", y_unit="u"),
        bar_chart([], [], title="t", y_unit="u"),
        bar_chart(["a"], [BarSeries("s", [None])], title="t", y_unit="u"),
        quota_bars([], title="t"),
    ],
)
def test_empty_data_says_no_data(svg: str) -> None:
    root = parse(svg)
    assert "no data" in all_text(root)
    assert not bars(root)


def test_the_tallest_bar_is_the_largest_value_and_heights_are_proportional() -> None:
    values = [3.0, 12.0, 7.5]
    root = parse(bar_chart(["a", "b", "c"], [BarSeries("used", values)], title="t", y_unit="GPU-hours"))
    drawn = bars(root)
    heights = [float(b.get("height", "0")) for b in drawn]
    assert [b.get("data-category") for b in drawn] == ["a", "b", "c"]
    assert heights.index(max(heights)) == 1
    # Linear from a zero baseline: 12 is four times as tall as 3.
    assert heights[1] == pytest.approx(4 * heights[0], rel=0.01)
    assert heights[2] == pytest.approx(2.5 * heights[0], rel=0.01)
    bottoms = {round(float(b.get("y", "0")) + float(b.get("height", "0")), 1) for b in drawn}
    assert len(bottoms) == 1  # every bar stands on the same axis


def test_stacked_bars_sit_on_each_other() -> None:
    root = parse(
        bar_chart(["team"], [BarSeries("used", [2.0]), BarSeries("idle", [6.0])], title="t", y_unit="h", stacked=True)
    )
    used, idle = bars(root)
    assert float(idle.get("y", "0")) + float(idle.get("height", "0")) == pytest.approx(
        float(used.get("y", "0")), abs=0.1
    )
    assert float(idle.get("height", "0")) == pytest.approx(3 * float(used.get("height", "0")), rel=0.01)


def test_negative_and_non_finite_bar_values_are_drawn_as_zero() -> None:
    root = parse(bar_chart(["a", "b", "c"], [BarSeries("s", [-5.0, float("inf"), 4.0])], title="t", y_unit="h"))
    heights = [float(b.get("height", "0")) for b in bars(root)]
    assert heights[0] == 0
    assert heights[1] == 0
    assert heights[2] > 0


def test_all_zeros_still_draw_an_axis() -> None:
    root = parse(bar_chart(["a", "b"], [BarSeries("s", [0.0, 0.0])], title="t", y_unit="h"))
    assert [float(b.get("height", "0")) for b in bars(root)] == [0, 0]
    assert "no data" not in all_text(root)
    assert "1" in all_text(root)  # the 0..1 axis has labels


def test_huge_values_get_short_labels() -> None:
    root = parse(bar_chart(["a"], [BarSeries("s", [3.2e12])], title="t", y_unit="$"))
    text = all_text(root)
    assert "T" in text  # 3.2e12 is labelled in trillions
    assert "e+" not in text


def test_line_points_map_time_to_x_and_value_to_y() -> None:
    points: list[tuple[datetime, float | None]] = [(T0 + timedelta(hours=h), float(h * 10)) for h in range(5)]
    root = parse(line_chart([Series("alloc", points)], title="t", y_unit="GPU-hours"))
    circles = list(root.iter("{http://www.w3.org/2000/svg}circle"))
    xs = [float(c.get("cx", "0")) for c in circles]
    ys = [float(c.get("cy", "0")) for c in circles]
    assert xs == sorted(xs)
    gaps = [b - a for a, b in itertools.pairwise(xs)]
    assert max(gaps) - min(gaps) < 0.2  # equal time steps, equal distances
    assert ys == sorted(ys, reverse=True)  # higher values are higher up (smaller y)
    assert ys[0] - ys[4] == pytest.approx(4 * (ys[0] - ys[1]), rel=0.01)
    assert "12-01 00:00" in all_text(root)


def test_a_gap_splits_the_line_and_one_point_is_still_drawn() -> None:
    series = Series("s", [(T0, 1.0), (T0 + timedelta(hours=1), 2.0), (T0 + timedelta(hours=2), None),
                          (T0 + timedelta(hours=3), 1.0), (T0 + timedelta(hours=4), 3.0)])  # fmt: skip
    root = parse(line_chart([series], title="t", y_unit="u"))
    assert len(list(root.iter("{http://www.w3.org/2000/svg}polyline"))) == 2
    single = parse(line_chart([Series("s", [(T0, 5.0)])], title="t", y_unit="u"))
    assert len(list(single.iter("{http://www.w3.org/2000/svg}circle"))) == 1


def test_negative_line_values_extend_the_axis_below_zero() -> None:
    root = parse(line_chart([Series("s", [(T0, -4.0), (T0 + timedelta(hours=1), 6.0)])], title="t", y_unit="u"))
    low, high = (float(c.get("cy", "0")) for c in root.iter("{http://www.w3.org/2000/svg}circle"))
    assert low > high
    assert "-4" in all_text(root) or "-5" in all_text(root)


def test_quota_bars_split_used_into_guaranteed_and_borrowed_and_scale_to_the_limit() -> None:
    root = parse(quota_bars([QuotaRow("q", guaranteed=8, used=10, borrowed=2, limit=16)], title="t"))

    def width(cls: str) -> float:
        rect = next(e for e in root.iter("{http://www.w3.org/2000/svg}rect") if e.get("class") == cls)
        return float(rect.get("width", "0"))

    assert width("used") == pytest.approx(4 * width("borrowed"), rel=0.01)  # 8 within vs 2 borrowed
    assert width("limit") == pytest.approx(2 * width("used"), rel=0.01)  # limit 16 vs 8
    line = next(e for e in root.iter("{http://www.w3.org/2000/svg}line") if e.get("class") == "guaranteed")
    used = next(e for e in root.iter("{http://www.w3.org/2000/svg}rect") if e.get("class") == "used")
    assert float(line.get("x1", "0")) == pytest.approx(float(used.get("x", "0")) + width("used"), abs=0.1)


def test_an_unlimited_queue_is_marked_as_such() -> None:
    root = parse(quota_bars([QuotaRow("q", 1, 1, 0, None)], title="t"))
    assert "unlimited" in all_text(root)
    assert "∞" in all_text(root)
