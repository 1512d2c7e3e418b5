"""The SVG groundwork under the charts: escaping, number and time scales, ticks, legend, frame.

Everything here is pure (data in, text out) and has no dependency, so the CLI's HTML reports and
the web dashboard draw with the same code. Every text that reaches the SVG goes through `esc`:
team and queue names come from users, and an SVG inlined in a page is markup like any other.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from html import escape

# Values are clamped to this magnitude so that a range (hi - lo) can never overflow to infinity.
MAX_MAGNITUDE = 1e18
FONT = 'font-family="sans-serif"'
# A colour-blind-friendly palette (Okabe-Ito), cycled when there are more series.
PALETTE = ("#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#f0e442", "#000000")
# Time tick steps in seconds: the first one that gives at most MAX_TIME_TICKS ticks is used.
TIME_STEPS = (
    60, 300, 900, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 2 * 86400, 7 * 86400, 14 * 86400,
    30 * 86400, 91 * 86400, 365 * 86400,
)  # fmt: skip
MAX_TIME_TICKS = 7
_SUFFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def esc(text: object) -> str:
    """Text made safe for SVG/HTML character data and quoted attribute values."""
    return escape(str(text), quote=True)


def colour(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def clean(value: float | None) -> float | None:
    """A finite value clamped to +-MAX_MAGNITUDE, or None for a missing or non-finite one."""
    if value is None or not math.isfinite(value):
        return None
    return max(-MAX_MAGNITUDE, min(MAX_MAGNITUDE, float(value)))


def non_negative(value: float | None) -> float:
    """Quantities drawn as bars (hours, GPUs, money) cannot be negative: a negative or bad value is 0."""
    cleaned = clean(value)
    return 0.0 if cleaned is None or cleaned < 0 else cleaned


def fmt_number(value: float) -> str:
    """A short label: 1234567 -> '1.23M', 0.5 -> '0.5', 12 -> '12'."""
    magnitude = abs(value)
    for threshold, suffix in _SUFFIXES:
        if magnitude >= threshold:
            return f"{value / threshold:.3g}{suffix}"
    if magnitude == 0:
        return "0"
    if magnitude >= 1:
        return f"{value:.3g}" if magnitude < 1000 else f"{value:.0f}"
    return f"{value:.2g}"


def truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(1, limit - 1)] + "…"


@dataclass(frozen=True)
class Scale:
    """A linear map from a value domain [lo, hi] onto pixels [start, end] (end may be below start)."""

    lo: float
    hi: float
    start: float
    end: float

    def __call__(self, value: float) -> float:
        span = self.hi - self.lo
        if span <= 0:
            return (self.start + self.end) / 2
        return self.start + (value - self.lo) / span * (self.end - self.start)


def nice_ticks(lo: float, hi: float, target: int = 5) -> list[float]:
    """Round tick values covering [lo, hi]; the first and last are the axis domain."""
    lo, hi = min(lo, hi), max(lo, hi)
    if hi == lo:
        hi = lo + 1 if lo >= 0 else lo + abs(lo)
        if hi == lo:
            hi = lo + 1
    raw = (hi - lo) / target
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.floor(lo / step)
    last = math.ceil(hi / step)
    return [(first + i) * step for i in range(last - first + 1)]


def as_utc(moment: datetime) -> datetime:
    """Naive datetimes are taken as UTC (the API's times are all UTC)."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def time_ticks(t0: float, t1: float) -> tuple[list[float], str]:
    """Tick epochs inside [t0, t1] at a round step, and the strftime format their labels use."""
    if t1 <= t0:
        return [t0], "%Y-%m-%d %H:%M"
    span = t1 - t0
    step = next((s for s in TIME_STEPS if span / s <= MAX_TIME_TICKS), None)
    if step is None:
        step = math.ceil(span / MAX_TIME_TICKS / TIME_STEPS[-1]) * TIME_STEPS[-1]
    first = math.ceil(t0 / step) * step
    ticks = [float(t) for t in range(int(first), int(t1) + 1, int(step))]
    return ticks, ("%Y-%m-%d" if step >= 86400 else "%m-%d %H:%M")


def time_label(epoch: float, pattern: str) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime(pattern)


def open_svg(width: int, height: int, title: str, summary: str) -> list[str]:
    """The root element with its accessible name and description; no ids, so many can share a page."""
    label = f"{title}. {summary}" if summary else title
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{esc(label)}" class="gpufleet-chart">',
        f"<title>{esc(title)}</title>",
        f"<desc>{esc(summary)}</desc>",
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="{width / 2:.1f}" y="20" text-anchor="middle" {FONT} font-size="15" '
        f'font-weight="bold">{esc(title)}</text>',
    ]


