"""Text the API stores must fit every backend: PostgreSQL text and jsonb cannot hold NUL (U+0000).

Without this check a NUL in a body, a path or a query string reaches PostgreSQL, which raises, and the
client gets a 500 (SQLite stores it, so the same request would succeed there). Refused here with a 422
naming the field, alike on both backends."""

from __future__ import annotations

import re

from fastapi import Request
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute

MESSAGE = "text may not contain NUL (\\u0000) characters"
# In JSON text a NUL can only be the escape `\u0000` (a raw one is not valid JSON); an escaped backslash
# before it (`\\u0000`) is the six characters `\u0000`, which are harmless.
_ESCAPED_NUL = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")


async def refuse_nul(request: Request) -> None:
    """An app-wide dependency: 422 for a NUL in a path parameter, a query parameter the route reads, or
    the JSON body of a route that takes one. What a route does not read cannot reach the database."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute):
        return
    errors: list[dict[str, object]] = []
    for name, value in request.path_params.items():
        if "\x00" in str(value):
            errors.append({"loc": ("path", name), "msg": MESSAGE, "type": "value_error"})
    read = _query_names(route.dependant)
    for name, value in request.query_params.multi_items():
        if name in read and "\x00" in value:
            errors.append({"loc": ("query", name), "msg": MESSAGE, "type": "value_error"})
    if route.body_field is not None and has_escaped_nul(await request.body()):
        errors.append({"loc": ("body",), "msg": MESSAGE, "type": "value_error"})
    if errors:
        raise RequestValidationError(errors)


def has_escaped_nul(body: bytes) -> bool:
    """Whether a JSON body holds a NUL (which it can only write as an escape)."""
    return _ESCAPED_NUL.search(body) is not None


def _query_names(dependant: Dependant) -> set[str]:
    names = {param.alias for param in dependant.query_params}
    for dependency in dependant.dependencies:
        names |= _query_names(dependency)
    return names
