"""`gpufleet report ...`: fleet reports from the REST API (a table, CSV, the raw JSON or YAML, or an
HTML page with plots). `-o csv` and `--csv` are the same, as are `-o json` and `--json`."""

from __future__ import annotations

import csv
import functools
import math
import sys
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click

from controlplane.cli.client_output import console, new_table
from controlplane.cli.output_options import api_options, output_options, print_data
from controlplane.cli.report_html import write_page
from controlplane.cli.report_tables import LAYOUTS, cell, print_table
from controlplane.cli.report_tables import write_csv as write_layout_csv
from controlplane.cli.rest_api import Api, decoded

GROUP_BY = ("team", "queue", "cluster", "gpu_model")
# A duration longer than any report range (92 days) is a typo, and `float` would take "inf".
MAX_DURATION_DAYS = 3660
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
        table.add_row(row["group"], *(cell(f, row.get(f)) for f in FIGURES), end_section=i == len(rows) - 1)
    total = report.get("total") or {}
    table.add_row("total", *(cell(f, total.get(f)) for f in FIGURES))
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
                cell("gpu_eq", r["gpu_eq"]),
                cell("idle_gpu_hours", r["idle_gpu_hours"]),
                cell("efficiency", r.get("efficiency")),
            )
        out.print(runs)


@click.group()
def report() -> None:
    """Reports over the fleet's history."""


def _range(func: Any) -> Any:
    """--from/--to, or --last: the command gets `start` and `end` either way."""

    @functools.wraps(func)
    def with_range(*args: Any, start: datetime | None, end: datetime | None, last: str | None, **kwargs: Any) -> Any:
        start, end = report_range(start, end, last, datetime.now(UTC))
        return func(*args, start=start, end=end, **kwargs)

    command = click.option(
        "--last",
        default=None,
        metavar="DURATION",
        help="The range that ends now: 1h, 24h, 7d, 30d (or 90m, 12h, 2d); instead of --from/--to.",
    )(with_range)
    command = click.option(
        "--to", "end", default=None, type=click.DateTime(), help="End (exclusive), UTC; at most 92 days on."
    )(command)
    return click.option("--from", "start", default=None, type=click.DateTime(), help="Start (inclusive), UTC.")(command)


def report_range(
    start: datetime | None, end: datetime | None, last: str | None, now: datetime
) -> tuple[datetime, datetime]:
    """[start, end) from --from/--to, or the `last` duration up to `now` (to the second)."""
    if last is not None:
        if start is not None or end is not None:
            raise click.UsageError("give --last, or --from and --to, not both")
        seconds = parse_duration(last)
        if seconds <= 0:
            raise click.BadParameter(f"{last!r} is not a duration such as 1h, 24h, 7d or 30d", param_hint="--last")
        end = now.replace(microsecond=0)
        return end - timedelta(seconds=seconds), end
    if start is None or end is None:
        raise click.UsageError("give --from and --to, or --last (for example --last 7d)")
    return start, end


def _outputs(func: Any) -> Any:
    """-o table|json|yaml|csv (with --json and --csv, the older spellings) and --html; the command
    gets `output` and `html`."""

    @functools.wraps(func)
    def with_csv(*args: Any, output: str, as_csv: bool, **kwargs: Any) -> Any:
        if as_csv and output not in ("table", "csv"):
            raise click.UsageError(f"--csv means -o csv; it cannot go with -o {output}")
        return func(*args, output="csv" if as_csv else output, **kwargs)

    command = click.option("--csv", "as_csv", is_flag=True, help="The same as -o csv (the older spelling).")(with_csv)
    command = output_options(extra=("csv",))(command)
    return click.option(
        "--html",
        "html",
        type=click.Path(dir_okay=False, writable=True, path_type=Path),
        help="Write a self-contained HTML page with tables and plots to this file.",
    )(command)


