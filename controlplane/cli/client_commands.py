"""Commands that talk to a running gpufleet through its REST API.

They speak only HTTP, so they work the same against `gpufleet up` on a laptop and against
a deployed API; nothing here touches the database or NATS. How they reach the API is
`rest_api.py`'s, how they print `client_output.py`'s, and the options that choose both
`output_options.py`'s. The workload verbs live in the `gpufleet workload` group; `status` stays top
level.
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any
from urllib.parse import quote

import click
from rich.console import Group
from rich.table import Table

from controlplane.cli.client_output import (
    console,
    control_plane_line,
    gpus_table,
    placement_table,
    queue_status_table,
    runs_table,
    watch_line,
    workload_panel,
    workloads_table,
)
from controlplane.cli.object_commands import read_spec
from controlplane.cli.output_options import connection_options, emit, emit_line, print_data
from controlplane.cli.rest_api import Api, Json, decoded
from controlplane.domain.model import WorkloadState


def load_workload(source: IO[str], queue: str | None) -> dict[str, Any]:
    """The YAML body of POST /v1/workloads; the server validates it, the CLI only checks its shape."""
    body = read_spec(source, "a mapping (name, queue, pod_sets, ...)")
    if queue is not None:
        body["queue"] = queue
    return body


@click.command()
@click.argument("file", type=click.File("r"))
@click.option("--queue", default=None, help="Submit to this queue instead of the file's `queue`.")
@click.option("--idempotency-key", default=None, help="Sent as Idempotency-Key: a retry returns the first workload.")
@connection_options
def submit(
    *, file: IO[str], queue: str | None, idempotency_key: str | None, api: str, token: str | None, output: str
) -> None:
    """Submit the workload described in FILE (YAML; `-` reads stdin)."""
    body = load_workload(file, queue)
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    response = Api.from_options(api, token).request("POST", "/v1/workloads", body=body, headers=headers)
    workload = decoded(response)
    if output != "table":
        print_data(workload, output)
        return
    # 200 instead of 201 means the key matched an earlier submission: say so, or users think a second copy runs.
    verb = "already submitted" if response.status_code == 200 else "submitted"
    position = workload.get("queue_position")
    where = f", position {position} in queue {workload['queue']}" if position is not None else ""
    click.echo(f"{verb} {workload['id']}: {workload['state']}{where}")


@click.command(name="list")
@click.option("--queue", default=None, help="Only workloads of this queue.")
@click.option("--team", default=None, help="Only workloads of this team (a team's token sees only its own).")
@click.option("--name", default=None, help="Only workloads of this name.")
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice([s.value for s in WorkloadState]),
    help="Only workloads in this state (repeatable).",
)
@click.option("--limit", type=click.IntRange(1, 1000), default=None, help="At most this many (server default 100).")
@click.option("--cursor", default=None, help="Go on after an earlier page (the `--cursor` it printed).")
@connection_options
def list_workloads(
    *,
    queue: str | None,
    team: str | None,
    name: str | None,
    states: tuple[str, ...],
    limit: int | None,
    cursor: str | None,
    api: str,
    token: str | None,
    output: str,
) -> None:
    """List workloads, newest first as the API orders them (one page: at most --limit and 1 MiB)."""
    params: dict[str, str | int | list[str]] = {}
    # Only filters the user gave are sent, so the server's defaults stay the single source of truth.
    if queue is not None:
        params["queue"] = queue
    if team is not None:
        params["team"] = team
    if name is not None:
        params["name"] = name
    if states:
        params["state"] = list(states)
    if limit is not None:
        params["limit"] = limit
    if cursor is not None:
        params["cursor"] = cursor
    page = decoded(Api.from_options(api, token).request("GET", "/v1/workloads", params=params))
    if output != "table":
        print_data(page, output)
        return
    workloads = page["items"]
    if not workloads:
        click.echo("no workloads match")
    else:
        console().print(workloads_table(workloads))
    if page.get("next"):
        # The same filters again, and the cursor: the command that shows the next page.
        click.echo(f"more: add --cursor {page['next']} for the next page")


def workload_path(workload_id: str, suffix: str = "") -> str:
    # Quoted so an id such as `../clusters` cannot address another route.
    return f"/v1/workloads/{quote(workload_id, safe='')}{suffix}"


@click.command()
@click.argument("workload_id", metavar="ID")
@connection_options
def show(workload_id: str, api: str, token: str | None, output: str) -> None:
    """Show one workload: state, reason, queue position, placement and runs."""
    workload = decoded(Api.from_options(api, token).request("GET", workload_path(workload_id)))
    if output != "table":
        print_data(workload, output)
        return
    out = console()
    out.print(workload_panel(workload))
    runs = workload.get("runs") or []
    if not runs:
        out.print("no runs yet")
        return
    attempts = workload.get("attempts", len(runs))
    out.print(runs_table(runs, attempts))
    for run in runs:
        if run.get("placement"):
            out.print(placement_table(run))


@click.command()
@click.argument("workload_id", metavar="ID")
@click.option("--reason", default=None, help="Why; recorded on the workload (server default: cancelled by user).")
@connection_options
def cancel(workload_id: str, reason: str | None, api: str, token: str | None, output: str) -> None:
    """Cancel a workload that has not finished."""
    client = Api.from_options(api, token)
    # Cancelling is idempotent on the server; asking first lets a second cancel say so.
    workload = decoded(client.request("GET", workload_path(workload_id)))
    already = workload.get("state") == "cancelled"
    if not already:
        body = {"reason": reason} if reason is not None else None
        workload = decoded(client.request("POST", workload_path(workload_id, "/cancel"), body=body))
    if output != "table":
        print_data(workload, output)
        return
    state = f"already {workload['state']}" if already else workload["state"]
    click.echo(f"{workload['id']}: {state}" + (f" ({workload['reason']})" if workload.get("reason") else ""))


@click.command()
@connection_options
def status(api: str, token: str | None, output: str) -> None:
    """The fleet at a glance: GPUs allocated of capacity per model, each team and queue with its
    pending gangs and use against guarantee and limit, and (for admins) the scheduler and outbox."""
    emit(decoded(Api.from_options(api, token).request("GET", "/v1/status")), output, status_tables)


def status_tables(found: Json) -> Group:
    """The fleet's GPUs, then its teams and queues, then (for admins) a line on the control plane."""
    parts: list[Table | str] = [gpus_table(found), queue_status_table(found["queues"])]
    control = found.get("control_plane")
    if control is not None:
        parts.append(control_plane_line(control))
    return Group(*parts)


