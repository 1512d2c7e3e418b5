"""The fleet's objects from the command line: cohorts, teams, queues, priority classes, tokens and
clusters, each with the verbs the REST API offers for it (create, list, show, update, delete; a
token is issued and revoked). Like the workload commands they speak only HTTP (`rest_api.py`);
the API validates every body and its sentences are printed as they come.

Quotas are given as repeatable KEY=AMOUNT options (`--limit gpu-eq=16 --limit H100-80GB=8`): a key is
`gpu-eq` or a GPU model of a registered pool, which the API checks. Every command prints a table,
or `-o json` / `-o yaml` for scripts. The connection and output options may be given on the group
(`gpufleet team -o json list`) or, as on every other command, after the verb (`gpufleet team list
-o json`); the verb's win.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import IO, Any
from urllib.parse import quote

import click
import yaml

from controlplane.cli.client_output import (
    clusters_table,
    credentials_table,
    priority_classes_table,
    tokens_table,
    tree_table,
)
from controlplane.cli.output_options import emit, settled_connection, settled_options, settled_output
from controlplane.cli.rest_api import Api, Json, decoded

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


def _path(*parts: str) -> str:
    # Quoted so a name such as `../tokens` cannot address another route.
    return "/v1/" + "/".join(quote(part, safe="") for part in parts)


class ObjectGroup(click.Group):
    """A group whose verbs all take the connection and output options too, so `gpufleet queue -o
    json list` and `gpufleet queue list -o json` both work, as does the older `gpufleet queues
    --json` that now runs `queue list`."""

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        cmd.params.extend(settled_options())
        super().add_command(cmd, name)


def object_group(name: str, help_text: str) -> click.Group:
    """A group of verbs on one kind of object; the options may come before or after the verb."""
    return ObjectGroup(name=name, help=help_text, params=settled_options())


def _api(ctx: click.Context) -> Api:
    api, token = settled_connection(ctx)
    return Api.from_options(api, token)


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

    @group.command("create", help=f"Create the {level} NAME with the quotas given.")
    @click.argument("name")
    @quota_options
    @click.pass_context
    def create(ctx: click.Context, /, name: str, weight: float | None, **given: Any) -> None:
        belongs_to = given.pop(parent, None) if parent is not None else None
        body: dict[str, Any] = {"name": name, **quota_body(weight, given)}
        if parent is not None and belongs_to:
            body[parent] = belongs_to
        made = decoded(_api(ctx).request("POST", _path(plural), body=body))
        emit(made, settled_output(ctx), lambda node: tree_table([node], level))

    if parent is not None:
        required = level == "queue"  # a queue belongs to a team; a team may stand alone
        create.params.append(click.Option([f"--{parent}"], required=required, help=f"The {parent} it belongs to."))

    with_status = level in ("team", "queue")  # what `GET /v1/status` reports use and pending for
    listed = f"List the {plural} with their quotas" + (
        " and, in the table, the GPU-equivalents each uses and its pending gangs." if with_status else "."
    )

    @group.command("list", help=listed)
    @click.pass_context
    def list_nodes(ctx: click.Context) -> None:
        found = decoded(_api(ctx).request("GET", _path(plural)))
        output = settled_output(ctx)
        # The REST view is the object as configured (what -o json/yaml prints); the table adds its
        # figures of now from the fleet's status, one more request.
        status = decoded(_api(ctx).request("GET", "/v1/status")) if with_status and output == "table" else None
        emit(found, output, lambda nodes: tree_table(nodes, level, status))

    @group.command("show", help=f"Show one {level}, by name or id.")
    @click.argument("name")
    @click.pass_context
    def show(ctx: click.Context, name: str) -> None:
        emit(_tree_node(ctx, level, name), settled_output(ctx), lambda node: tree_table([node], level))

    @group.command("update", help=f"Change the weight or quotas named; the rest of the {level} stays.")
    @click.argument("name")
    @quota_options
    @click.pass_context
    def update(ctx: click.Context, /, name: str, weight: float | None, **given: tuple[str, ...]) -> None:
        body = quota_body(weight, given)
        if not body:
            raise click.UsageError("nothing to update: give --weight or a quota option")
        ref = _tree_node(ctx, level, name)["id"]
        changed = decoded(_api(ctx).request("PATCH", _path(plural, ref), body=body))
        emit(changed, settled_output(ctx), lambda node: tree_table([node], level))

    @group.command("delete", help=f"Delete the {level} NAME (the API refuses while something belongs to it).")
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

priority_class = object_group("priority-class", "Create or change (apply), list, show and delete priority classes.")


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
    emit(made, settled_output(ctx), lambda item: priority_classes_table([item]))


@priority_class.command("list")
@click.pass_context
def list_priority_classes(ctx: click.Context) -> None:
    """List the priority classes, highest first."""
    found = decoded(_api(ctx).request("GET", _path("priority-classes")))
    emit(found, settled_output(ctx), priority_classes_table)


@priority_class.command("show")
@click.argument("name")
@click.pass_context
def show_priority_class(ctx: click.Context, name: str) -> None:
    """Show one priority class (the API lists them; there are few)."""
    for item in decoded(_api(ctx).request("GET", _path("priority-classes"))):
        if item["name"] == name:
            emit(item, settled_output(ctx), lambda one: priority_classes_table([one]))
            return
    raise click.ClickException(f"no priority class named {name!r} (HTTP 404)")


@priority_class.command("delete")
@click.argument("name")
@click.pass_context
def delete_priority_class(ctx: click.Context, name: str) -> None:
    """Delete the class NAME (the API says why when it refuses)."""
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
    if settled_output(ctx) != "table":
        emit(issued, settled_output(ctx), tokens_table)
        return
    click.echo(f"token {issued['name']} ({issued['id']}, role {issued['role']}) issued; it is shown only now:")
    click.echo(issued["token"])


@token.command("list")
@click.option("--team", default=None, help="Only the tokens of this team.")
@click.pass_context
def list_tokens(ctx: click.Context, team: str | None) -> None:
    """List the tokens (never their secrets)."""
    params = {"team": team} if team else None
    found = decoded(_api(ctx).request("GET", _path("tokens"), params=params))
    emit(found, settled_output(ctx), tokens_table)


@token.command("revoke")
@click.argument("token_id", metavar="ID")
@click.pass_context
def revoke_token(ctx: click.Context, token_id: str) -> None:
    """Revoke a token: it is refused from then on."""
    _api(ctx).request("DELETE", _path("tokens", token_id))
    click.echo(f"token {token_id} revoked")


# --- clusters -----------------------------------------------------------------------------------

cluster = object_group(
    "cluster", "Register, list, show, update and delete clusters; list, rotate and revoke their agents' credentials."
)


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
    emit(made, settled_output(ctx), lambda item: clusters_table([item]))
    if secret and settled_output(ctx) == "table":
        click.echo("the agent's NATS credential (shown only now):")
        click.echo(secret)


@cluster.command("list")
@click.pass_context
def list_clusters(ctx: click.Context) -> None:
    """List the clusters and their node pools; in the table, each pool's GPU-equivalents allocated,
    free and asked for by queued gangs."""
    found = decoded(_api(ctx).request("GET", _path("clusters")))
    output = settled_output(ctx)
    # As `queue list`: the objects as registered, and in the table the figures of now (one more request).
    status = decoded(_api(ctx).request("GET", "/v1/status")) if output == "table" else None
    emit(found, output, lambda clusters: clusters_table(clusters, status))


@cluster.command("show")
@click.argument("ref", metavar="NAME")
@click.pass_context
def show_cluster(ctx: click.Context, ref: str) -> None:
    """Show one cluster and its node pools."""
    found = decoded(_api(ctx).request("GET", _path("clusters", ref)))
    emit(found, settled_output(ctx), lambda item: clusters_table([item]))


@cluster.command("update")
@click.argument("ref", metavar="NAME")
@click.option("-f", "--file", "source", type=click.File("r"), required=True, help="Fields to change (YAML).")
@click.pass_context
def update_cluster(ctx: click.Context, ref: str, source: IO[str]) -> None:
    """Change a cluster's region, pools or Kubernetes settings from a file of those fields."""
    changed = decoded(_api(ctx).request("PATCH", _path("clusters", ref), body=read_spec(source)))
    emit(changed, settled_output(ctx), lambda item: clusters_table([item]))


