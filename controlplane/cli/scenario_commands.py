"""`gpufleet dev scenario run FILE.yaml`: a scenario through the real core on a virtual clock."""

from __future__ import annotations

import json
from pathlib import Path

import click
import yaml
from rich import box
from rich.console import Console
from rich.table import Table

from controlplane.scenario.expect import check_expectations
from controlplane.scenario.format import ScenarioDoc
from controlplane.scenario.result import ScenarioResult, WorkloadResult
from controlplane.scenario.runner import ScenarioFailure, run_scenario
from controlplane.scenario.validate import ScenarioInvalid, parse_scenario

NONE = "-"
TABLE_WIDTH = 140


def load(path: Path) -> ScenarioDoc:
    """The validated document in `path`; a ClickException naming every problem otherwise."""
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise click.ClickException(f"{path}: not valid YAML: {exc}") from exc
    except OSError as exc:
        raise click.ClickException(f"{path}: {exc.strerror}") from exc
    try:
        return parse_scenario(data)
    except ScenarioInvalid as exc:
        lines = "\n".join(f"  {where}: {message}" for where, message in exc.problems)
        raise click.ClickException(f"{path} is not a valid scenario:\n{lines}") from exc


def _at(value: float | None) -> str:
    return NONE if value is None else f"{value:g}"


def _row(w: WorkloadResult) -> list[str]:
    last = w.last_run
    preempted = NONE
    if w.preemptions:
        first = w.preemptions[0]
        preempted = f"{_at(first.at)} by {first.by} ({first.kind})"
        if len(w.preemptions) > 1:
            preempted += f" +{len(w.preemptions) - 1}"
    reason = w.pending_reasons[-1].reason if w.pending_reasons else NONE
    if w.state in ("rejected", "cancelled") and w.reason:
        reason = w.reason
    return [
        w.name,
        w.queue,
        w.state,
        _at(w.admitted_at),
        f"{last.cluster}/{'+'.join(last.pools)}" if last else NONE,
        str(len(last.nodes)) if last else NONE,
        preempted,
        _at(w.finished_at),
        reason,
    ]


def _table(result: ScenarioResult) -> Table:
    table = Table(box=box.SIMPLE, title=f"ended at {result.ended_at:g}s after {result.cycles} cycles")
    for column in ("workload", "queue", "state", "admitted", "cluster/pool", "nodes", "preempted", "finished"):
        table.add_column(column, no_wrap=True)
    table.add_column("last wait reason", overflow="fold", min_width=30)
    for workload in result.workloads:
        table.add_row(*_row(workload))
    return table


@click.group()
def scenario() -> None:
    """Scenarios: a fleet, queues and workloads over time, run through the real scheduling core."""


@scenario.command("run")
@click.argument("file", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="print the result as JSON")
@click.option("--check", is_flag=True, help="exit 1 unless every expectation of the file's expect: section holds")
def run(file: Path, as_json: bool, check: bool) -> None:
    """Run FILE.yaml (format: docs/scenarios.md) and print what happened to every workload."""
    doc = load(file)
    try:
        result = run_scenario(doc)
    except ScenarioFailure as exc:
        raise click.ClickException(f"{file}: {exc}") from exc
    failures = check_expectations(doc.expect, result) if doc.expect is not None else []
    if as_json:
        payload = result.to_dict()
        if doc.expect is not None:
            payload["expectations"] = {"passed": not failures, "failures": failures}
        click.echo(json.dumps(payload, indent=2))
    else:
        # Piped output defaults to 80 columns, too narrow for a row per workload: never go below 140.
        console = Console(width=max(Console().width, TABLE_WIDTH))
        console.print(_table(result))
        if doc.expect is not None:
            console.print("expectations: " + ("all hold" if not failures else f"{len(failures)} missed"))
            for failure in failures:
                console.print(f"  {failure}", markup=False)
    if check and failures:
        raise SystemExit(1)


def register(group: click.Group) -> None:
    group.add_command(scenario)
