"""The rows of each fleet report as the API sends them, flattened once for the table, CSV and HTML.

A `Layout` names a report's columns and which lists of its JSON hold rows (detail rows first, then
the roll-ups such as per-team and total rows), so the three outputs cannot disagree.
"""

from __future__ import annotations

import csv
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from controlplane.cli.client_output import console, new_table


@dataclass(frozen=True)
class Layout:
    title: str
    columns: tuple[str, ...]
    lists: tuple[str, ...]  # keys of lists of rows, in order
    singles: tuple[str, ...] = ()  # keys of one row each (a total)


UTILIZATION_FIGURES = (
    "allocated_gpu_hours",
    "measured_gpu_hours",
    "used_gpu_hours",
    "idle_gpu_hours",
    "unmeasured_gpu_hours",
    "reclaimed_gpu_hours",
    "efficiency",
)

LAYOUTS: dict[str, Layout] = {
    "utilization": Layout("Utilization (GPU-hours)", ("group", "runs", *UTILIZATION_FIGURES), ("groups",), ("total",)),
    "waiting": Layout(
        "Waiting time from submission to first admission (seconds)",
        (
            "team",
            "queue",
            "size",
            "workloads",
            "admitted",
            "still_pending",
            "left_unadmitted",
            "p50_seconds",
            "p95_seconds",
            "max_seconds",
            "mean_seconds",
        ),
        ("rows", "teams"),
        ("total",),
    ),
    "fairness": Layout(
        "Share of the fleet's allocated GPU-hours vs entitlement",
        (
            "bucket_start",
            "bucket_end",
            "team",
            "queue",
            "allocated_gpu_hours",
            "share",
            "entitlement",
            "share_over_entitlement",
        ),
        ("rows",),
    ),
    "evictions": Layout(
        "Evictions: GPU-hours of work lost and of idle capacity returned",
        ("kind", "victim_team", "beneficiary_team", "evictions", "gpu_hours_lost", "gpu_hours_returned"),
        ("rows", "by_kind"),
        ("total",),
    ),
    "cost": Layout(
        "Cost: GPU-hours x pool price",
        (
            "group",
            "allocated_gpu_hours",
            "used_gpu_hours",
            "allocated_cost",
            "measured_cost",
            "used_cost",
            "cost_at_stake",
            "unmeasured_cost",
        ),
        ("groups",),
        ("total",),
    ),
    "timeline": Layout(
        "Utilization over time (GPU-hours)",
        ("bucket_start", "bucket_end", "group", *UTILIZATION_FIGURES),
        ("rows",),
    ),
}


def rows_of(report: Mapping[str, Any], layout: Layout) -> list[list[Any]]:
    out: list[list[Any]] = []
    for key in layout.lists:
        out.extend([row.get(c) for c in layout.columns] for row in report.get(key) or [])
    for key in layout.singles:
        single = report.get(key)
        if single:
            # A total row may lack the label column (the utilization report's total has no group).
            row = [single.get(c) for c in layout.columns]
            out.append([key if row[0] is None else row[0], *row[1:]])
    return out


# Columns of labels (left-aligned); every other column is a figure (right-aligned).
LABEL_COLUMNS = frozenset(
    ("group", "team", "queue", "size", "kind", "victim_team", "beneficiary_team", "bucket_start", "bucket_end")
)
# Figures that are parts of a whole, shown in per cent.
PERCENT_COLUMNS = frozenset(("efficiency", "share", "entitlement"))


def cell(column: str, value: Any) -> str:
    """One figure as every report table shows it: counts with thousands separators, GPU-hours,
    seconds and costs with two decimals, parts of a whole in per cent."""
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if column in PERCENT_COLUMNS:
        return f"{float(value):.1%}"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.2f}"


def justify(column: str) -> Literal["left", "right"]:
    return "left" if column in LABEL_COLUMNS else "right"


def write_csv(report: Mapping[str, Any], layout: Layout) -> None:
    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow(layout.columns)
    for row in rows_of(report, layout):
        out.writerow(["" if v is None else v for v in row])


def print_table(report: Mapping[str, Any], layout: Layout, note: Sequence[str] = ()) -> None:
    table = new_table(f"{layout.title}, {report.get('start')} to {report.get('end')}")
    for column in layout.columns:
        table.add_column(column.replace("_", " "), overflow="fold", justify=justify(column))
    for row in rows_of(report, layout):
        table.add_row(*(cell(column, v) for column, v in zip(layout.columns, row, strict=True)))
    out = console()
    out.print(table)
    for line in note:
        out.print(line)
