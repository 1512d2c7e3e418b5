"""`gpufleet login` and `gpufleet context`: save an API and its token under a name, and switch
between them (`contexts.py` keeps them; every client command then finds the API without --api)."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from controlplane.cli import contexts
from controlplane.cli.client_output import new_table
from controlplane.cli.output_options import emit, output_options
from controlplane.cli.rest_api import DEFAULT_API, Api, Json, read_token_file, token_file


@click.command()
@click.argument("api", default=DEFAULT_API, metavar="[API]")
@click.option("--token", envvar="GPUFLEET_TOKEN", default=None, help="The token (default: $GPUFLEET_TOKEN).")
@click.option(
    "--token-file",
    "token_file_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Read the token from this file (default: the admin token `gpufleet up` wrote).",
)
@click.option("--name", default=None, help="The context's name (default: the API's host and port).")
def login(api: str, token: str | None, token_file_path: Path | None, name: str | None) -> None:
    """Check that API (default the local `gpufleet up`) answers this token, and save both as a
    context, made current: client commands then need no --api or --token."""
    if token_file_path is not None:
        token = read_token_file(token_file_path)
    token = token or read_token_file(token_file())
    if not token:
        raise click.UsageError("no token: pass --token or --token-file (or set GPUFLEET_TOKEN)")
    api = api.rstrip("/")
    queues = Api(api, token).request("GET", "/v1/queues")  # any valid token may list (its) queues
    name = name or api.split("://", 1)[-1]
    saved = contexts.load()
    saved.by_name[name] = contexts.Context(name, api, token)
    saved.current = name
    path = contexts.save(saved)
    seen = len(queues.json()) if queues.headers.get("content-type", "").startswith("application/json") else 0
    click.echo(f"logged in to {api}: context {name!r} saved in {path} and made current ({seen} queue(s) visible)")


@click.group()
def context() -> None:
    """Saved APIs and tokens (`gpufleet login` adds one): list, use, delete."""


@context.command("list")
@output_options()
def list_contexts(output: str) -> None:
    """The saved contexts (tokens are never printed); * marks the current one."""
    saved = contexts.load()
    emit(contexts_document(saved), output, lambda _: contexts_table(saved))


def contexts_document(saved: contexts.Contexts) -> Json:
    """What `-o json|yaml` prints: whether a token is saved, never the token."""
    return {
        "current": saved.current,
        "contexts": [
            {"name": item.name, "api": item.api, "token_saved": item.token is not None}
            for item in sorted(saved.by_name.values(), key=lambda c: c.name)
        ],
    }


def contexts_table(saved: contexts.Contexts) -> Table:
    table = new_table(f"{len(saved.by_name)} context(s) in {contexts.config_path()}")
    for column in ("", "name", "api", "token"):
        table.add_column(column, no_wrap=True)
    for item in sorted(saved.by_name.values(), key=lambda c: c.name):
        table.add_row("*" if item.name == saved.current else "", item.name, item.api, "saved" if item.token else "-")
    return table


@context.command("use")
@click.argument("name")
def use_context(name: str) -> None:
    """Make NAME the current context."""
    saved = contexts.load()
    if name not in saved.by_name:
        raise click.ClickException(f"no context named {name!r} (known: {', '.join(sorted(saved.by_name)) or 'none'})")
    saved.current = name
    contexts.save(saved)
    click.echo(f"current context: {name} ({saved.by_name[name].api})")


@context.command("delete")
@click.argument("name")
def delete_context(name: str) -> None:
    """Forget NAME and its token."""
    saved = contexts.load()
    if saved.by_name.pop(name, None) is None:
        raise click.ClickException(f"no context named {name!r}")
    if saved.current == name:
        saved.current = None
    contexts.save(saved)
    click.echo(f"context {name} deleted")