def parse_duration(value: str) -> int:
    """`3600`, `90m`, `6h` or `1d` as seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    text = value.strip().lower()
    factor = units.get(text[-1:], 0)
    number = text[:-1] if factor else text
    try:
        amount = float(number)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a duration such as 3600, 30m, 6h or 1d") from None
    if not math.isfinite(amount) or abs(amount) > MAX_DURATION_DAYS * 86400:
        raise click.BadParameter(f"{value!r} is longer than {MAX_DURATION_DAYS} days")
    return int(amount * (factor or 1))


def parse_bucket(value: str | None) -> int | None:
    """A bucket length as seconds; None when not given (the API then picks one)."""
    return None if value is None else parse_duration(value)


BUCKET = click.option(
    "--bucket", default=None, help="Bucket length: seconds, or 30m, 6h, 1d (default: chosen by the API)."
)


def _params(start: datetime, end: datetime, **extra: Any) -> dict[str, str | int | list[str]]:
    params: dict[str, str | int | list[str]] = {"from": start.isoformat(), "to": end.isoformat()}
    params.update({k: v for k, v in extra.items() if v is not None})
    return params


def _get(api: str, token: str | None, kind: str, params: dict[str, str | int | list[str]]) -> Any:
    return decoded(Api.from_options(api, token).request("GET", f"/v1/reports/{kind}", params=params))


def _show(kind: str, found: Any, *, output: str, html: Path | None) -> None:
    if html is not None:
        write_page(html, f"gpufleet {kind} report, {found.get('start')} to {found.get('end')}", {kind: found})
        console().print(f"wrote {html}")
    elif output in ("json", "yaml"):
        print_data(found, output)
    elif output == "csv":
        write_layout_csv(found, LAYOUTS[kind])
    else:
        note = [str(found["note"])] if found.get("note") else []
        print_table(found, LAYOUTS[kind], note)


@report.command()
@_range
@click.option("--by", "by", type=click.Choice(GROUP_BY), default="team", show_default=True, help="Group rows by.")
@click.option("--top", type=click.IntRange(0, 100), default=10, show_default=True, help="Idlest runs to list.")
@_outputs
@api_options
def utilization(
    *,
    start: datetime,
    end: datetime,
    by: str,
    top: int,
    html: Path | None,
    api: str,
    token: str | None,
    output: str,
) -> None:
    """Allocated, used, idle, unmeasured and reclaimed GPU-hours per group over [FROM, TO)."""
    params: dict[str, str | int | list[str]] = {
        "from": start.isoformat(),
        "to": end.isoformat(),
        "group_by": by,
        "top": top,
    }
    found = decoded(Api.from_options(api, token).request("GET", "/v1/reports/utilization", params=params))
    if html is not None or output in ("json", "yaml"):
        _show("utilization", found, output=output, html=html)
    elif output == "csv":
        write_csv(found, by)
    else:
        print_tables(found, by)


@report.command()
@_range
@_outputs
@api_options
def waiting(*, start: datetime, end: datetime, html: Path | None, api: str, token: str | None, output: str) -> None:
    """p50/p95/max wait to first admission per team, queue and gang size (gpu-eq), for workloads
    submitted in [FROM, TO); ones never admitted count with their wait so far."""
    found = _get(api, token, "waiting", _params(start, end))
    _show("waiting", found, output=output, html=html)


@report.command()
@_range
@click.option("--by", type=click.Choice(("queue", "team")), default="queue", show_default=True, help="Rows per.")
@BUCKET
@_outputs
@api_options
def fairness(
    *,
    start: datetime,
    end: datetime,
    by: str,
    bucket: str | None,
    html: Path | None,
    api: str,
    token: str | None,
    output: str,
) -> None:
    """Per time bucket, each queue's (or team's) share of the fleet's allocated GPU-hours vs its
    entitlement (guarantee plus weight share of the rest)."""
    found = _get(api, token, "fairness", _params(start, end, by=by, bucket=parse_bucket(bucket)))
    _show("fairness", found, output=output, html=html)


@report.command()
@_range
@_outputs
@api_options
def evictions(*, start: datetime, end: datetime, html: Path | None, api: str, token: str | None, output: str) -> None:
    """Preemptions and reclaims in [FROM, TO) by kind, victim and beneficiary team: GPU-hours of
    work lost and of idle capacity returned."""
    found = _get(api, token, "evictions", _params(start, end))
    _show("evictions", found, output=output, html=html)


@report.command()
@_range
@click.option("--by", "by", type=click.Choice(GROUP_BY), default="team", show_default=True, help="Group rows by.")
@_outputs
@api_options
def cost(
    *,
    start: datetime,
    end: datetime,
    by: str,
    html: Path | None,
    api: str,
    token: str | None,
    output: str,
) -> None:
    """GPU-hours x pool price: allocated vs used, and the money at stake (allocated - used)."""
    found = _get(api, token, "cost", _params(start, end, group_by=by))
    _show("cost", found, output=output, html=html)


@report.command()
@_range
@click.option("--by", "by", type=click.Choice(GROUP_BY), default="team", show_default=True, help="Group rows by.")
@BUCKET
@_outputs
@api_options
def timeline(
    *,
    start: datetime,
    end: datetime,
    by: str,
    bucket: str | None,
    html: Path | None,
    api: str,
    token: str | None,
    output: str,
) -> None:
    """The utilization figures per time bucket (allocated, used, idle ... GPU-hours)."""
    found = _get(api, token, "timeline", _params(start, end, group_by=by, bucket=parse_bucket(bucket)))
    _show("timeline", found, output=output, html=html)


@report.command(name="all")
@_range
@BUCKET
@click.option(
    "--html",
    "html",
    required=True,
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    help="The HTML file to write.",
)
@api_options
@output_options()
def all_reports(
    *, start: datetime, end: datetime, bucket: str | None, html: Path, api: str, token: str | None, output: str
) -> None:
    """Every fleet report over [FROM, TO) in one self-contained HTML page with plots."""
    seconds = parse_bucket(bucket)
    reports = {
        "timeline": _get(api, token, "timeline", _params(start, end, group_by="team", bucket=seconds)),
        "utilization": _get(api, token, "utilization", _params(start, end, group_by="team")),
        "waiting": _get(api, token, "waiting", _params(start, end)),
        "fairness": _get(api, token, "fairness", _params(start, end, by="team", bucket=seconds)),
        "evictions": _get(api, token, "evictions", _params(start, end)),
        "cost": _get(api, token, "cost", _params(start, end, group_by="team")),
    }
    write_page(html, f"gpufleet fleet reports, {start.isoformat()} to {end.isoformat()} UTC", reports)
    if output == "table":
        console().print(f"wrote {html}")
    else:
        print_data(reports, output)


def register(group: click.Group) -> None:
    group.add_command(report)
