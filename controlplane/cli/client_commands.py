"""Commands that talk to a running gpufleet through its REST API.

They speak only HTTP, so they work the same against `gpufleet up` on a laptop and against
a deployed API; nothing here touches the database or NATS.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import IO, Any, TypeVar
from urllib.parse import quote

import click
import httpx
import yaml
from rich import box
from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from controlplane.config import default_state_dir
from controlplane.domain.model import WorkloadState

DEFAULT_API = "http://127.0.0.1:8080"
TIMEOUT_SECONDS = 30.0
TOKEN_FILE = "admin.token"
NONE = "-"

F = TypeVar("F", bound=Callable[..., Any])
Json = Any  # a decoded JSON document: the CLI only reads the keys it shows


# --- connection ---------------------------------------------------------------------------------


def state_dir() -> Path:
    """Where `gpufleet up` writes admin.token; honours GPUFLEET_STATE_DIR like the server does."""
    configured = os.environ.get("GPUFLEET_STATE_DIR")
    return Path(configured).expanduser() if configured else default_state_dir()


def token_file() -> Path:
    return state_dir() / TOKEN_FILE


def read_token_file(path: Path) -> str | None:
    # A missing or unreadable file is not an error here: the request goes out without a token
    # and the API's 401 turns into a message that says how to provide one.
    try:
        token = path.read_text().strip()
    except OSError:
        return None
    return token or None


@dataclass(frozen=True)
class Api:
    """Where the API is and how to authenticate to it."""

    url: str
    token: str | None

    @classmethod
    def from_options(cls, url: str, token: str | None) -> Api:
        # An empty --token/GPUFLEET_TOKEN means "not given", so the state-dir file still applies.
        return cls(url=url, token=token or read_token_file(token_file()))

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int | list[str]] | None = None,
        body: Json = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        """Send one request; any failure becomes a ClickException (message on stderr, exit code 1)."""
        sent = dict(headers or {})
        if self.token:
            sent["Authorization"] = f"Bearer {self.token}"
        content = None
        if body is not None:
            # Serialised here rather than by httpx so YAML dates (e.g. a label `2024-05-01`) become
            # strings instead of a TypeError.
            content = json.dumps(body, default=_json_default)
            sent["Content-Type"] = "application/json"
        try:
            with httpx.Client(base_url=self.url, timeout=TIMEOUT_SECONDS) as client:
                response = client.request(method, path, params=params, content=content, headers=sent)
        except httpx.ConnectError as exc:
            raise click.ClickException(
                f"the gpufleet API is not reachable at {self.url} ({exc}).\n"
                "Start one with `gpufleet up`, or point --api / GPUFLEET_API at a running API."
            ) from exc
        except httpx.TimeoutException as exc:
            raise click.ClickException(
                f"the gpufleet API at {self.url} did not answer within {TIMEOUT_SECONDS:g} s"
            ) from exc
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise click.ClickException(f"request to {self.url} failed: {exc}") from exc
        if response.is_error:
            raise click.ClickException(self._error_message(response))
        return response

    def _error_message(self, response: httpx.Response) -> str:
        detail = error_detail(response)
        if response.status_code == 401:
            how = (
                f"pass --token, set GPUFLEET_TOKEN, or put the token in {token_file()} "
                "(`gpufleet up` writes the admin token there)"
            )
            if self.token is None:
                return f"no API token was sent ({detail}); {how}"
            return f"the API token was rejected ({detail}); {how}"
        if response.status_code == 422:
            return f"invalid request: {detail}"
        return f"{detail} (HTTP {response.status_code})"


def error_detail(response: httpx.Response) -> str:
    """The API's `{"detail": ...}` message, or something readable when a proxy answered instead."""
    try:
        payload = response.json()
    except ValueError:
        payload = None
    detail = payload.get("detail") if isinstance(payload, dict) else None
    if isinstance(detail, str) and detail:
        return detail
    if isinstance(detail, list):  # FastAPI's default validation shape, should a handler not reformat it
        return "; ".join(_validation_item(item) for item in detail)
    raw = response.text.strip()
    return raw[:300] if raw else response.reason_phrase