def no_data(title: str, width: int, height: int) -> str:
    parts = open_svg(width, height, title, "no data")
    parts.append(
        f'<text x="{width / 2:.1f}" y="{height / 2:.1f}" text-anchor="middle" {FONT} font-size="14" '
        f'fill="#666666" class="no-data">no data</text>'
    )
    parts.append("</svg>")
    return "\n".join(parts)


def legend(entries: Sequence[tuple[str, str]], *, x: float, y: float, width: float, shape: str = "rect") -> list[str]:
    """Swatch + name per entry, wrapping into rows across `width`; entries are (name, colour)."""
    parts = ['<g class="legend">']
    cx, cy = x, y
    for name, fill in entries:
        shown = truncate(name, 28)
        item_width = 22 + 7 * len(shown) + 16
        if cx > x and cx + item_width > x + width:
            cx, cy = x, cy + 18
        if shape == "line":
            parts.append(
                f'<line x1="{cx:.1f}" y1="{cy - 4:.1f}" x2="{cx + 16:.1f}" y2="{cy - 4:.1f}" '
                f'stroke="{fill}" stroke-width="3"/>'
            )
        else:
            parts.append(f'<rect x="{cx:.1f}" y="{cy - 10:.1f}" width="12" height="12" fill="{fill}"/>')
        parts.append(
            f'<text x="{cx + 20:.1f}" y="{cy:.1f}" {FONT} font-size="12"><title>{esc(name)}</title>{esc(shown)}</text>'
        )
        cx += item_width
    parts.append("</g>")
    return parts


def legend_rows(names: Sequence[str], width: float) -> int:
    """How many rows `legend` will use, so a chart can reserve the height before drawing."""
    rows, cx = 1, 0.0
    for name in names:
        item_width = 22 + 7 * len(truncate(name, 28)) + 16
        if cx > 0 and cx + item_width > width:
            rows, cx = rows + 1, 0.0
        cx += item_width
    return rows


def y_axis(scale: Scale, ticks: Sequence[float], *, left: float, right: float, unit: str) -> list[str]:
    """Horizontal grid lines with value labels on the left, and the unit above the axis."""
    parts = ['<g class="y-axis">']
    for tick in ticks:
        y = scale(tick)
        parts.append(f'<line x1="{left:.1f}" y1="{y:.1f}" x2="{right:.1f}" y2="{y:.1f}" stroke="#dddddd"/>')
        parts.append(
            f'<text x="{left - 6:.1f}" y="{y + 4:.1f}" text-anchor="end" {FONT} font-size="11">'
            f"{esc(fmt_number(tick))}</text>"
        )
    top = min(scale.start, scale.end)
    bottom = max(scale.start, scale.end)
    parts.append(f'<line x1="{left:.1f}" y1="{top:.1f}" x2="{left:.1f}" y2="{bottom:.1f}" stroke="#333333"/>')
    parts.append(f'<text x="{left - 6:.1f}" y="{top - 10:.1f}" {FONT} font-size="11" class="unit">{esc(unit)}</text>')
    parts.append("</g>")
    return parts
