"""The event reference: every place the code writes an event to the outbox, read from the source.

gpufleet has no separate event catalog: events are written through `controlplane.service.events`
(`emit`, `emit_many`, `emit_each`, `emit_view`, `view_event` for `workload.*` events; `envelope`
for the others). This reads every module's calls of those functions with `ast` and lists the event
type (a literal, a module constant, or the expression that names it), the data fields the call adds
and where it is written, so the list follows the code. The envelope's and a workload event's
common fields come from `envelope` and `view_event` themselves.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from docsgen import markdown as md

EVENTS_MODULE = "controlplane.service.events"
# Modules that re-export an emitter under the same signature (`workloads.emit` calls `events.emit`).
_RE_EXPORTS = {"controlplane.service.workloads": ("emit",)}
# name -> (position of the event argument, whether the type is `workload.<event>`)
_EMITTERS = {
    "emit": (3, True),
    "emit_many": (2, True),
    "emit_view": (2, True),
    "view_event": (1, True),
    "emit_each": (-1, True),
    "envelope": (0, False),
}
_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class EmittedEvent:
    event_type: str
    fields: tuple[str, ...]
    where: str  # module path:function


def events_reference() -> str:
    emitted = sorted(set(emitted_events()), key=lambda e: (e.event_type, e.where))
    rows = [[md.code(e.event_type), ", ".join(md.code(f) for f in e.fields) or "", md.code(e.where)] for e in emitted]
    events_source = (_ROOT / "controlplane/service/events.py").read_text()
    envelope_keys = _dict_keys_in(events_source, "envelope", "body")
    workload_keys = _dict_keys_in(events_source, "view_event", "data")
    lines = [
        "Every event is a JSON envelope with the fields "
        + ", ".join(md.code(k, in_table=False) for k in envelope_keys)
        + ". A `workload.*` event's `data` always holds "
        + ", ".join(md.code(k, in_table=False) for k in workload_keys)
        + "; the fields below are what each call adds to it (the other events' `data` is the"
        " whole of what is listed).",
        "",
        md.table(["event type", "data fields it adds", "written by"], rows),
    ]
    return "\n".join(lines) + "\n"


def emitted_events() -> Iterator[EmittedEvent]:
    for path in sorted((_ROOT / "controlplane").rglob("*.py")):
        relative = path.relative_to(_ROOT).as_posix()
        if relative == "controlplane/service/events.py":
            continue  # the emitters themselves
        source = path.read_text()
        if "emit" not in source and "envelope" not in source:
            continue
        yield from _module_events(ast.parse(source), relative)


def _module_events(tree: ast.Module, where: str) -> Iterator[EmittedEvent]:
    direct, modules = _imported_emitters(tree)
    module = where.removesuffix(".py").replace("/", ".")
    own = _RE_EXPORTS.get(module, ())
    direct |= {name: name for name in own}  # the module's own re-exported emitter, called inside it
    if not direct and not modules:
        return
    constants = {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef) or function.name in own:
            continue  # a re-exporting wrapper passes its caller's event on
        for call in ast.walk(function):
            if not isinstance(call, ast.Call):
                continue
            name = _emitter_name(call.func, direct, modules)
            if name is None:
                continue
            position, workload = _EMITTERS[name]
            if position < 0:
                event = "<event>"
                fields: tuple[str, ...] = ()
            else:
                if len(call.args) <= position:
                    continue
                event = _render(call.args[position], constants)
                fields = tuple(k.arg for k in call.keywords if k.arg is not None)
                if name == "envelope" and len(call.args) > 1:
                    fields = _data_fields(call.args[1], function)
            yield EmittedEvent(f"workload.{event}" if workload else event, fields, f"{where}:{function.name}")


def _imported_emitters(tree: ast.Module) -> tuple[dict[str, str], set[str]]:
    """Local names bound to the emitters, and local names of the events module itself."""
    direct: dict[str, str] = {}
    modules: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in (EVENTS_MODULE, *_RE_EXPORTS):
            exported = _EMITTERS if node.module == EVENTS_MODULE else _RE_EXPORTS[node.module]
            for alias in node.names:
                if alias.name in exported:
                    direct[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module == EVENTS_MODULE.rsplit(".", 1)[0]:
            modules |= {alias.asname or alias.name for alias in node.names if alias.name == "events"}
    return direct, modules


def _emitter_name(func: ast.expr, direct: dict[str, str], modules: set[str]) -> str | None:
    if isinstance(func, ast.Name):
        return direct.get(func.id)
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in modules:
        return func.attr if func.attr in _EMITTERS else None
    return None


def _render(node: ast.expr, constants: dict[str, str]) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name) and node.id in constants:
        return constants[node.id]
    if isinstance(node, ast.JoinedStr):
        return "".join(_render_part(part) for part in node.values)
    return f"<{ast.unparse(node)}>"


def _render_part(part: ast.expr) -> str:
    """A piece of an f-string: its text, or `<expression>` for what is filled in at run time."""
    if isinstance(part, ast.Constant):
        return str(part.value)
    if isinstance(part, ast.FormattedValue):
        return f"<{ast.unparse(part.value)}>"
    return f"<{ast.unparse(part)}>"


def _data_fields(node: ast.expr, function: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[str, ...]:
    """The keys of the dict an `envelope` call sends: a literal, or a name assigned one in the function."""
    if isinstance(node, ast.Dict):
        return _keys(node)
    if isinstance(node, ast.Name):
        for statement in ast.walk(function):
            if (
                isinstance(statement, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == node.id for t in statement.targets)
                and isinstance(statement.value, ast.Dict)
            ):
                return _keys(statement.value)
    return ()


def _keys(node: ast.Dict) -> tuple[str, ...]:
    return tuple(k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str))


def _dict_keys_in(source: str, function_name: str, variable: str) -> tuple[str, ...]:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == function_name:
            found = _data_fields(ast.Name(id=variable), node)
            if found:
                return found
    raise LookupError(f"controlplane/service/events.py: {function_name} no longer builds a dict named {variable}")
