"""The fleet's objects from the command line: cohorts, teams, queues, priority classes, tokens and
clusters, each with the verbs the REST API offers for it (create, list, show, update, delete; a
token is issued and revoked). Like the workload commands they speak only HTTP (`rest_api.py`);
the API validates every body and its sentences are printed as they come.

Quotas are given as repeatable KEY=AMOUNT options (`--limit gpu-eq=16 --limit H100-80GB=8`): a key is
`gpu-eq` or a GPU model of a registered pool, which the API checks. Every command prints a table,
or `-o json` / `-o yaml` for scripts.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import IO, Any
from urllib.parse import quote

import click
import yaml

from controlplane.cli.client_output import (
    clusters_table,
    console,
    priority_classes_table,
    tokens_table,
    tree_table,
)
from controlplane.cli.rest_api import DEFAULT_API, TOKEN_FILE, Api, Json, decoded

OUTPUTS = ("table", "json", "yaml")

# level -> (the API's collection, the parent level's option, the body field naming the parent)
TREE_LEVELS: dict[str, tuple[str, str | None]] = {
    "cohort": ("cohorts", None),
    "team": ("teams", "cohort"),
    "queue": ("queues", "team"),
}
QUOTA_FIELDS = {
    "guaranteed": "kept for it when it asks (repeatable)",
    "limit": "never above this (repeatable)",
    "borrowing_limit": "the most it may use above its guarantee (repeatable)",
    "lending_limit": "the most of its unused guarantee it lends (repeatable)",
}


def _api(ctx: click.Context) -> Api:
    return Api.from_options(ctx.obj["api"], ctx.obj["token"])


def _path(*parts: str) -> str:
    # Quoted so a name such as `../tokens` cannot address another route.
    return "/v1/" + "/".join(quote(part, safe="") for part in parts)


def emit(data: Json, output: str, table: Callable[[Json], Any]) -> None:
    if output == "json":
        click.echo(json.dumps(data, indent=2))
    elif output == "yaml":
        click.echo(yaml.safe_dump(data, sort_keys=False), nl=False)
    else:
        console().print(table(data))


def object_group(name: str, help_text: str) -> click.Group:
    """A group whose options (--api, --token, -o) apply to every verb under it."""

    @click.group(name=name, help=help_text)
    @click.option(
        "--api",
        envvar="GPUFLEET_API",
        default=None,
        help=f"REST API base URL. Default: $GPUFLEET_API, else the current context, else {DEFAULT_API}.",
    )
    @click.option(
        "--token",
        envvar="GPUFLEET_TOKEN",
        default=None,
        help=f"API token. Default: $GPUFLEET_TOKEN, else the current context's, else {TOKEN_FILE} in the state dir.",
    )
    @click.option("-o", "--output", type=click.Choice(OUTPUTS), default="table", show_default=True)
    @click.pass_context
    def group(ctx: click.Context, api: str | None, token: str | None, output: str) -> None:
        ctx.obj = {"api": api, "token": token, "output": output}

    return group


def parse_quota(values: tuple[str, ...], option: str) -> dict[str, float]:
    """KEY=AMOUNT pairs; a malformed one is refused before anything is sent."""
    found: dict[str, float] = {}
    for item in values:
        key, sep, amount = item.partition("=")
        try:
            if not sep or not key.strip():
                raise ValueError
            found[key.strip()] = float(amount)
        except ValueError:
            raise click.BadParameter(
                f"{item!r} is not KEY=AMOUNT (for example gpu-eq=16 or H100-80GB=8)", param_hint=option
            ) from None
    return found


def quota_options(command: Callable[..., Any]) -> Callable[..., Any]:
    for field, meaning in reversed(QUOTA_FIELDS.items()):
        flag = "--" + field.replace("_", "-")
        command = click.option(flag, field, multiple=True, metavar="KEY=AMOUNT", help=meaning)(command)
    return click.option("--weight", type=float, default=None, help="Fair-share weight (default 1).")(command)


def quota_body(weight: float | None, given: Mapping[str, tuple[str, ...]]) -> dict[str, Any]:
    """Only what was given: the API's defaults stay the single source of truth, and an update
    changes only the fields named."""
    body: dict[str, Any] = {}
    for field in QUOTA_FIELDS:
        if given[field]:
            body[field] = parse_quota(given[field], "--" + field.replace("_", "-"))
    if weight is not None:
        body["weight"] = weight
    return body


def read_spec(source: IO[str], expected: str = "a mapping") -> dict[str, Any]:
    """A YAML file's mapping, the body of a request; the server validates it, the CLI only its shape."""
    name = getattr(source, "name", "<stdin>")
    try:
        body = yaml.safe_load(source)
    except yaml.YAMLError as exc:
        raise click.ClickException(f"{name} is not valid YAML: {exc}") from exc
    if not isinstance(body, dict):
        raise click.ClickException(f"{name}: expected {expected}, got {type(body).__name__}")
    return body


