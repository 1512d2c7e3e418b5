"""The dashboard's charts: its read models turned into the plots of `controlplane.render.plots`
(which draws and escapes them). The SVG is marked safe here, the one place the pages trust markup."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup

from controlplane.render.plots import QuotaRow, Series, line_chart, quota_bars
from controlplane.service.dashboard import QueueLine
from controlplane.service.dashboard_feed import UtilizationSeries


@dataclass(frozen=True)
class Chart:
    title: str
    svg: Markup


def quota_charts(lines: Sequence[QueueLine]) -> list[Chart]:
    """One chart per resource (gpu-eq first, then GPU models): a bar per team and per queue."""
    keys: list[str] = []
    for line in lines:
        keys += [bar.key for bar in line.bars if bar.key not in keys]
    charts = []
    for key in keys:
        rows = [
            QuotaRow(
                {"cohort": f"cohort {line.name}", "team": line.name}.get(line.level, f"· {line.name}"),
                bar.guaranteed,
                bar.used,
                bar.borrowed,
                bar.limit,
            )
            for line in lines
            for bar in line.bars
            if bar.key == key
        ]
        title = f"Quota and use ({key})"
        charts.append(Chart(title, Markup(quota_bars(rows, title=title, unit=key))))  # noqa: S704
    return charts


def utilization_charts(series: UtilizationSeries) -> list[Chart]:
    """Per team, allocated and used GPU-hours in each bucket."""
    charts = []
    hours = series.bucket.total_seconds() / 3600
    per = f"{hours:g} h" if hours >= 1 else f"{hours * 60:g} min"
    for team in series.teams:
        title = f"Team {team.team}: allocated vs used GPU-hours per {per}"
        svg = line_chart(
            [
                Series("allocated", list(zip(series.starts, team.allocated, strict=True))),
                Series("used", list(zip(series.starts, team.used, strict=True))),
            ],
            title=title,
            y_unit="GPU-hours",
        )
        charts.append(Chart(title, Markup(svg)))  # noqa: S704
    return charts
