"""A click group that knows its commands by name and summary, and imports a command's module only
when that command runs or shows its own help.

Why: the daemons, benchmarks and the agent pull in SQLAlchemy, Alembic, nats-py, FastAPI and the
Kubernetes client (several seconds of imports); `gpufleet workload list` needs none of them. The group's
help prints the summaries kept here, in sections, so `gpufleet --help` imports no command at all.

A group may also keep older names as deprecated aliases (old name -> the path of the command that
replaced it): they still run, say on stderr which command to use instead, and are neither listed
in the help nor offered by shell completion.
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import click
from click.shell_completion import CompletionItem


@dataclass(frozen=True)
class Lazy:
    """Where a command lives ("package.module:attribute") and the one line `--help` shows for it."""

    target: str
    summary: str

    def load(self) -> click.Command:
        module_name, _, attribute = self.target.partition(":")
        command = getattr(importlib.import_module(module_name), attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"{self.target} is not a click command")
        return command


class DeprecatedAlias(click.Command):
    """Mixed into a copy of the command that replaced an old name: the copy runs under the old name
    and first says, on stderr, what to type instead."""

    replacement = ""

    def make_context(
        self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any
    ) -> click.Context:
        # Not while the shell asks for completions: the hint would land in the middle of the prompt.
        completing = extra.get("resilient_parsing") or (parent is not None and parent.resilient_parsing)
        if not completing:
            typed = f"{parent.command_path} {info_name}" if parent is not None else info_name
            click.echo(f"`{typed}` is deprecated and goes away in the next release: use `{self.replacement}`", err=True)
        return super().make_context(info_name, args, parent, **extra)


def deprecated_alias(command: click.Command, old: str, replacement: str) -> click.Command:
    """`command` under its old name, hidden from help, with the deprecation hint."""
    alias = copy.copy(command)
    # A subclass of the command's own class (a group stays a group), with the hint mixed in first.
    alias.__class__ = type(f"Deprecated{type(command).__name__}", (DeprecatedAlias, type(command)), {})
    assert isinstance(alias, DeprecatedAlias)
    alias.name = old
    alias.hidden = True
    alias.replacement = replacement
    return alias


class LazyGroup(click.Group):
    """Commands listed by section (title -> name -> Lazy), loaded on first use; `aliases` maps an
    old name to the path of words of the command that replaced it (e.g. "list" -> ("workload", "list"))."""

    def __init__(
        self,
        *args: Any,
        sections: Mapping[str, Mapping[str, Lazy]],
        aliases: Mapping[str, tuple[str, ...]] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.sections = sections
        self.lazy = {name: entry for entries in sections.values() for name, entry in entries.items()}
        self.aliases = dict(aliases or {})
        self.loaded_aliases: dict[str, click.Command] = {}

    def list_commands(self, ctx: click.Context) -> list[str]:  # noqa: ARG002 (click's signature)
        return [*self.lazy, *(name for name in sorted(self.commands) if name not in self.lazy)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.aliases:
            return self._alias(ctx, cmd_name)
        if cmd_name not in self.commands and cmd_name in self.lazy:
            command = self.lazy[cmd_name].load()
            if command.name != cmd_name:
                raise RuntimeError(f"{self.lazy[cmd_name].target} is named {command.name!r}, not {cmd_name!r}")
            self.commands[cmd_name] = command
        return self.commands.get(cmd_name)

    def shell_complete(self, ctx: click.Context, incomplete: str) -> list[CompletionItem]:
        # Names and summaries from the table: click's own would load every command to ask whether it
        # is hidden, and `gpufleet <TAB>` would import the daemons and benchmarks (over 10 s).
        items = [CompletionItem(name, help=entry.summary) for name, entry in self.lazy.items()]
        items += [
            CompletionItem(name, help=cmd.get_short_help_str())
            for name, cmd in sorted(self.commands.items())
            if name not in self.lazy and not cmd.hidden
        ]
        matching = [item for item in items if str(item.value).startswith(incomplete)]
        return [*matching, *click.Command.shell_complete(self, ctx, incomplete)]

    def _alias(self, ctx: click.Context, old: str) -> click.Command:
        if old not in self.loaded_aliases:
            path = self.aliases[old]
            found: click.Command | None = self
            for word in path:
                if not isinstance(found, click.Group):
                    found = None
                    break
                found = found.get_command(ctx, word)
            if found is None:
                raise RuntimeError(f"the alias {old!r} names {' '.join(path)!r}, which does not exist")
            root = ctx.find_root().info_name or "gpufleet"
            self.loaded_aliases[old] = deprecated_alias(found, old, " ".join((root, *path)))
        return self.loaded_aliases[old]

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:  # noqa: ARG002
        # The summaries written here, not the commands' docstrings: reading those would import them.
        rows: dict[str, list[tuple[str, str]]] = {
            title: [(name, entry.summary) for name, entry in entries.items()]
            for title, entries in self.sections.items()
        }
        extra = [
            (name, cmd.get_short_help_str())
            for name, cmd in sorted(self.commands.items())
            if name not in self.lazy and not cmd.hidden
        ]
        if extra:
            rows["Other commands"] = extra
        # One name column for every section, so the summaries line up down the whole page.
        width = max(len(name) for section in rows.values() for name, _ in section)
        for title, section in rows.items():
            with formatter.section(title):
                formatter.write_dl([(name.ljust(width), summary) for name, summary in section])
