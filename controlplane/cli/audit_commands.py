"""`gpufleet audit`: the fleet against the GPU-fleet checklist, as a table, JSON or YAML; a CI gate
with `--fail-on`."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import click

from controlplane.cli.client_output import console, new_table
from controlplane.cli.output_options import connection_options, print_data
from controlplane.cli.rest_api import Api, decoded

SEVERITIES = ("info", "warning", "high", "critical")
# The exit status when a finding is at or above --fail-on (1 is click's own usage or API errors).
FAIL_STATUS = 2
STYLE = {"info": "dim", "warning": "yellow", "high": "red", "critical": "bold red"}


def failing(findings: list[Mapping[str, Any]], fail_on: str | None) -> int:
    """How many findings are at or above `fail_on` (none when it is not given)."""
    if fail_on is None:
        return 0
    least = SEVERITIES.index(fail_on)
    return sum(1 for f in findings if SEVERITIES.index(str(f.get("severity"))) >= least)


def print_findings(report: Mapping[str, Any]) -> None:
    out = console()
    findings = list(report.get("findings") or [])
    counts = report.get("counts") or {}
    summary = ", ".join(f"{counts.get(s, 0)} {s}" for s in reversed(SEVERITIES))
    table = new_table(f"audit at {report.get('generated_at')}: {summary}")
    for column in ("severity", "rule", "objects", "evidence", "fix"):
        table.add_column(column, overflow="fold", no_wrap=column in ("severity",))
    for f in findings:
        severity = str(f.get("severity"))
        objects = ", ".join(f"{o['kind']} {o['name']}" for o in f.get("objects") or []) or "fleet"
        table.add_row(
            f"[{STYLE.get(severity, '')}]{severity}[/]",
            str(f.get("rule")),
            objects,
            str(f.get("evidence_text")),
            str(f.get("fix_text")),
        )
    if findings:
        out.print(table)
    else:
        out.print(f"audit at {report.get('generated_at')}: no findings")


@click.command()
@click.option(
    "--fail-on",
    type=click.Choice(SEVERITIES),
    default=None,
    help=f"Exit with status {FAIL_STATUS} when a finding is at least this severe (default: never fail).",
)
@click.option("--rule", "rules", multiple=True, help="Only this rule id (repeat for several).")
@click.option("--min-severity", type=click.Choice(SEVERITIES), default=None, help="Only findings this severe or more.")
@connection_options
def audit(
    *, fail_on: str | None, rules: tuple[str, ...], min_severity: str | None, api: str, token: str | None, output: str
) -> None:
    """Check the fleet against the GPU-fleet checklist: one finding per broken rule."""
    params: dict[str, str | int | list[str]] = {}
    if rules:
        params["rule"] = list(rules)
    if min_severity:
        params["min_severity"] = min_severity
    found = decoded(Api.from_options(api, token).request("GET", "/v1/audit", params=params))
    if output == "table":
        print_findings(found)
    else:
        print_data(found, output)
    bad = failing(list(found.get("findings") or []), fail_on)
    if bad:
        click.echo(f"{bad} finding(s) at or above {fail_on}", err=True)
        sys.exit(FAIL_STATUS)


def register(group: click.Group) -> None:
    group.add_command(audit)
