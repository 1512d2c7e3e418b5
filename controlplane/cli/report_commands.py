"""`gpufleet report ...`: fleet reports from the REST API (a table, CSV or the raw JSON)."""

from __future__ import annotations

import csv
import sys
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import click

from controlplane.cli.client_output import console, new_table, print_json
from controlplane.cli.rest_api import Api, connection_options, decoded

GROUP_BY = ("team", "queue", "cluster", "gpu_model")
FIGURES = (
    "runs",
    "allocated_gpu_hours",
    "measured_gpu_hours",
    "used_gpu_hours",
    "idle_gpu_hours",
    "unmeasured_gpu_hours",
    "reclaimed_gpu_hours",
    "efficiency",
)
HEADINGS = ("runs", "allocated", "measured", "used", "idle", "unmeasured", "reclaimed", "efficiency")


def _cell(name: str, value: Any) -> str:
    if value is None:
        return "-"
    if name == "efficiency":
        return f"{float(value):.1%}"
    if name == "runs":
        return str(value)
    return f"{float(value):.2f}"


def _csv_value(value: Any) -> str:
    return "" if value is None else str(value)


def write_csv(report: Mapping[str, Any], by: str) -> None:
    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow([by, *FIGURES])
    for row in report.get("groups", []):
        out.writerow([row["group"], *(_csv_value(row.get(f)) for f in FIGURES)])
    total = report.get("total") or {}
    out.writerow(["total", *(_csv_value(total.get(f)) for f in FIGURES)])


def print_tables(report: Mapping[str, Any], by: str) -> None:
    out = console()
    table = new_table(f"GPU-hours by {by}, {report['start']} to {report['end']}")
    table.add_column(by, no_wrap=True)
    for heading in HEADINGS:
        table.add_column(heading, justify="right")
    rows = list(report.get("groups", []))
    for i, row in enumerate(rows):
        table.add_row(row["group"], *(_cell(f, row.get(f)) for f in FIGURES), end_section=i == len(rows) - 1)
    total = report.get("total") or {}
    table.add_row("total", *(_cell(f, total.get(f)) for f in FIGURES))
    out.print(table)
    idle = report.get("top_idle_runs") or []
    if idle:
        runs = new_table("idlest runs")
        for column in ("run", "workload", "team", "queue", "cluster", "gpu-eq", "idle", "efficiency"):
            runs.add_column(column, overflow="fold", justify="right" if column in ("gpu-eq", "idle") else "left")
        for r in idle:
            runs.add_row(
                r["run_id"],
                r["workload"],
                r["team"],
                r["queue"],
                r["cluster"],
                f"{r['gpu_eq']:g}",
                _cell("idle_gpu_hours", r["idle_gpu_hours"]),
                _cell("efficiency", r.get("efficiency")),
            )
        out.print(runs)


@click.group()
def report() -> None:
    """Reports over the fleet's history."""


@report.command()
@click.option("--from", "start", required=True, type=click.DateTime(), help="Start (inclusive), UTC.")
@click.option("--to", "end", required=True, type=click.DateTime(), help="End (exclusive), UTC; at most 92 days on.")
@click.option("--by", "by", type=click.Choice(GROUP_BY), default="team", show_default=True, help="Group rows by.")
@click.option("--top", type=click.IntRange(0, 100), default=10, show_default=True, help="Idlest runs to list.")
@click.option("--csv", "as_csv", is_flag=True, help="Print CSV (one row per group, then the total).")
@connection_options
def utilization(
    *, start: datetime, end: datetime, by: str, top: int, as_csv: bool, api: str, token: str | None, as_json: bool
) -> None:
    """Allocated, used, idle, unmeasured and reclaimed GPU-hours per group over [FROM, TO)."""
    params: dict[str, str | int | list[str]] = {
        "from": start.isoformat(),
        "to": end.isoformat(),
        "group_by": by,
        "top": top,
    }
    found = decoded(Api.from_options(api, token).request("GET", "/v1/reports/utilization", params=params))
    if as_json:
        print_json(found)
    elif as_csv:
        write_csv(found, by)
    else:
        print_tables(found, by)


def register(group: click.Group) -> None:
    group.add_command(report)