# --- cohorts, teams, queues ---------------------------------------------------------------------


def tree_group(level: str) -> click.Group:
    plural, parent = TREE_LEVELS[level]
    group = object_group(level, f"Create, list, show, update and delete {plural}.")

    @group.command("create")
    @click.argument("name")
    @quota_options
    @click.pass_context
    def create(ctx: click.Context, /, name: str, weight: float | None, **given: Any) -> None:
        belongs_to = given.pop(parent, None) if parent is not None else None
        body: dict[str, Any] = {"name": name, **quota_body(weight, given)}
        if parent is not None and belongs_to:
            body[parent] = belongs_to
        made = decoded(_api(ctx).request("POST", _path(plural), body=body))
        emit(made, ctx.obj["output"], lambda node: tree_table([node], level))

    if parent is not None:
        required = level == "queue"  # a queue belongs to a team; a team may stand alone
        create.params.append(click.Option([f"--{parent}"], required=required, help=f"The {parent} it belongs to."))

    @group.command("list")
    @click.pass_context
    def list_nodes(ctx: click.Context) -> None:
        found = decoded(_api(ctx).request("GET", _path(plural)))
        emit(found, ctx.obj["output"], lambda nodes: tree_table(nodes, level))

    @group.command("show")
    @click.argument("name")
    @click.pass_context
    def show(ctx: click.Context, name: str) -> None:
        emit(_tree_node(ctx, level, name), ctx.obj["output"], lambda node: tree_table([node], level))

    @group.command("update")
    @click.argument("name")
    @quota_options
    @click.pass_context
    def update(ctx: click.Context, /, name: str, weight: float | None, **given: tuple[str, ...]) -> None:
        body = quota_body(weight, given)
        if not body:
            raise click.UsageError("nothing to update: give --weight or a quota option")
        ref = _tree_node(ctx, level, name)["id"]
        changed = decoded(_api(ctx).request("PATCH", _path(plural, ref), body=body))
        emit(changed, ctx.obj["output"], lambda node: tree_table([node], level))

    @group.command("delete")
    @click.argument("name")
    @click.pass_context
    def delete(ctx: click.Context, name: str) -> None:
        ref = _tree_node(ctx, level, name)["id"]
        _api(ctx).request("DELETE", _path(plural, ref))
        click.echo(f"{level} {name} deleted")

    return group


def _tree_node(ctx: click.Context, level: str, name: str) -> Json:
    """One cohort, team or queue by name or id (cohorts have no route of their own: from the list)."""
    plural, _ = TREE_LEVELS[level]
    if level != "cohort":
        return decoded(_api(ctx).request("GET", _path(plural, name)))
    for node in decoded(_api(ctx).request("GET", _path(plural))):
        if name in (node["name"], node["id"]):
            return node
    raise click.ClickException(f"no cohort named {name!r} (HTTP 404)")


cohort = tree_group("cohort")
team = tree_group("team")
queue = tree_group("queue")


# --- priority classes ---------------------------------------------------------------------------

priority_class = object_group("priority-class", "Create or change (apply), list and delete priority classes.")


@priority_class.command("apply")
@click.argument("name")
@click.option("--value", type=int, required=True, help="Higher runs first and may preempt lower.")
@click.option("--preemptible/--not-preemptible", default=True, show_default=True, help="May its work be evicted?")
@click.option(
    "--min-runtime", "min_runtime_seconds", type=int, default=0, help="Seconds a run is protected from eviction."
)
@click.option("--default", "is_default", is_flag=True, help="Workloads that name no class get this one.")
@click.pass_context
def apply_priority_class(
    ctx: click.Context, name: str, value: int, preemptible: bool, min_runtime_seconds: int, is_default: bool
) -> None:
    """Create the class NAME, or replace it with these values."""
    body = {
        "name": name,
        "value": value,
        "preemptible": preemptible,
        "min_runtime_seconds": min_runtime_seconds,
        "is_default": is_default,
    }
    made = decoded(_api(ctx).request("POST", _path("priority-classes"), body=body))
    emit(made, ctx.obj["output"], lambda item: priority_classes_table([item]))


