"""`gpufleet report ... --html FILE`: one self-contained HTML page of tables and inline SVG plots.

No script, no stylesheet, font or image from anywhere else: the file opens offline and can be
mailed. Every value from the API is escaped (team and queue names are user input).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from html import escape
from pathlib import Path
from typing import Any

from controlplane.cli.report_tables import LAYOUTS, cell, justify, rows_of
from controlplane.render.plots import BarSeries, Series, bar_chart, line_chart

STYLE = """
body { font-family: sans-serif; margin: 2em; color: #222; max-width: 1100px; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.85em; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
th { background: #f4f4f4; } td.left, th:first-child { text-align: left; }
figure { margin: 1em 0; } p.note { color: #555; font-size: 0.9em; }
"""

Json = Mapping[str, Any]


def _when(value: Any) -> datetime:
    return datetime.fromisoformat(str(value))


def table(report: Json, kind: str) -> str:
    layout = LAYOUTS[kind]
    head = "".join(f"<th>{escape(c.replace('_', ' '))}</th>" for c in layout.columns)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="{justify(c)}">{escape(cell(c, v))}</td>' for c, v in zip(layout.columns, row, strict=True)
        )
        + "</tr>"
        for row in rows_of(report, layout)
    )
    return f'<table class="{escape(kind)}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _figure(svg: str) -> str:
    return f"<figure>{svg}</figure>"


def _series(rows: Sequence[Json], key: str, value: str) -> list[Series]:
    """One line per distinct `key`, its points at each row's bucket start."""
    lines: dict[str, list[tuple[datetime, float | None]]] = {}
    for row in rows:
        lines.setdefault(str(row[key]), []).append((_when(row["bucket_start"]), row.get(value)))
    return [Series(name, points) for name, points in sorted(lines.items())]


def utilization_section(report: Json) -> list[str]:
    groups = report.get("groups") or []
    names = [str(g["group"]) for g in groups]
    chart = bar_chart(
        names,
        [
            BarSeries("allocated", [g["allocated_gpu_hours"] for g in groups]),
            BarSeries("used", [g["used_gpu_hours"] for g in groups]),
        ],
        title=f"Allocated vs used GPU-hours by {report.get('group_by', 'group')}",
        y_unit="GPU-hours",
    )
    return [_figure(chart), table(report, "utilization")]


def timeline_section(report: Json) -> list[str]:
    rows = report.get("rows") or []
    totals: dict[str, list[float]] = {}
    for row in rows:
        pair = totals.setdefault(str(row["bucket_start"]), [0.0, 0.0])
        pair[0] += row["allocated_gpu_hours"]
        pair[1] += row["used_gpu_hours"]
    moments = sorted(totals)
    fleet = [
        Series("allocated", [(_when(m), totals[m][0]) for m in moments]),
        Series("used", [(_when(m), totals[m][1]) for m in moments]),
    ]
    return [
        _figure(line_chart(fleet, title="Allocated vs used GPU-hours over time", y_unit="GPU-hours per bucket")),
        _figure(
            line_chart(
                _series(rows, "group", "used_gpu_hours"),
                title=f"Used GPU-hours over time by {report.get('group_by', 'group')}",
                y_unit="GPU-hours per bucket",
            )
        ),
        table(report, "timeline"),
    ]


def waiting_section(report: Json) -> list[str]:
    teams = report.get("teams") or []
    largest = max((t.get("p95_seconds") or 0 for t in teams), default=0)
    unit, divisor = ("hours", 3600.0) if largest >= 7200 else ("minutes", 60.0) if largest >= 120 else ("seconds", 1.0)

    def scaled(key: str) -> list[float | None]:
        return [None if t.get(key) is None else t[key] / divisor for t in teams]

    chart = bar_chart(
        [str(t["team"]) for t in teams],
        [BarSeries("p50", scaled("p50_seconds")), BarSeries("p95", scaled("p95_seconds"))],
        title="Wait from submission to first admission, per team",
        y_unit=unit,
    )
    note = f'<p class="note">{escape(str(report.get("note", "")))}</p>'
    return [_figure(chart), note, table(report, "waiting")]


def fairness_section(report: Json) -> list[str]:
    rows = list(report.get("rows") or [])
    key = "queue" if report.get("by") == "queue" else "team"
    lines: list[Series] = []
    for share in _series(rows, key, "share"):
        lines.append(Series(f"{share.name} share", [(t, None if v is None else v * 100) for t, v in share.points]))
    for entitled in _series(rows, key, "entitlement"):
        lines.append(
            Series(f"{entitled.name} entitlement", [(t, None if v is None else v * 100) for t, v in entitled.points])
        )
    chart = line_chart(lines, title=f"Share of allocated GPU-hours vs entitlement, by {key}", y_unit="% of fleet")
    return [_figure(chart), table(report, "fairness")]


def evictions_section(report: Json) -> list[str]:
    kinds = report.get("by_kind") or []
    chart = bar_chart(
        [str(k["kind"]) for k in kinds],
        [
            BarSeries("work lost", [k["gpu_hours_lost"] for k in kinds]),
            BarSeries("idle capacity returned", [k["gpu_hours_returned"] for k in kinds]),
        ],
        title="GPU-hours lost and returned by eviction kind",
        y_unit="GPU-hours",
    )
    return [_figure(chart), table(report, "evictions")]


def cost_section(report: Json) -> list[str]:
    groups = report.get("groups") or []
    chart = bar_chart(
        [str(g["group"]) for g in groups],
        [
            BarSeries("allocated", [g["allocated_cost"] for g in groups]),
            BarSeries("used", [g["used_cost"] for g in groups]),
        ],
        title=f"Cost allocated vs used by {report.get('group_by', 'group')}",
        y_unit="price units",
    )
    return [_figure(chart), table(report, "cost")]


SECTIONS: dict[str, tuple[str, Callable[[Json], list[str]]]] = {
    "timeline": ("Utilization over time", timeline_section),
    "utilization": ("Utilization", utilization_section),
    "waiting": ("Waiting time", waiting_section),
    "fairness": ("Fairness", fairness_section),
    "evictions": ("Preemptions and reclaims", evictions_section),
    "cost": ("Cost", cost_section),
}


def page(title: str, reports: Mapping[str, Json]) -> str:
    """The whole document: one section per report (in SECTIONS order) with its plots and tables."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{escape(title)}</h1>",
    ]
    for kind, (heading, render) in SECTIONS.items():
        report = reports.get(kind)
        if report is None:
            continue
        parts.append(f'<section id="{escape(kind)}"><h2>{escape(heading)}</h2>')
        parts.extend(render(report))
        parts.append("</section>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_page(path: Path, title: str, reports: Mapping[str, Json]) -> None:
    path.write_text(page(title, reports), encoding="utf-8")
