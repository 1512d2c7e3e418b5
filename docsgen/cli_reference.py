"""The CLI reference: every command of `gpufleet`, walked through click's own API.

The walk asks each group for its commands (`list_commands`, `get_command`), so lazy groups
(controlplane/cli/lazy_group.py) load their commands here as they do when a user runs one, and a
renamed or regrouped command shows up as the code has it. A command reachable under two names (an
alias) is documented once and the second name points to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import click

from controlplane.cli.main import main
from docsgen import markdown as md

_MAX_HEADING = 6
# click 8.2+ marks "no default given" with a sentinel; older versions use None.
_UNSET = getattr(click.core, "UNSET", None)


@dataclass
class _Walk:
    lines: list[str] = field(default_factory=list)
    seen: dict[int, str] = field(default_factory=dict)  # id(command) -> its documented path


def cli_reference() -> str:
    return command_tree(main, "gpufleet")


def command_tree(root: click.Command, name: str) -> str:
    walk = _Walk()
    ctx = click.Context(root, info_name=name)
    walk.lines += [_usage(root, ctx), "", md.docstring(root.help), ""]
    walk.lines += _parameters(root, ctx)
    if isinstance(root, click.Group):
        sections = _sections(root)
        if sections:
            for title, names in sections.items():
                walk.lines += [f"## {md.text(title)}", ""]
                for sub in names:
                    _command(walk, root, ctx, sub, level=3)
        else:
            for sub in _visible(root, ctx):
                _command(walk, root, ctx, sub, level=2)
    return "\n".join(walk.lines).rstrip() + "\n"


def _sections(group: click.Group) -> dict[str, list[str]]:
    """The group's own sections (LazyGroup's `sections`: title -> names), then any command they miss."""
    declared = getattr(group, "sections", None)
    if not isinstance(declared, Mapping):
        return {}
    ctx = click.Context(group)
    listed = [name for names in declared.values() for name in names]
    sections = {str(title): [str(name) for name in names] for title, names in declared.items()}
    rest = [name for name in _visible(group, ctx) if name not in listed]
    if rest:
        sections["Other commands"] = rest
    return sections


def _visible(group: click.Group, ctx: click.Context) -> list[str]:
    names = []
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is not None and not command.hidden:
            names.append(name)
    return names


def _command(walk: _Walk, group: click.Group, parent: click.Context, name: str, level: int) -> None:
    command = group.get_command(parent, name)
    if command is None:
        raise LookupError(f"{parent.command_path} lists {name!r} but cannot load it")
    ctx = click.Context(command, info_name=name, parent=parent)
    path = ctx.command_path
    walk.lines += [f"{'#' * min(level, _MAX_HEADING)} `{path}`", ""]
    first = walk.seen.get(id(command))
    if first is not None:
        walk.lines += [f"Another name for `{first}` (same options).", ""]
        return
    walk.seen[id(command)] = path
    walk.lines += [_usage(command, ctx), ""]
    help_text = md.docstring(command.help or command.short_help)
    if help_text:
        walk.lines += [help_text, ""]
    walk.lines += _parameters(command, ctx)
    if isinstance(command, click.Group):
        for sub in _visible(command, ctx):
            _command(walk, command, ctx, sub, level + 1)


def _usage(command: click.Command, ctx: click.Context) -> str:
    return md.code(command.get_usage(ctx).removeprefix("Usage: "), in_table=False)


def _parameters(command: click.Command, ctx: click.Context) -> list[str]:
    rows = []
    for param in command.get_params(ctx):
        if isinstance(param, click.Option) and param.hidden:
            continue
        if isinstance(param, click.Option) and {"--help", "--version"} & set(param.opts):
            continue  # click's own, the same on every command
        rows.append([_names(param), _kind(param), _default(param), _help(param)])
    if not rows:
        return []
    return [md.table(["parameter", "type", "default", "help"], rows), ""]


def _names(param: click.Parameter) -> str:
    if isinstance(param, click.Option):
        names = " / ".join(", ".join(opts) for opts in (param.opts, param.secondary_opts) if opts)
        return md.code(names)
    return md.code((param.human_readable_name or param.name or "").upper())


def _kind(param: click.Parameter) -> str:
    if isinstance(param, click.Option) and param.is_flag:
        kind = "flag"
    elif isinstance(param.type, click.Choice):
        kind = " \\| ".join(md.code(str(choice)) for choice in param.type.choices)
    else:
        kind = md.cell(param.type.name.lower())
    if param.multiple or (param.nargs == -1):
        kind += ", repeatable"
    if param.required:
        kind += ", required"
    return kind


def _default(param: click.Parameter) -> str:
    default = param.default
    if default is _UNSET or callable(default) or default is None or default == () or (param.multiple and not default):
        return ""
    if isinstance(param, click.Option) and param.is_flag and default is False:
        return ""
    return md.code(md.home_relative(str(default)))


def _help(param: click.Parameter) -> str:
    parts = []
    if isinstance(param, click.Option):
        parts.append(md.cell(param.help or ""))
        if param.envvar:
            envvars = [param.envvar] if isinstance(param.envvar, str) else list(param.envvar)
            parts.append("env: " + ", ".join(md.code(v) for v in envvars))
    return "; ".join(part for part in parts if part)
