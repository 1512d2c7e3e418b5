"""`gpufleet completion SHELL`: the shell's completion script for gpufleet (click's own), so
commands, verbs and options complete on Tab. Commands listed lazily are loaded only when a
completion needs what is under them."""

from __future__ import annotations

import click
from click.shell_completion import get_completion_class

from controlplane.cli.main import main  # the root group: what completes is everything under it

COMPLETE_VAR = "_GPUFLEET_COMPLETE"


@click.command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell: str) -> None:
    """Print the completion script for SHELL. Load it with, for bash:
    `eval "$(gpufleet completion bash)"` (or save it where your shell reads completions)."""
    found = get_completion_class(shell)
    if found is None:  # pragma: no cover - the choice above lists only shells click supports
        raise click.UsageError(f"no completion for {shell}")
    click.echo(found(main, {}, "gpufleet", COMPLETE_VAR).source())