@cluster.command("credentials")
@click.argument("ref", metavar="NAME")
@click.pass_context
def list_cluster_credentials(ctx: click.Context, ref: str) -> None:
    """List the NATS credentials of a cluster's agent (never the secrets)."""
    found = decoded(_api(ctx).request("GET", _path("clusters", ref, "credentials")))
    emit(found, settled_output(ctx), credentials_table)


@cluster.command("rotate-credential")
@click.argument("ref", metavar="NAME")
@click.pass_context
def rotate_cluster_credential(ctx: click.Context, ref: str) -> None:
    """Revoke the cluster's NATS credentials and issue a new one; the secret is printed once and
    the cluster's agent must be given it."""
    issued = decoded(_api(ctx).request("POST", _path("clusters", ref, "credentials", "rotate")))
    if settled_output(ctx) != "table":
        emit(issued, settled_output(ctx), credentials_table)
        return
    click.echo(f"credential {issued['id']} issued for cluster {issued['cluster']}; it is shown only now:")
    click.echo(issued["credential"])


@cluster.command("revoke-credentials")
@click.argument("ref", metavar="NAME")
@click.pass_context
def revoke_cluster_credentials(ctx: click.Context, ref: str) -> None:
    """Revoke every NATS credential of the cluster: its agent is disconnected until given a new one."""
    _api(ctx).request("DELETE", _path("clusters", ref, "credentials"))
    click.echo(f"every NATS credential of cluster {ref} revoked")


@cluster.command("delete")
@click.argument("ref", metavar="NAME")
@click.pass_context
def delete_cluster(ctx: click.Context, ref: str) -> None:
    """Delete a cluster (the API says why when it refuses)."""
    _api(ctx).request("DELETE", _path("clusters", ref))
    click.echo(f"cluster {ref} deleted")