@priority_class.command("list")
@click.pass_context
def list_priority_classes(ctx: click.Context) -> None:
    found = decoded(_api(ctx).request("GET", _path("priority-classes")))
    emit(found, ctx.obj["output"], priority_classes_table)


@priority_class.command("delete")
@click.argument("name")
@click.pass_context
def delete_priority_class(ctx: click.Context, name: str) -> None:
    _api(ctx).request("DELETE", _path("priority-classes", name))
    click.echo(f"priority class {name} deleted")


# --- tokens -------------------------------------------------------------------------------------

token = object_group("token", "Issue, list and revoke API tokens (admin only).")


@token.command("issue")
@click.argument("name")
@click.option("--team", default=None, help="The team it acts for (role team).")
@click.option("--role", type=click.Choice(["team", "admin", "metrics"]), default="team", show_default=True)
@click.pass_context
def issue_token(ctx: click.Context, name: str, team: str | None, role: str) -> None:
    """Issue a token; its secret is printed once and never stored in the clear."""
    body: dict[str, Any] = {"name": name, "role": role}
    if team is not None:
        body["team"] = team
    issued = decoded(_api(ctx).request("POST", _path("tokens"), body=body))
    if ctx.obj["output"] != "table":
        emit(issued, ctx.obj["output"], tokens_table)
        return
    click.echo(f"token {issued['name']} ({issued['id']}, role {issued['role']}) issued; it is shown only now:")
    click.echo(issued["token"])


@token.command("list")
@click.option("--team", default=None, help="Only the tokens of this team.")
@click.pass_context
def list_tokens(ctx: click.Context, team: str | None) -> None:
    params = {"team": team} if team else None
    found = decoded(_api(ctx).request("GET", _path("tokens"), params=params))
    emit(found, ctx.obj["output"], tokens_table)


@token.command("revoke")
@click.argument("token_id", metavar="ID")
@click.pass_context
def revoke_token(ctx: click.Context, token_id: str) -> None:
    _api(ctx).request("DELETE", _path("tokens", token_id))
    click.echo(f"token {token_id} revoked")


# --- clusters -----------------------------------------------------------------------------------

cluster = object_group("cluster", "Register, list, show, update and delete clusters.")


@cluster.command("register")
@click.option(
    "-f", "--file", "source", type=click.File("r"), required=True, help="The cluster's spec (YAML; - for stdin)."
)
@click.pass_context
def register_cluster(ctx: click.Context, source: IO[str]) -> None:
    """Register a cluster from a spec file (name, provider, region, pools, kubeconfig for a real one).
    A real cluster's NATS credential for its agent is printed once."""
    made = decoded(_api(ctx).request("POST", _path("clusters"), body=read_spec(source)))
    secret = made.pop("nats_credential", "")
    emit(made, ctx.obj["output"], lambda item: clusters_table([item]))
    if secret and ctx.obj["output"] == "table":
        click.echo("the agent's NATS credential (shown only now):")
        click.echo(secret)


@cluster.command("list")
@click.pass_context
def list_clusters(ctx: click.Context) -> None:
    emit(decoded(_api(ctx).request("GET", _path("clusters"))), ctx.obj["output"], clusters_table)


@cluster.command("show")
@click.argument("ref", metavar="NAME")
@click.pass_context
def show_cluster(ctx: click.Context, ref: str) -> None:
    found = decoded(_api(ctx).request("GET", _path("clusters", ref)))
    emit(found, ctx.obj["output"], lambda item: clusters_table([item]))


@cluster.command("update")
@click.argument("ref", metavar="NAME")
@click.option("-f", "--file", "source", type=click.File("r"), required=True, help="Fields to change (YAML).")
@click.pass_context
def update_cluster(ctx: click.Context, ref: str, source: IO[str]) -> None:
    """Change a cluster's region, pools or Kubernetes settings from a file of those fields."""
    changed = decoded(_api(ctx).request("PATCH", _path("clusters", ref), body=read_spec(source)))
    emit(changed, ctx.obj["output"], lambda item: clusters_table([item]))


@cluster.command("delete")
@click.argument("ref", metavar="NAME")
@click.pass_context
def delete_cluster(ctx: click.Context, ref: str) -> None:
    _api(ctx).request("DELETE", _path("clusters", ref))
    click.echo(f"cluster {ref} deleted")
