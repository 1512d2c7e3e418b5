"""A click group that knows its commands by name and summary, and imports a command's module only
when that command runs or shows its own help.

Why: the daemons, benchmarks and the agent pull in SQLAlchemy, Alembic, nats-py, FastAPI and the
Kubernetes client (several seconds of imports); `gpufleet list` needs none of them. The group's
help prints the summaries kept here, in sections, so `gpufleet --help` imports no command at all.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import click


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


class LazyGroup(click.Group):
    """Commands listed by section (title -> name -> Lazy), loaded on first use."""

    def __init__(self, *args: Any, sections: Mapping[str, Mapping[str, Lazy]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sections = sections
        self.lazy = {name: entry for entries in sections.values() for name, entry in entries.items()}

    def list_commands(self, ctx: click.Context) -> list[str]:  # noqa: ARG002 (click's signature)
        return [*self.lazy, *(name for name in sorted(self.commands) if name not in self.lazy)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:  # noqa: ARG002
        if cmd_name not in self.commands and cmd_name in self.lazy:
            command = self.lazy[cmd_name].load()
            if command.name != cmd_name:
                raise RuntimeError(f"{self.lazy[cmd_name].target} is named {command.name!r}, not {cmd_name!r}")
            self.commands[cmd_name] = command
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:  # noqa: ARG002
        # The summaries written here, not the commands' docstrings: reading those would import them.
        rows: dict[str, list[tuple[str, str]]] = {
            title: [(name, entry.summary) for name, entry in entries.items()]
            for title, entries in self.sections.items()
        }
        extra = [
            (name, cmd.get_short_help_str()) for name, cmd in sorted(self.commands.items()) if name not in self.lazy
        ]
        if extra:
            rows["Other commands"] = extra
        # One name column for every section, so the summaries line up down the whole page.
        width = max(len(name) for section in rows.values() for name, _ in section)
        for title, section in rows.items():
            with formatter.section(title):
                formatter.write_dl([(name.ljust(width), summary) for name, summary in section])