def _validation_item(item: Json) -> str:
    if not isinstance(item, dict):
        return str(item)
    where = ".".join(str(p) for p in item.get("loc", ()) if p not in ("body", "query", "header", "path"))
    return f"{where or 'request'}: {item.get('msg', '')}"


def _json_default(value: object) -> str:
    if isinstance(value, date):  # also datetime
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def decoded(response: httpx.Response) -> Json:
    try:
        return response.json()
    except ValueError as exc:
        raise click.ClickException(
            f"the API answered HTTP {response.status_code} with a body that is not JSON"
        ) from exc


def connection_options(command: F) -> F:
    """--api, --token and --json on every command, so each one works alone in a script."""
    command = click.option("--json", "as_json", is_flag=True, help="Print the raw JSON response instead of a table.")(
        command
    )
    command = click.option(
        "--token",
        envvar="GPUFLEET_TOKEN",
        default=None,
        help=f"API token. Default: $GPUFLEET_TOKEN, else {TOKEN_FILE} in $GPUFLEET_STATE_DIR (~/.gpufleet).",
    )(command)
    command = click.option(
        "--api",
        envvar="GPUFLEET_API",
        default=DEFAULT_API,
        show_default=True,
        help="Base URL of the gpufleet REST API (env GPUFLEET_API).",
    )(command)
    return command


# --- output -------------------------------------------------------------------------------------


PIPE_WIDTH = 400


def console() -> Console:
    # Built per call so it writes to whatever sys.stdout is now (click's test runner swaps it);
    # highlight=False keeps rich from colouring ids and numbers it mistakes for code.
    out = Console(highlight=False)
    if not out.is_terminal and "COLUMNS" not in os.environ:
        # Piped into grep or a file: one line per row beats wrapping at rich's 80-column default.
        out.width = PIPE_WIDTH
    return out


def print_json(data: Json) -> None:
    click.echo(json.dumps(data, indent=2))


def text(value: object) -> str:
    """A cell: '-' for empty values, so blank columns do not look like rendering bugs."""
    if value is None or value in ("", []):
        return NONE
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    return str(value)


def number(value: float) -> str:
    # Quotas are floats in the API; 8.0 GPUs reads better as 8.
    return f"{value:g}"


def quota(values: Mapping[str, float], empty: str) -> str:
    if not values:
        return empty
    return ", ".join(f"{key}={number(amount)}" for key, amount in sorted(values.items()))


def new_table(title: str) -> Table:
    # Light borders and no edge padding: listings are read in 80-column terminals and pipes,
    # where heavy box drawing would squeeze the values themselves.
    return Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)


def workloads_table(workloads: list[Json]) -> Table:
    table = new_table(f"{len(workloads)} workload(s)")
    # The id stays on one line so it can be copied; other cells fold rather than end in "…",
    # so no value is ever hidden in a narrow terminal.
    table.add_column("id", no_wrap=True)
    for column in ("name", "queue", "state", "cluster"):
        table.add_column(column, overflow="fold")
    table.add_column("position", justify="right")
    table.add_column("reason", overflow="fold")
    for w in workloads:
        table.add_row(
            w["id"],
            w["name"],
            w["queue"],
            w["state"],
            text(w.get("cluster")),
            text(w.get("queue_position")),
            text(w.get("reason")),
        )
    return table


def pod_set_summary(pod_set: Mapping[str, Any]) -> str:
    if pod_set.get("mig_profile"):
        each = f"MIG {pod_set['mig_profile']}"
    elif pod_set.get("gpu_fraction"):
        each = f"{number(pod_set['gpu_fraction'])} GPU"
    else:
        each = f"{pod_set.get('gpus', 0)} GPU"
    models = pod_set.get("gpu_models") or []
    on = f" on {'/'.join(models)}" if models else ""
    return f"{pod_set.get('name', '?')}: {pod_set.get('replicas', 1)} x {each}{on}"


