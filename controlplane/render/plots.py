"""Inline SVG charts: values over time, values per category, and quota bars.

Each function takes plain data and returns one self-contained `<svg>` element as a string: no
JavaScript, no external font, stylesheet or URL, every user-supplied text escaped. The root carries
`role="img"`, an `aria-label` and a `<title>`; every bar and point has its own `<title>` with the
exact value, which a browser shows on hover and a screen reader can read.

Robustness rules, the same in every chart:
- no series, or no finite value at all, draws a chart that says "no data";
- NaN and infinities are dropped (a gap in a line), magnitudes are clamped to 1e18;
- bar quantities (hours, GPUs, money) are never negative: a negative value is drawn as 0, while
  a line chart may go below zero (its axis then includes the negative range);
- an all-zero chart still has an axis (0 to 1), a single time point is drawn in the middle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from controlplane.render.svg import (
    FONT,
    Scale,
    as_utc,
    clean,
    colour,
    esc,
    fmt_number,
    legend,
    legend_rows,
    nice_ticks,
    no_data,
    non_negative,
    open_svg,
    time_label,
    time_ticks,
    truncate,
    y_axis,
)

WIDTH = 720
HEIGHT = 320
LEFT, RIGHT, TOP = 70.0, 20.0, 48.0
# Points beyond this many per series are drawn as a line only (markers would be noise).
MARKER_LIMIT = 60
CATEGORY_LABEL = 14


@dataclass(frozen=True)
class Series:
    """A named line: (time, value) points; a None value leaves a gap."""

    name: str
    points: Sequence[tuple[datetime, float | None]]


@dataclass(frozen=True)
class BarSeries:
    """A named set of bars, one value per category (in the order of the chart's categories)."""

    name: str
    values: Sequence[float | None]


@dataclass(frozen=True)
class QuotaRow:
    """One queue or team: what it is guaranteed, what it uses (borrowed is the part above its
    guarantee), and its limit (None: unlimited)."""

    name: str
    guaranteed: float
    used: float
    borrowed: float = 0.0
    limit: float | None = None


def _bottom(names: Sequence[str], width: float) -> float:
    return 46.0 + 18.0 * legend_rows(names, width - LEFT - RIGHT)


def line_chart(
    series: Sequence[Series],
    *,
    title: str,
    y_unit: str,
    width: int = WIDTH,
    height: int = HEIGHT,
    summary: str = "",
) -> str:
    """Values over time, one line per series, with a UTC time axis."""
    lines = [
        (s.name, [(as_utc(t).timestamp(), v) for t, raw in s.points if (v := clean(raw)) is not None]) for s in series
    ]
    values = [v for _, pts in lines for _, v in pts]
    if not values:
        return no_data(title, width, height)
    times = [t for _, pts in lines for t, _ in pts]
    t0, t1 = min(times), max(times)
    bottom = height - _bottom([name for name, _ in lines], width)
    ticks = nice_ticks(min(0.0, *values), max(0.0, *values))
    ys = Scale(ticks[0], ticks[-1], bottom, TOP)
    xs = Scale(t0, t1, LEFT + 8, width - RIGHT - 8)
    text = (
        summary
        or f"{len(series)} series from {time_label(t0, '%Y-%m-%d %H:%M')} to {time_label(t1, '%Y-%m-%d %H:%M')} UTC"
    )
    parts = open_svg(width, height, title, text)
    parts += y_axis(ys, ticks, left=LEFT, right=width - RIGHT, unit=y_unit)
    x_ticks, pattern = time_ticks(t0, t1)
    parts.append('<g class="x-axis">')
    parts.append(f'<line x1="{LEFT}" y1="{bottom:.1f}" x2="{width - RIGHT}" y2="{bottom:.1f}" stroke="#333333"/>')
    for tick in x_ticks:
        x = xs(tick)
        parts.append(f'<line x1="{x:.1f}" y1="{bottom:.1f}" x2="{x:.1f}" y2="{bottom + 4:.1f}" stroke="#333333"/>')
        parts.append(
            f'<text x="{x:.1f}" y="{bottom + 16:.1f}" text-anchor="middle" {FONT} font-size="11">'
            f"{esc(time_label(tick, pattern))}</text>"
        )
    parts.append(
        f'<text x="{width - RIGHT:.1f}" y="{bottom + 30:.1f}" text-anchor="end" {FONT} font-size="11">time (UTC)</text>'
    )
    parts.append("</g>")
    for index, (name, pts) in enumerate(lines):
        fill = colour(index)
        parts.append(f'<g class="series" data-series="{esc(name)}">')
        # A None value in the input splits the line: each run of consecutive points is one path.
        for run in _runs(series[index].points):
            coords = " ".join(f"{xs(as_utc(t).timestamp()):.1f},{ys(v):.1f}" for t, v in run)
            if len(run) > 1:
                parts.append(f'<polyline points="{coords}" fill="none" stroke="{fill}" stroke-width="2"/>')
        if len(pts) <= MARKER_LIMIT:
            for t, v in pts:
                parts.append(
                    f'<circle cx="{xs(t):.1f}" cy="{ys(v):.1f}" r="3" fill="{fill}" data-value="{v!r}">'
                    f"<title>{esc(name)}, {esc(time_label(t, '%Y-%m-%d %H:%M'))} UTC: "
                    f"{esc(fmt_number(v))} {esc(y_unit)}</title></circle>"
                )
        parts.append("</g>")
    parts += legend(
        [(name, colour(i)) for i, (name, _) in enumerate(lines)],
        x=LEFT,
        y=bottom + 46,
        width=width - LEFT - RIGHT,
        shape="line",
    )
    parts.append("</svg>")
    return "\n".join(parts)


def _runs(points: Sequence[tuple[datetime, float | None]]) -> list[list[tuple[datetime, float]]]:
    runs: list[list[tuple[datetime, float]]] = [[]]
    for moment, raw in points:
        value = clean(raw)
        if value is None:
            if runs[-1]:
                runs.append([])
        else:
            runs[-1].append((moment, value))
    return [run for run in runs if run]


def bar_chart(
    categories: Sequence[str],
    series: Sequence[BarSeries],
    *,
    title: str,
    y_unit: str,
    stacked: bool = False,
    width: int = WIDTH,
    height: int = HEIGHT,
    summary: str = "",
) -> str:
    """Vertical bars per category: grouped side by side, or stacked (e.g. used under allocated)."""
    grid = [[non_negative(s.values[i] if i < len(s.values) else None) for s in series] for i in range(len(categories))]
    if not categories or not series or not any(clean(v) is not None for s in series for v in s.values):
        return no_data(title, width, height)
    tops = [sum(row) for row in grid] if stacked else [max(row) for row in grid]
    width = max(width, int(LEFT + RIGHT + len(categories) * (28 if stacked else 12 * len(series) + 16)))
    bottom = height - _bottom([s.name for s in series], width)
    ticks = nice_ticks(0.0, max(tops))
    ys = Scale(ticks[0], ticks[-1], bottom, TOP)
    band = (width - LEFT - RIGHT) / len(categories)
    text = summary or f"{len(categories)} categories, {len(series)} series, {'stacked' if stacked else 'grouped'}"
    parts = open_svg(width, height, title, text)
    parts += y_axis(ys, ticks, left=LEFT, right=width - RIGHT, unit=y_unit)
    parts.append(f'<line x1="{LEFT}" y1="{bottom:.1f}" x2="{width - RIGHT}" y2="{bottom:.1f}" stroke="#333333"/>')
    inner = band * 0.8
    for ci, category in enumerate(categories):
        x0 = LEFT + ci * band + band * 0.1
        parts.append(
            f'<text x="{x0 + inner / 2:.1f}" y="{bottom + 16:.1f}" text-anchor="middle" {FONT} font-size="11">'
            f"<title>{esc(category)}</title>{esc(truncate(category, CATEGORY_LABEL))}</text>"
        )
        base = 0.0
        for si, s in enumerate(series):
            value = grid[ci][si]
            if stacked:
                x, w, lo, hi = x0, inner, base, base + value
                base = hi
            else:
                w = inner / len(series)
                x, lo, hi = x0 + si * w, 0.0, value
            y_top, y_low = ys(hi), ys(lo)
            parts.append(
                f'<rect class="bar" x="{x:.1f}" y="{y_top:.2f}" width="{max(w - 1, 1):.1f}" '
                f'height="{y_low - y_top:.2f}" fill="{colour(si)}" data-series="{esc(s.name)}" '
                f'data-category="{esc(category)}" data-value="{value!r}">'
                f"<title>{esc(category)}, {esc(s.name)}: {esc(fmt_number(value))} {esc(y_unit)}</title></rect>"
            )
    parts += legend(
        [(s.name, colour(i)) for i, s in enumerate(series)], x=LEFT, y=bottom + 46, width=width - LEFT - RIGHT
    )
    parts.append("</svg>")
    return "\n".join(parts)


QUOTA_COLOURS = {"used": "#0072b2", "borrowed": "#e69f00", "guaranteed": "#009e73", "limit": "#333333"}


def quota_bars(
    rows: Sequence[QuotaRow], *, title: str, unit: str = "GPU", width: int = WIDTH, summary: str = ""
) -> str:
    """One horizontal bar per queue or team: used within its guarantee, borrowed above it, a tick at
    the guarantee and a bar end at the limit (an open end, '∞', when unlimited)."""
    if not rows:
        return no_data(title, width, 120)
    label_width = 130.0
    row_height = 26.0
    height = int(TOP + len(rows) * row_height + 70)
    scale_top = max(
        max(non_negative(r.limit), non_negative(r.used), non_negative(r.guaranteed), non_negative(r.borrowed))
        for r in rows
    )
    ticks = nice_ticks(0.0, scale_top)
    xs = Scale(ticks[0], ticks[-1], label_width, width - RIGHT - 20)
    text = summary or f"{len(rows)} rows: used, borrowed, guaranteed and limit in {unit}"
    parts = open_svg(width, height, title, text)
    axis_y = TOP + len(rows) * row_height
    parts.append('<g class="x-axis">')
    for tick in ticks:
        x = xs(tick)
        parts.append(f'<line x1="{x:.1f}" y1="{TOP - 4:.1f}" x2="{x:.1f}" y2="{axis_y:.1f}" stroke="#dddddd"/>')
        parts.append(
            f'<text x="{x:.1f}" y="{axis_y + 14:.1f}" text-anchor="middle" {FONT} font-size="11">'
            f"{esc(fmt_number(tick))}</text>"
        )
    parts.append(
        f'<text x="{width - RIGHT:.1f}" y="{axis_y + 28:.1f}" text-anchor="end" {FONT} font-size="11" '
        f'class="unit">{esc(unit)}</text>'
    )
    parts.append("</g>")
    for ri, row in enumerate(rows):
        y = TOP + ri * row_height
        used, borrowed = non_negative(row.used), non_negative(row.borrowed)
        borrowed = min(borrowed, used)
        within = used - borrowed
        guaranteed = non_negative(row.guaranteed)
        limit = None if row.limit is None else non_negative(row.limit)
        name = esc(row.name)
        limit_text = "unlimited" if limit is None else f"{fmt_number(limit)} {unit}"
        parts.append(f'<g class="quota-row" data-name="{name}">')
        parts.append(
            f'<text x="{label_width - 8:.1f}" y="{y + 16:.1f}" text-anchor="end" {FONT} font-size="12">'
            f"<title>{name}</title>{esc(truncate(row.name, 18))}</text>"
        )
        track_end = xs(limit) if limit is not None else width - RIGHT - 20
        # An unlimited row has no end: its track is dashed and ends in '∞'.
        dash = "" if limit is not None else ' stroke-dasharray="4 3"'
        parts.append(
            f'<rect class="limit" x="{label_width:.1f}" y="{y + 4:.1f}" width="{track_end - label_width:.1f}" '
            f'height="16" fill="#f2f2f2" stroke="{QUOTA_COLOURS["limit"]}" stroke-width="1"{dash} '
            f'data-value="{limit!r}">'
            f"<title>{name}: limit {esc(limit_text)}</title></rect>"
        )
        parts.append(
            f'<rect class="used" x="{label_width:.1f}" y="{y + 6:.1f}" width="{xs(within) - label_width:.2f}" '
            f'height="12" fill="{QUOTA_COLOURS["used"]}" data-value="{within!r}">'
            f"<title>{name}: used {esc(fmt_number(used))} {esc(unit)}</title></rect>"
        )
        parts.append(
            f'<rect class="borrowed" x="{xs(within):.2f}" y="{y + 6:.1f}" width="{xs(used) - xs(within):.2f}" '
            f'height="12" fill="{QUOTA_COLOURS["borrowed"]}" data-value="{borrowed!r}">'
            f"<title>{name}: borrowed {esc(fmt_number(borrowed))} {esc(unit)}</title></rect>"
        )
        gx = xs(guaranteed)
        parts.append(
            f'<line class="guaranteed" x1="{gx:.2f}" y1="{y + 1:.1f}" x2="{gx:.2f}" y2="{y + 23:.1f}" '
            f'stroke="{QUOTA_COLOURS["guaranteed"]}" stroke-width="3" data-value="{guaranteed!r}">'
            f"<title>{name}: guaranteed {esc(fmt_number(guaranteed))} {esc(unit)}</title></line>"
        )
        if limit is None:
            parts.append(
                f'<text x="{track_end + 4:.1f}" y="{y + 16:.1f}" {FONT} font-size="12">∞<title>unlimited</title></text>'
            )
        parts.append("</g>")
    entries = [(f"used ({unit})", QUOTA_COLOURS["used"]), ("borrowed", QUOTA_COLOURS["borrowed"])]
    entries += [("guaranteed", QUOTA_COLOURS["guaranteed"]), ("limit", QUOTA_COLOURS["limit"])]
    parts += legend(entries, x=label_width, y=axis_y + 50, width=width - label_width - RIGHT)
    parts.append("</svg>")
    return "\n".join(parts)
