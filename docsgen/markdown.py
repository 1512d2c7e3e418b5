"""Small Markdown writers shared by the reference generators: text from the code is escaped so
it renders as written (angle brackets are not HTML, asterisks are not emphasis), code spans kept."""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

_CODE_SPAN = re.compile(r"(`[^`]*`)")


def text(value: str) -> str:
    """Prose from a docstring or help string, safe for Markdown; `code spans` are left as they are."""
    parts = _CODE_SPAN.split(value)
    return "".join(part if part.startswith("`") else _escape(part) for part in parts)


def _escape(part: str) -> str:
    return (
        part.replace("\\", "\\\\")
        .replace("<", "&lt;")
        .replace(">", "&gt;")
        .replace("*", "\\*")
        .replace("[", "\\[")
        .replace("]", "\\]")
    )


def cell(value: str) -> str:
    """One table cell: a single line, pipes escaped."""
    return text(" ".join(value.split())).replace("|", "\\|")


def code(value: str, in_table: bool = True) -> str:
    """An inline code span, also around backticks; in a table its pipes are escaped."""
    value = " ".join(value.split())
    fence = "``" if "`" in value else "`"
    pad = " " if "`" in value else ""
    span = f"{fence}{pad}{value}{pad}{fence}"
    return span.replace("|", "\\|") if in_table else span


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A Markdown table; cells are written by the caller (`cell`, `code`)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def docstring(value: str | None) -> str:
    """A docstring or click help as paragraphs (click's `\\b` no-rewrap markers removed)."""
    if not value:
        return ""
    cleaned = inspect.cleandoc(value).replace("\b\n", "").replace("\b", "")
    return text(cleaned)


def home_relative(value: str) -> str:
    """A default that names the user's home directory is shown as `~/...`, the same for every reader."""
    home = str(Path.home())
    return value.replace(home, "~") if home not in ("/", "") else value
