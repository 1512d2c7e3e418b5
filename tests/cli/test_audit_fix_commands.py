"""Every command an audit finding's fix names (`gpufleet team update NAME --limit ...`) is a current
command of the CLI (no deprecated alias) and takes the options the sentence gives it."""

from __future__ import annotations

import re
import shlex
from types import SimpleNamespace

import click

from controlplane.cli.main import main
from controlplane.core.audit import Rule
from controlplane.service.audit_wording import fix_text


def _resolve(words: list[str]) -> tuple[click.Command, list[str]]:
    """The command the words name (walking the groups), and the words left for it."""
    ctx = click.Context(main, info_name="gpufleet")
    command: click.Command = main
    while isinstance(command, click.Group) and words and not words[0].startswith("-"):
        found = command.get_command(ctx, words[0])
        assert found is not None, f"no command {words[0]!r} under {ctx.command_path!r}"
        words = words[1:]
        ctx = click.Context(found, info_name=found.name, parent=ctx)
        command = found
    return command, words


def test_every_command_a_fix_names_exists_and_takes_the_options_it_is_given() -> None:
    named = 0
    for rule in Rule:
        text = fix_text(SimpleNamespace(rule=rule))  # type: ignore[arg-type]  (only the rule is read)
        for snippet in re.findall(r"`(gpufleet [^`]+)`", text):
            command, rest = _resolve(shlex.split(snippet)[1:])
            assert not command.hidden, f"{rule}: {snippet!r} uses a deprecated name"
            assert not isinstance(command, click.Group), f"{rule}: {snippet!r} names a group, not a command"
            options = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
            unknown = [word for word in rest if word.startswith("-") and word not in options]
            assert not unknown, f"{rule}: {snippet!r} gives options the command does not take: {unknown}"
            named += 1
    assert named >= 5  # the fixes that can be done from the CLI say how
