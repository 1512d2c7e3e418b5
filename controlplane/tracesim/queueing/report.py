"""A self-contained HTML report with inline SVG plots drawn here (no plotting library).

Four plots: GPU allocation over time, the queueing-delay and JCT CDFs (log time axis) and each
queue's share of GPU-time against its entitlement. Several runs (a study) share each plot, one
colour per policy. A study over loads and seeds (`render_study`) leads with one table of means
and 95 % intervals per load and policy, then the plots of each load's first seed.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from typing import Any

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf")
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
        x = LEFT + 10 + i * 95
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


def utilization_plot(runs: Sequence[tuple[str, dict[str, Any]]], plot_id: str = "plot-utilization") -> str:
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
    return _svg(plot_id, "GPU allocation over time (share of the fleet's GPUs held)", parts)


def delay_cdf_plot(runs: Sequence[tuple[str, dict[str, Any]]], plot_id: str = "plot-delay-cdf") -> str:
    return cdf_plot(
        runs,
        "delay_cdf",
        plot_id,
        "Queueing-delay CDF (time from submission to first admission)",
        "queueing delay",
    )


def jct_cdf_plot(runs: Sequence[tuple[str, dict[str, Any]]], plot_id: str = "plot-jct-cdf") -> str:
    return cdf_plot(runs, "jct_cdf", plot_id, "Job completion time CDF (submission to completion)", "JCT")


def cdf_plot(runs: Sequence[tuple[str, dict[str, Any]]], key: str, plot_id: str, title: str, x_label: str) -> str:
    # Log axis from 1 s: zero values are drawn at the left edge.
    top = max((p[0] for _, s in runs for p in s.get(key, ())), default=10.0)
    high = max(1.0, math.log10(max(top, 10.0)))
    ticks = [(_x(e, 0, high), _seconds_label(10**e)) for e in range(int(high) + 1)]
    parts = _frame(ticks, [(_y(v, 0, 1), f"{v:.0%}") for v in (0, 0.25, 0.5, 0.75, 1.0)], x_label, "jobs")
    for i, (_, s) in enumerate(runs):
        points = [(_x(math.log10(max(d, 1.0)), 0, high), _y(f, 0, 1)) for d, f in s.get(key, ())]
        parts.append(_polyline(points, COLORS[i % len(COLORS)]))
    parts += _legend([name for name, _ in runs])
    return _svg(plot_id, title, parts)


def share_plot(runs: Sequence[tuple[str, list[dict[str, Any]]]], plot_id: str = "plot-shares") -> str:
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
        plot_id,
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
    ("effective utilization (arrival window)", lambda s: s["effective_utilization_window"]),
    ("GPU-hours returned by idle reclaim", lambda s: s["idle_reclaimed_gpu_hours"]),
    ("work lost to preemption (GPU-s)", lambda s: s["preemption_lost_gpu_seconds"]),
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
        jct_cdf_plot([(s["policy"], series) for s, series in runs]),
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


# The study table: (column title, record field); each cell is the mean over seeds ± its 95 % half-width.
STUDY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("avg JCT (s)", "avg_jct_seconds"),
    ("JCT p50 (s)", "jct_p50_seconds"),
    ("JCT p95 (s)", "jct_p95_seconds"),
    ("JCT p99 (s)", "jct_p99_seconds"),
    ("delay mean (s)", "avg_queueing_delay_seconds"),
    ("delay p50 (s)", "queueing_delay_p50_seconds"),
    ("delay p95 (s)", "queueing_delay_p95_seconds"),
    ("delay p99 (s)", "queueing_delay_p99_seconds"),
    ("longest >=8-GPU wait (s)", "large_gang_longest_wait_seconds"),
    ("allocation", "gpu_allocation"),
    ("effective util.", "effective_utilization"),
    ("effective util. (arrival window)", "effective_utilization_window"),
    ("idle reclaimed (GPU-h)", "idle_reclaimed_gpu_hours"),
    ("lost to preemption (GPU-s)", "preemption_lost_gpu_seconds"),
    ("Jain, demand-aware", "jain_fairness_demand_aware"),
)


def ci_cell(record: dict[str, Any], field: str) -> str:
    mean, half = record.get(field), record.get(f"{field}_ci95")
    if mean is None:
        return "-"
    value = float(mean)
    if half is None:
        return _cell(value)
    # The interval in the mean's own format, so the pair reads as one figure.
    if abs(value) < 10:
        return f"{value:.4f} ± {float(half):.4f}"
    return f"{value:,.0f} ± {float(half):,.0f}"


def render_study(
    title: str,
    records: Sequence[dict[str, Any]],
    plots_by_load: Sequence[tuple[str, Sequence[tuple[dict[str, Any], dict[str, Any]]]]],
    notes: Sequence[str] = (),
) -> str:
    """`records`: one per load and policy (aggregate.py); `plots_by_load`: (load label, the first
    seed's (summary, series) per policy)."""
    head = "".join(f"<th>{html.escape(label)}</th>" for label, _ in STUDY_COLUMNS)
    rows = []
    for record in records:
        cells = "".join(f"<td>{html.escape(ci_cell(record, field))}</td>" for _, field in STUDY_COLUMNS)
        name = f"{record['load']} / {record['policy']}"
        rows.append(f"<tr><th>{html.escape(name)}</th>{cells}</tr>")
    sections = []
    for k, (label, runs) in enumerate(plots_by_load):
        named = [(s["policy"], series) for s, series in runs]
        sections.append(f"<h2>Load {html.escape(label)} (seed {runs[0][0]['seed'] if runs else '-'})</h2>")
        sections.append(utilization_plot(named, f"plot-utilization-{k}"))
        sections.append(delay_cdf_plot(named, f"plot-delay-cdf-{k}"))
        sections.append(jct_cdf_plot(named, f"plot-jct-cdf-{k}"))
        sections.append(share_plot([(s["policy"], s["per_queue"]) for s, _ in runs], f"plot-shares-{k}"))
    notes_html = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #ccc;padding:3px 6px;text-align:right}}th:first-child{{text-align:left}}
figure{{margin:1.5em 0}}figcaption{{font-weight:bold;margin-bottom:.3em}}</style></head>
<body><h1>{html.escape(title)}</h1>
<p>Mean over seeds ± half-width of the 95 % confidence interval (Student's t).</p>
<table><tr><th>load / policy</th>{head}</tr>
{"".join(rows)}</table>
<ul>{notes_html}</ul>
{"".join(sections)}
<p>Metric definitions: docs/simulator.md.</p>
</body></html>
"""
