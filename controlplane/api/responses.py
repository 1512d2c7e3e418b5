"""What the REST API answers besides success, declared once so the OpenAPI tells the truth.

Every refusal carries the same body: `detail`, one sentence for a person, and on request
validation errors `errors`, one entry per offending field. Routes declare the statuses they can
answer with `declare(...)`; declaring 422 also replaces FastAPI's default `HTTPValidationError`
schema, which describes a body this API never sends. `install` makes the answers FastAPI and
Starlette give on their own (a 422 on a route with no declaration, a 405) match too."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException


class FieldError(BaseModel):
    field: str = Field(description="dotted path of the offending field; `request` for the request as a whole")
    message: str = Field(description="what is wrong with it, as a sentence")


class ErrorBody(BaseModel):
    """The body of every 4xx and 5xx answer of the API."""

    detail: str = Field(description="why the request was refused, as one sentence for a person")
    errors: list[FieldError] = Field(
        default_factory=list, description="on request validation errors (422): one entry per offending field"
    )


class Readiness(BaseModel):
    status: str = Field(description="`ready` or `not ready`")
    checks: dict[str, str] = Field(description="per dependency: `ok` or why it is not")


_RETRY_AFTER = {
    "Retry-After": {"description": "seconds to wait before retrying", "schema": {"type": "string"}},
}
_WWW_AUTHENTICATE = {
    "WWW-Authenticate": {
        "description": "the scheme to authenticate with: `Bearer`",
        "required": True,
        "schema": {"type": "string"},
    },
}

_ERRORS: dict[int, tuple[str, dict[str, Any] | None]] = {
    400: ("the request body is not JSON text in UTF-8", None),
    401: ("no API token, a header that is not `Bearer <token>`, or an unknown or revoked token", _WWW_AUTHENTICATE),
    403: ("the token is not allowed this operation (it needs an admin token)", None),
    404: ("no such object, or the caller's team may not see it", None),
    409: ("the request conflicts with the current state (it exists already, is in use, or changed)", None),
    413: ("the request body is larger than 1 MiB", None),
    415: ("the request body is not sent as JSON (`Content-Type: application/json`)", None),
    422: ("the request is malformed or cannot be accepted; `errors` names each offending field", None),
    429: ("too many failed authentications from this address; retry after `Retry-After` seconds", _RETRY_AFTER),
    503: ("a dependency (the database) is unavailable; retry later", _RETRY_AFTER),
}


def declare(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI declarations of the given error statuses, for `responses=` of a router or a route."""
    declared: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        description, headers = _ERRORS[status]
        declared[status] = {"model": ErrorBody, "description": description}
        if headers is not None:
            declared[status]["headers"] = headers
    return declared


AUTHENTICATED = declare(401, 429, 503)
"""What any route behind a bearer token can answer, whatever it does."""


_DEFAULT_422_SCHEMAS = ("HTTPValidationError", "ValidationError")


def install(app: FastAPI) -> None:
    """Make the answers that FastAPI and Starlette produce by themselves match the declarations."""
    describe_own_validation_errors(app)
    app.add_exception_handler(405, _method_not_allowed)


def allowed_methods(app: FastAPI, path: str) -> set[str]:
    """Every method the published API serves on `path`. Starlette's own 405 lists only the methods
    of the first route whose path matched, though each method of a path is a route of its own."""
    methods: set[str] = set()
    for template, operations in app.openapi()["paths"].items():
        if _path_pattern(template).fullmatch(path):
            methods |= {method.upper() for method in operations}
    return methods


def _path_pattern(template: str) -> re.Pattern[str]:
    """`/v1/queues/{ref}` matches `/v1/queues/` and any one segment."""
    segments = template.split("/")
    return re.compile("/".join("[^/]+" if s.startswith("{") and s.endswith("}") else re.escape(s) for s in segments))


async def _method_not_allowed(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)  # Starlette routes status handlers only HTTP exceptions
    starlette_allow = (exc.headers or {}).get("Allow", "")
    allowed = sorted(allowed_methods(request.app, request.url.path) | {m.strip() for m in starlette_allow.split(",")})
    allowed = [method for method in allowed if method]
    body = ErrorBody(detail=f"{request.method} is not allowed here; use {', '.join(allowed)}")
    return JSONResponse(body.model_dump(), status_code=405, headers={"Allow": ", ".join(allowed)})


def describe_own_validation_errors(app: FastAPI) -> None:
    """FastAPI adds a 422 answer with its `HTTPValidationError` body to every route that takes
    parameters and declares no 422 itself; this API's handler sends `ErrorBody` instead. Rewrite
    those answers, so even a route that forgot `declare(422)` is described truthfully."""
    generate: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        schema = generate()  # FastAPI caches it: the rewrite below runs on the same dict, harmlessly
        for operations in schema.get("paths", {}).values():
            for operation in operations.values():
                answer = operation.get("responses", {}).get("422")
                if answer is not None and "HTTPValidationError" in str(answer.get("content")):
                    operation["responses"]["422"] = {
                        "description": _ERRORS[422][0],
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
                    }
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for name in _DEFAULT_422_SCHEMAS:
            components.pop(name, None)
        body = ErrorBody.model_json_schema(ref_template="#/components/schemas/{model}")
        for name, definition in {**body.pop("$defs", {}), "ErrorBody": body}.items():
            components.setdefault(name, definition)
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
