"""The REST reference: every path and method of the API's OpenAPI document, with who may call it.

The document is the one the server publishes at /openapi.json, built from an app with no database
(nothing is read until a request comes). Who may call a route comes from what it declares: no
security scheme is public, a declared 403 needs an admin token (security.py's `admin` is the only
source of a 403), anything else any valid token.
"""

from __future__ import annotations

from typing import Any

from controlplane.api.app import create_app
from controlplane.api.context import ApiContext
from docsgen import markdown as md

_METHODS = ("get", "post", "put", "patch", "delete")


def openapi_document() -> dict[str, Any]:
    def no_database() -> Any:
        raise RuntimeError("the reference is generated without a database")

    return create_app(ApiContext(uow_factory=no_database)).openapi()


def rest_reference() -> str:
    return operations_markdown(openapi_document())


def who(operation: dict[str, Any]) -> str:
    if not operation.get("security"):
        return "anyone"
    if "403" in operation.get("responses", {}):
        return "admin token"
    return "any token"


def operations_markdown(document: dict[str, Any]) -> str:
    rows = []
    details: list[str] = []
    for path, operations in document["paths"].items():
        for method in _METHODS:
            operation = operations.get(method)
            if operation is None:
                continue
            label = f"{method.upper()} {path}"
            anchor = _anchor(method, path)
            rows.append(
                [
                    f"[{md.code(label)}](#{anchor})",
                    who(operation),
                    md.cell(operation.get("summary", "")),
                    ", ".join(sorted(operation.get("responses", {}))),
                ]
            )
            details += _operation(label, anchor, operation)
    lines = [md.table(["route", "who", "summary", "answers"], rows), "", *details]
    return "\n".join(lines).rstrip() + "\n"


def _anchor(method: str, path: str) -> str:
    slug = "".join(c if c.isalnum() else "-" for c in f"{method}-{path}".lower())
    return "-".join(part for part in slug.split("-") if part)


def _operation(label: str, anchor: str, operation: dict[str, Any]) -> list[str]:
    lines = [f"### {md.code(label, in_table=False)} {{ #{anchor} }}", ""]
    description = operation.get("description") or operation.get("summary", "")
    lines += [md.docstring(description), "", f"Who: {who(operation)}.", ""]
    parameters = operation.get("parameters", [])
    if parameters:
        rows = [
            [
                md.code(p["name"]),
                p.get("in", ""),
                "yes" if p.get("required") else "",
                md.cell(p.get("description") or _schema_words(p.get("schema", {}))),
            ]
            for p in parameters
        ]
        lines += [md.table(["parameter", "in", "required", "description"], rows), ""]
    body = operation.get("requestBody")
    if body:
        schemas = [_schema_name(content.get("schema", {})) for content in body.get("content", {}).values()]
        lines += [f"Body: {', '.join(md.code(s, in_table=False) for s in schemas)} (JSON).", ""]
    answers = [
        [md.code(status), md.cell(answer.get("description", "")), _answer_schema(answer)]
        for status, answer in sorted(operation.get("responses", {}).items())
    ]
    lines += [md.table(["status", "meaning", "body"], answers), ""]
    return lines


def _answer_schema(answer: dict[str, Any]) -> str:
    content = answer.get("content", {})
    names = [_schema_name(item.get("schema", {})) for item in content.values()]
    return ", ".join(md.code(name) for name in names if name)


def _schema_name(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[-1]
    if schema.get("type") == "array":
        return f"list of {_schema_name(schema.get('items', {}))}"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " or ".join(_schema_name(s) for s in schema[key])
    return str(schema.get("title") or schema.get("type") or "")


def _schema_words(schema: dict[str, Any]) -> str:
    words = [_schema_name(schema)]
    if "enum" in schema:
        words.append("one of " + ", ".join(str(v) for v in schema["enum"]))
    for key, label in (("minimum", "≥"), ("maximum", "≤"), ("maxLength", "length ≤")):
        if key in schema:
            words.append(f"{label} {schema[key]}")
    return "; ".join(word for word in words if word)