def workload_panel(w: Mapping[str, Any]) -> Panel:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    rows: list[tuple[str, object]] = [
        ("state", w["state"]),
        ("reason", w.get("reason")),
        ("queue", w["queue"]),
        ("queue position", w.get("queue_position")),
        ("team", w.get("team")),
        ("priority", f"{w.get('priority_class')} ({w.get('priority')})"),
        ("kind", w.get("kind")),
        ("gang", f"min {w.get('min_available')} available"),
        ("pod sets", [pod_set_summary(p) for p in w.get("pod_sets", [])]),
        ("cluster", w.get("cluster")),
        ("nodes", w.get("nodes")),
        ("created", w.get("created_at")),
        ("updated", w.get("updated_at")),
        ("finished", w.get("finished_at")),
    ]
    for label, value in rows:
        grid.add_row(label, text(value))
    return Panel(grid, title=f"{w['name']}  {w['id']}", title_align="left", expand=False)


def runs_table(runs: list[Json]) -> Table:
    table = new_table("runs")
    for column in ("attempt", "run", "cluster", "epoch", "state", "started", "finished", "message"):
        table.add_column(column, overflow="fold")
    for run in runs:
        table.add_row(
            str(run["attempt"]),
            run["id"],
            run["cluster"],
            str(run["epoch"]),
            run["state"],
            text(run.get("started_at")),
            text(run.get("finished_at")),
            text(run.get("message")),
        )
    return table


def assignments_table(run: Mapping[str, Any]) -> Table:
    table = new_table(f"assignments of run {run['attempt']} ({run['id']})")
    for column in ("pod set", "index", "node", "pool"):
        table.add_column(column, no_wrap=True)
    for a in run.get("assignments", []):
        table.add_row(a["pod_set"], str(a["index"]), a["node"], a["pool"])
    return table


def queues_table(queues: list[Json]) -> Table:
    table = new_table(f"{len(queues)} queue(s)")
    table.add_column("name", no_wrap=True)
    table.add_column("team", no_wrap=True)
    table.add_column("guaranteed")
    table.add_column("limit")
    table.add_column("weight", justify="right")
    for q in queues:
        table.add_row(
            q["name"],
            q.get("parent") or NONE,
            quota(q.get("guaranteed") or {}, NONE),
            quota(q.get("limit") or {}, "unbounded"),
            number(q.get("weight", 1.0)),
        )
    return table


def clusters_table(clusters: list[Json]) -> Table:
    table = new_table(f"{len(clusters)} cluster(s)  (* spot price)")
    for column in ("cluster", "provider", "region", "pool", "gpu model", "gpus/node", "nodes", "sharing", "$/gpu-h"):
        numeric = column in ("gpus/node", "nodes", "$/gpu-h")
        table.add_column(column, overflow="fold", justify="right" if numeric else "left")
    for cluster in clusters:
        pools = cluster.get("pools") or [{}]
        for i, pool in enumerate(pools):
            # Cluster columns only on its first pool row; a section line separates clusters.
            head = (cluster["name"], cluster.get("provider", ""), text(cluster.get("region"))) if i == 0 else ("",) * 3
            table.add_row(*head, *pool_cells(pool), end_section=i == len(pools) - 1)
    return table


def pool_cells(pool: Mapping[str, Any]) -> tuple[str, ...]:
    if not pool:
        return (NONE,) * 6
    price = f"{pool.get('price_per_gpu_hour', 0.0):.2f}" + ("*" if pool.get("spot") else "")
    return (
        pool["name"],
        pool["gpu_model"],
        str(pool["gpus_per_node"]),
        str(pool["node_count"]),
        pool.get("sharing", "exclusive"),
        price,
    )


# --- commands -----------------------------------------------------------------------------------


def load_workload(source: IO[str], queue: str | None) -> dict[str, Any]:
    """The YAML body of POST /v1/workloads; the server validates it, the CLI only checks its shape."""
    name = getattr(source, "name", "<stdin>")
    try:
        body = yaml.safe_load(source)
    except yaml.YAMLError as exc:
        raise click.ClickException(f"{name} is not valid YAML: {exc}") from exc
    if not isinstance(body, dict):
        raise click.ClickException(
            f"{name}: expected a mapping (name, queue, pod_sets, ...), got {type(body).__name__}"
        )
    if queue is not None:
        body["queue"] = queue
    return body


