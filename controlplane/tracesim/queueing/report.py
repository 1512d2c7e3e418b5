"""A self-contained HTML report with inline SVG plots drawn here (no plotting library).

Three plots: GPU allocation over time, the queueing-delay CDF (log time axis) and each queue's
share of GPU-time against its entitlement. Several runs (a study) share each plot, one colour
per policy.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from typing import Any

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e")
W, H = 720, 300
LEFT, RIGHT, TOP, BOTTOM = 60, 20, 20, 40


def _x(value: float, low: float, high: float) -> float:
    return LEFT + (value - low) / ((high - low) or 1.0) * (W - LEFT - RIGHT)


def _y(value: float, low: float, high: float) -> float:
    return H - BOTTOM - (value - low) / ((high - low) or 1.0) * (H - TOP - BOTTOM)


def _frame(
    x_ticks: Sequence[tuple[float, str]], y_ticks: Sequence[tuple[float, str]], x_label: str, y_label: str
) -> list[str]:
    parts = [
        f'<rect x="{LEFT}" y="{TOP}" width="{W - LEFT - RIGHT}" height="{H - TOP - BOTTOM}" fill="none" stroke="#999"/>'
    ]
    for x, label in x_ticks:
        parts.append(f'<line x1="{x:.1f}" y1="{H - BOTTOM}" x2="{x:.1f}" y2="{H - BOTTOM + 4}" stroke="#999"/>')
        parts.append(f'<text x="{x:.1f}" y="{H - BOTTOM + 16}" font-size="11" text-anchor="middle">{label}</text>')
    for y, label in y_ticks:
        parts.append(f'<line x1="{LEFT - 4}" y1="{y:.1f}" x2="{W - RIGHT}" y2="{y:.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end">{label}</text>')
    parts.append(
        f'<text x="{(W + LEFT) / 2}" y="{H - 6}" font-size="12" text-anchor="middle">{html.escape(x_label)}</text>'
    )
    parts.append(
        f'<text x="14" y="{(H - BOTTOM) / 2}" font-size="12" text-anchor="middle" '
        f'transform="rotate(-90 14 {(H - BOTTOM) / 2})">{html.escape(y_label)}</text>'
    )
    return parts


def _legend(names: Sequence[str]) -> list[str]:
    parts = []
    for i, name in enumerate(names):
        x = LEFT + 10 + i * 120
        parts.append(f'<rect x="{x}" y="{TOP + 6}" width="12" height="12" fill="{COLORS[i % len(COLORS)]}"/>')
        parts.append(f'<text x="{x + 16}" y="{TOP + 16}" font-size="12">{html.escape(name)}</text>')
    return parts


def _svg(plot_id: str, title: str, parts: list[str]) -> str:
    body = "\n".join(parts)
    return (
        f"<figure><figcaption>{html.escape(title)}</figcaption>"
        f'<svg id="{plot_id}" xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
        f'viewBox="0 0 {W} {H}" font-family="sans-serif">\n{body}\n</svg></figure>'
    )


def _polyline(points: Sequence[tuple[float, float]], color: str) -> str:
    coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    return f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{coords}"/>'


def utilization_plot(runs: Sequence[tuple[str, dict[str, Any]]]) -> str:
    horizon = max((p[0] for _, s in runs for p in s["utilization"]), default=1.0)
    days = horizon / 86_400
    unit, scale = ("days", 86_400.0) if days >= 2 else ("hours", 3600.0)
    parts = _frame(
        [(_x(v * scale, 0, horizon), f"{v:g}") for v in _nice_ticks(horizon / scale)],
        [(_y(v, 0, 1), f"{v:.0%}") for v in (0, 0.25, 0.5, 0.75, 1.0)],
        f"virtual time ({unit})",
        "GPUs allocated",
    )
    for i, (_, s) in enumerate(runs):
        points = [(_x(t, 0, horizon), _y(min(u, 1.0), 0, 1)) for t, u in s["utilization"]]
        parts.append(_polyline(points, COLORS[i % len(COLORS)]))
    parts += _legend([name for name, _ in runs])
    return _svg("plot-utilization", "GPU allocation over time (share of the fleet's GPUs held)", parts)


def delay_cdf_plot(runs: Sequence[tuple[str, dict[str, Any]]]) -> str:
    # Log axis from 1 s: zero delays are drawn at the left edge.
    top = max((p[0] for _, s in runs for p in s["delay_cdf"]), default=10.0)
    high = max(1.0, math.log10(max(top, 10.0)))
    ticks = [(_x(e, 0, high), _seconds_label(10**e)) for e in range(int(high) + 1)]
    parts = _frame(ticks, [(_y(v, 0, 1), f"{v:.0%}") for v in (0, 0.25, 0.5, 0.75, 1.0)], "queueing delay", "jobs")
    for i, (_, s) in enumerate(runs):
        points = [(_x(math.log10(max(d, 1.0)), 0, high), _y(f, 0, 1)) for d, f in s["delay_cdf"]]
        parts.append(_polyline(points, COLORS[i % len(COLORS)]))
    parts += _legend([name for name, _ in runs])
    return _svg("plot-delay-cdf", "Queueing-delay CDF (time from submission to first admission)", parts)


def share_plot(runs: Sequence[tuple[str, list[dict[str, Any]]]]) -> str:
    queues = [row["queue"] for row in runs[0][1]] if runs else []
    top = max(
        [row["received_share"] for _, rows in runs for row in rows] + [r["entitlement"] for r in runs[0][1]] + [0.01]
    )
    n = max(1, len(queues))
    group = (W - LEFT - RIGHT) / n
    bar = group * 0.8 / max(1, len(runs))
    parts = _frame(
        [(LEFT + group * (k + 0.5), "") for k in range(n)],
        [(_y(v, 0, top), f"{v:.0%}") for v in _nice_ticks(top)],
        "queue",
        "share of GPU-time",
    )
    for k, queue in enumerate(queues):
        x0 = LEFT + group * k + group * 0.1
        for i, (_, rows) in enumerate(runs):
            value = rows[k]["received_share"]
            y = _y(value, 0, top)
            parts.append(
                f'<rect x="{x0 + i * bar:.1f}" y="{y:.1f}" width="{bar:.1f}" height="{H - BOTTOM - y:.1f}" '
                f'fill="{COLORS[i % len(COLORS)]}"><title>{html.escape(queue)}: {value:.2%}</title></rect>'
            )
        entitled = runs[0][1][k]["entitlement"]
        ey = _y(entitled, 0, top)
        parts.append(
            f'<line x1="{LEFT + group * k:.1f}" y1="{ey:.1f}" x2="{LEFT + group * (k + 1):.1f}" y2="{ey:.1f}" '
            f'stroke="black" stroke-width="2"><title>{html.escape(queue)} entitlement {entitled:.2%}</title></line>'
        )
        parts.append(
            f'<text x="{LEFT + group * (k + 0.5):.1f}" y="{H - BOTTOM + 14}" font-size="8" text-anchor="end" '
            f'transform="rotate(-45 {LEFT + group * (k + 0.5):.1f} {H - BOTTOM + 14})">{html.escape(queue)}</text>'
        )
    parts += _legend([name for name, _ in runs])
    return _svg(
        "plot-shares",
        "Per-queue share of GPU-time in the arrival window (bars) vs entitlement (black line)",
        parts,
    )


def _nice_ticks(high: float, count: int = 5) -> list[float]:
    if high <= 0:
        return [0.0]
    raw = high / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    return [round(k * step, 10) for k in range(int(high / step) + 1)]


def _seconds_label(seconds: float) -> str:
    for unit, size in (("d", 86_400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


_ROWS: tuple[tuple[str, Callable[[dict[str, Any]], Any]], ...] = (
    ("jobs completed", lambda s: s["jobs"]["completed"]),
    ("avg JCT (s)", lambda s: s["avg_jct_seconds"]),
    ("queueing delay p50 (s)", lambda s: s["queueing_delay_seconds"]["p50"]),
    ("queueing delay p95 (s)", lambda s: s["queueing_delay_seconds"]["p95"]),
    ("queueing delay p99 (s)", lambda s: s["queueing_delay_seconds"]["p99"]),
    ("GPU allocation", lambda s: s["gpu_allocation"]),
    ("effective utilization", lambda s: s["effective_utilization"]),
    ("Jain's fairness (share / entitlement)", lambda s: s["jain_fairness"]),
    ("Jain's fairness (share / max-min fair share)", lambda s: s["jain_fairness_demand_aware"]),
    ("longest large-gang wait (s)", lambda s: s["large_gang_longest_wait_seconds"]),
    ("evictions", lambda s: s["jobs"]["evictions"]),
    ("makespan (s)", lambda s: s["makespan_seconds"]),
    ("cycles", lambda s: s["cycles"]),
    ("wall seconds", lambda s: s["runtime"]["wall_seconds"]),
)


def render(title: str, runs: Sequence[tuple[dict[str, Any], dict[str, Any]]], notes: Sequence[str] = ()) -> str:
    """`runs`: (summary, series) per policy."""
    names = [summary["policy"] for summary, _ in runs]
    head = "".join(f"<th>{html.escape(n)}</th>" for n in names)
    rows = []
    for label, pick in _ROWS:
        cells = "".join(f"<td>{html.escape(_cell(pick(summary)))}</td>" for summary, _ in runs)
        rows.append(f"<tr><th>{html.escape(label)}</th>{cells}</tr>")
    plots = [
        utilization_plot([(s["policy"], series) for s, series in runs]),
        delay_cdf_plot([(s["policy"], series) for s, series in runs]),
        share_plot([(s["policy"], s["per_queue"]) for s, _ in runs]),
    ]
    notes_html = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:60em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}th:first-child{{text-align:left}}
figure{{margin:1.5em 0}}figcaption{{font-weight:bold;margin-bottom:.3em}}</style></head>
<body><h1>{html.escape(title)}</h1>
<table><tr><th>metric</th>{head}</tr>
{"".join(rows)}</table>
<ul>{notes_html}</ul>
{"".join(plots)}
<p>Metric definitions: docs/simulator.md.</p>
</body></html>
"""


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 10 else f"{value:,.0f}"
    return f"{value:,}" if isinstance(value, int) else str(value)
