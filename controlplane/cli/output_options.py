"""The one rule for how a client command prints and reaches the API: `-o table|json|yaml` (plus what a
command adds, e.g. `csv` for reports), `--json` kept as the older spelling of `-o json`, and
`--api`/`--token`. Every command that prints objects takes these options from here, so they mean
the same everywhere (`gpufleet workload list -o yaml`, `gpufleet status -o json`, `gpufleet team
list -o yaml`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any, TypeVar, cast

import click
import yaml

from controlplane.cli.client_output import console
from controlplane.cli.rest_api import DEFAULT_API, TOKEN_FILE, Json

F = TypeVar("F", bound=Callable[..., Any])

OUTPUTS = ("table", "json", "yaml")
OUTPUT_HELP = "How to print: a table for people, json or yaml for scripts (the API's own fields)."
JSON_HELP = "The same as -o json (the older spelling)."


def resolve_output(output: str | None, as_json: bool, default: str = "table") -> str:
    """`--json` is `-o json`; both given and disagreeing is a mistake worth saying, not guessing."""
    if as_json and output not in (None, "json"):
        raise click.UsageError(f"--json means -o json; it cannot go with -o {output}")
    if as_json:
        return "json"
    return output or default


def output_options(extra: tuple[str, ...] = ()) -> Callable[[F], F]:
    """-o/--output (table, json, yaml and `extra`) and --json on a command; its function gets one
    `output` argument."""

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def folded(*args: Any, output: str | None, as_json: bool, **kwargs: Any) -> Any:
            return func(*args, output=resolve_output(output, as_json), **kwargs)

        with_json = click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
        choices = click.Choice((*OUTPUTS, *extra))
        with_output = click.option("-o", "--output", type=choices, default=None, help=f"{OUTPUT_HELP} [default: table]")
        return cast(F, with_output(with_json(folded)))

    return decorate


API_HELP = (
    f"Base URL of the gpufleet REST API. Default: $GPUFLEET_API, else the current context "
    f"(`gpufleet login`), else {DEFAULT_API}."
)
TOKEN_HELP = (
    f"API token. Default: $GPUFLEET_TOKEN, else the current context's, else {TOKEN_FILE} in "
    "$GPUFLEET_STATE_DIR (~/.gpufleet)."
)


def api_options(command: F) -> F:
    """--api and --token, so each command works alone in a script."""
    command = click.option("--token", envvar="GPUFLEET_TOKEN", default=None, help=TOKEN_HELP)(command)
    return click.option("--api", envvar="GPUFLEET_API", default=None, help=API_HELP)(command)


def connection_options(command: F) -> F:
    """--api, --token, -o and --json: what every command that asks the API and prints takes."""
    return api_options(output_options()(command))


# --- the same options on a group and on each of its verbs (the object groups) -----------------------


def settled_options() -> list[click.Parameter]:
    """--api, --token, -o and --json for a group and each of its verbs, kept in ctx.obj (read with
    `settled_connection` and `settled_output`) instead of passed as arguments: a verb's own value
    wins over its group's, so they may come before or after the verb."""
    return [
        click.Option(["--api"], envvar="GPUFLEET_API", help=API_HELP, expose_value=False, callback=_settle),
        click.Option(["--token"], envvar="GPUFLEET_TOKEN", help=TOKEN_HELP, expose_value=False, callback=_settle),
        click.Option(
            ["-o", "--output"],
            type=click.Choice(OUTPUTS),
            help=f"{OUTPUT_HELP} [default: table]",
            expose_value=False,
            callback=_settle,
        ),
        click.Option(["--json", "as_json"], is_flag=True, help=JSON_HELP, expose_value=False, callback=_settle),
    ]


def _settle(ctx: click.Context, param: click.Parameter, value: Any) -> None:
    """Keep one of `settled_options` in ctx.obj. A verb's value wins over its group's, unless it only
    came from the environment and the group's was typed. `--json` is `-o json`; the two disagreeing
    on one command line is refused with `resolve_output`'s sentence."""
    settings = ctx.ensure_object(dict)
    typed = ctx.get_parameter_source(param.name or "") == click.core.ParameterSource.COMMANDLINE
    name = param.name or ""
    if name == "as_json":
        name, value = "output", ("json" if value else None)
    if name == "output" and value is not None:
        given_here = settings.setdefault("outputs_given", {}).setdefault(ctx.command_path, set())
        given_here.add(value)
        if len(given_here) > 1:
            resolve_output(next(iter(given_here - {"json"})), as_json=True)  # raises
    if value is not None and (typed or settings.get(name) is None):
        settings[name] = value
    else:
        settings.setdefault(name, value)


def settled_connection(ctx: click.Context) -> tuple[str | None, str | None]:
    settings = ctx.ensure_object(dict)
    return settings.get("api"), settings.get("token")


def settled_output(ctx: click.Context) -> str:
    return str(ctx.ensure_object(dict).get("output") or "table")


# --- printing -------------------------------------------------------------------------------------


def print_data(data: Json, output: str) -> None:
    """The API's document itself, as JSON or YAML (the same data either way: YAML is JSON's superset)."""
    if output == "yaml":
        click.echo(yaml.safe_dump(data, sort_keys=False), nl=False)
    else:
        click.echo(json.dumps(data, indent=2))


def emit(data: Json, output: str, table: Callable[[Json], Any]) -> None:
    """Print the API's document as asked: `table(data)` (a rich renderable) or the data itself."""
    if output == "table":
        console().print(table(data))
    else:
        print_data(data, output)


def emit_line(data: Json, output: str, line: Callable[[Json], str]) -> None:
    """One item of a stream (`workload watch`): a JSON line, a YAML document, or `line(data)`."""
    if output == "json":
        click.echo(json.dumps(data))
    elif output == "yaml":
        click.echo("---\n" + yaml.safe_dump(data, sort_keys=False), nl=False)
    else:
        click.echo(line(data))