@click.command()
@click.argument("file", type=click.File("r"))
@click.option("--queue", default=None, help="Submit to this queue instead of the file's `queue`.")
@click.option("--idempotency-key", default=None, help="Sent as Idempotency-Key: a retry returns the first workload.")
@connection_options
def submit(
    *, file: IO[str], queue: str | None, idempotency_key: str | None, api: str, token: str | None, as_json: bool
) -> None:
    """Submit the workload described in FILE (YAML; `-` reads stdin)."""
    body = load_workload(file, queue)
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    response = Api.from_options(api, token).request("POST", "/v1/workloads", body=body, headers=headers)
    workload = decoded(response)
    if as_json:
        print_json(workload)
        return
    # 200 instead of 201 means the key matched an earlier submission: say so, or users think a second copy runs.
    verb = "already submitted" if response.status_code == 200 else "submitted"
    position = workload.get("queue_position")
    where = f", position {position} in queue {workload['queue']}" if position is not None else ""
    click.echo(f"{verb} {workload['id']}: {workload['state']}{where}")


@click.command(name="list")
@click.option("--queue", default=None, help="Only workloads of this queue.")
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice([s.value for s in WorkloadState]),
    help="Only workloads in this state (repeatable).",
)
@click.option("--limit", type=click.IntRange(1, 1000), default=None, help="At most this many (server default 100).")
@connection_options
def list_workloads(
    *, queue: str | None, states: tuple[str, ...], limit: int | None, api: str, token: str | None, as_json: bool
) -> None:
    """List workloads, newest first as the API orders them."""
    params: dict[str, str | int | list[str]] = {}
    # Only filters the user gave are sent, so the server's defaults stay the single source of truth.
    if queue is not None:
        params["queue"] = queue
    if states:
        params["state"] = list(states)
    if limit is not None:
        params["limit"] = limit
    workloads = decoded(Api.from_options(api, token).request("GET", "/v1/workloads", params=params))
    if as_json:
        print_json(workloads)
        return
    if not workloads:
        click.echo("no workloads match")
        return
    console().print(workloads_table(workloads))


def workload_path(workload_id: str, suffix: str = "") -> str:
    # Quoted so an id such as `../clusters` cannot address another route.
    return f"/v1/workloads/{quote(workload_id, safe='')}{suffix}"


@click.command()
@click.argument("workload_id", metavar="ID")
@connection_options
def show(workload_id: str, api: str, token: str | None, as_json: bool) -> None:
    """Show one workload: state, reason, queue position, placement and runs."""
    workload = decoded(Api.from_options(api, token).request("GET", workload_path(workload_id)))
    if as_json:
        print_json(workload)
        return
    out = console()
    out.print(workload_panel(workload))
    runs = workload.get("runs") or []
    if not runs:
        out.print("no runs yet")
        return
    out.print(runs_table(runs))
    for run in runs:
        if run.get("assignments"):
            out.print(assignments_table(run))


@click.command()
@click.argument("workload_id", metavar="ID")
@click.option("--reason", default=None, help="Why; recorded on the workload (server default: cancelled by user).")
@connection_options
def cancel(workload_id: str, reason: str | None, api: str, token: str | None, as_json: bool) -> None:
    """Cancel a workload that has not finished."""
    body = {"reason": reason} if reason is not None else None
    workload = decoded(Api.from_options(api, token).request("POST", workload_path(workload_id, "/cancel"), body=body))
    if as_json:
        print_json(workload)
        return
    click.echo(
        f"{workload['id']}: {workload['state']}" + (f" ({workload['reason']})" if workload.get("reason") else "")
    )


@click.command()
@connection_options
def queues(api: str, token: str | None, as_json: bool) -> None:
    """List queues with their quotas (a team token sees its own queues)."""
    found = decoded(Api.from_options(api, token).request("GET", "/v1/queues"))
    if as_json:
        print_json(found)
        return
    console().print(queues_table(found))


@click.command()
@connection_options
def clusters(api: str, token: str | None, as_json: bool) -> None:
    """List clusters and their node pools."""
    found = decoded(Api.from_options(api, token).request("GET", "/v1/clusters"))
    if as_json:
        print_json(found)
        return
    console().print(clusters_table(found))


COMMANDS = (submit, list_workloads, show, cancel, queues, clusters)


def register(group: click.Group) -> None:
    for command in COMMANDS:
        group.add_command(command)