@click.command()
@click.argument("workload_id", metavar="ID")
@click.option(
    "--until",
    type=click.Choice([s.value for s in WorkloadState if not s.terminal]),
    default=None,
    help="Stop once it reaches this state (it always stops at succeeded, failed or cancelled).",
)
@click.option(
    "--interval", type=click.FloatRange(0.2, 60), default=1.0, show_default=True, help="Seconds between looks."
)
@click.option("--timeout", type=click.FloatRange(min=0), default=None, help="Give up after this many seconds (exit 1).")
@connection_options
def watch(
    workload_id: str,
    until: str | None,
    interval: float,
    timeout: float | None,
    api: str,
    token: str | None,
    output: str,
) -> None:
    """Follow one workload: a line each time its state, reason, queue position or cluster changes,
    until it finishes (exit 0; 1 when it failed or was cancelled) or reaches --until."""
    client = Api.from_options(api, token)
    deadline = None if timeout is None else time.monotonic() + timeout
    seen: tuple[object, ...] | None = None
    while True:
        workload = decoded(client.request("GET", workload_path(workload_id)))
        state = workload["state"]
        now = (state, workload.get("reason"), workload.get("queue_position"), workload.get("cluster"))
        if now != seen:
            seen = now
            emit_line(workload, output, watch_line)
        if WorkloadState(state).terminal:
            if state != WorkloadState.SUCCEEDED:
                sys.exit(1)
            return
        if until is not None and state == until:
            return
        if deadline is not None and time.monotonic() >= deadline:
            raise click.ClickException(f"{workload_id} is still {state} after {timeout:g} s")
        time.sleep(interval)


@click.group()
def workload() -> None:
    """Submit, list, show, cancel and watch workloads (gangs of pods).

    A workload is written as a YAML file (`gpufleet job init` writes a commented sample) and
    submitted to a queue; the API orders, admits and places it, and these commands follow it."""


for _verb in (submit, list_workloads, show, cancel, watch):
    workload.add_command(_verb)
