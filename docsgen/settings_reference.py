"""The settings reference: every field of `controlplane.config.Settings`.

A field's help is its `Field(description=...)`, else the comment block written just above it in
config.py (where the reasons for each setting already live). A field with neither fails the build,
so a new setting cannot go undocumented.
"""

from __future__ import annotations

import ast
import inspect
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from controlplane import config
from docsgen import markdown as md


def settings_reference() -> str:
    source = inspect.getsource(config)
    comments = field_comments(source, "Settings")
    prefix = str(config.Settings.model_config.get("env_prefix", ""))
    rows = []
    missing = []
    for name, info in config.Settings.model_fields.items():
        help_text = info.description or comments.get(name, "")
        if not help_text:
            missing.append(name)
        rows.append(
            [
                md.code(prefix + name.upper()),
                md.code(name),
                md.cell(_type(info)),
                _default(info),
                md.cell(" ".join(filter(None, [help_text, _bounds(info)]))),
            ]
        )
    if missing:
        raise ValueError(f"settings without a description or a comment above them in config.py: {', '.join(missing)}")
    return md.table(["environment variable", "config file key", "type", "default", "meaning"], rows) + "\n"


def field_comments(source: str, class_name: str) -> dict[str, str]:
    """field name -> the `#` lines right above its annotated assignment in the class body."""
    lines = source.splitlines()
    tree = ast.parse(source)
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ClassDef) and node.name == class_name):
            continue
        for statement in node.body:
            if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
                comment: list[str] = []
                row = statement.lineno - 2  # the line above, 0-based
                while row >= 0 and lines[row].strip().startswith("#"):
                    comment.insert(0, lines[row].strip().lstrip("#").strip())
                    row -= 1
                if comment:
                    found[statement.target.id] = " ".join(comment)
    return found


def _type(info: FieldInfo) -> str:
    annotation = info.annotation
    name = getattr(annotation, "__name__", None) or str(annotation)
    return name.replace("typing.", "").replace("pathlib.", "")


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        value: Any = info.default_factory()  # type: ignore[call-arg]
    elif info.default is PydanticUndefined:
        return "required"
    else:
        value = info.default
    if value in ("", None, [], {}):
        return "unset" if value in ("", None) else md.code(repr(value))
    if isinstance(value, list):
        value = ",".join(str(item) for item in value)
    return md.code(md.home_relative(str(value)))


def _bounds(info: FieldInfo) -> str:
    words = []
    for item in info.metadata:
        for attribute, label in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<"), ("pattern", "matches")):
            value = getattr(item, attribute, None)
            if value is not None:
                words.append(f"{label} {value}")
    return f"({', '.join(words)})" if words else ""
