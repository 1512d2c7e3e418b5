"""`POST /v1/workloads` without FastAPI's per-request machinery: the hot path of the API.

FastAPI answers a submit by matching it against every route, solving six dependencies (the NUL
check, the bearer scheme, the context, the submitter, the header, the body) and validating the
view it returns before serializing it: about a third of a submit's CPU before group commit, more
than half after. This ASGI step, innermost of the API's middlewares (so the request id, the security
headers, the edge checks and the body guard have all run), answers the same requests with the same
rules in the same order, each from its one home:

1. a NUL in the body: 422 (`text.refuse_nul`'s pattern and message);
2. the caller: 401 / 429 (`security.remembered_principal`, the submit route's dependency);
3. the `Idempotency-Key` header (at most 100 characters) and the body (`SubmitWorkload`),
   their errors together in one 422, as FastAPI reports them;
4. the submit itself, through group commit (`routes_workloads.submit_workload`).

Errors are answered by the app's own exception handlers, so every answer is what the FastAPI route
gives (tests/integration/test_submit_route.py compares them); the route stays declared there, for
the OpenAPI document and for any request this step does not take (another method or path).
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import Field, TypeAdapter, ValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from controlplane.api.context import ApiContext
from controlplane.api.decoded import DECODED_BODY
from controlplane.api.routes_workloads import router, submit_workload
from controlplane.api.security import bearer_token, remembered_principal
from controlplane.api.text import MESSAGE, has_escaped_nul
from controlplane.service.commands import SubmitWorkload
from controlplane.service.views import WorkloadView

PATH = "/v1/workloads"
_KEY = TypeAdapter(Annotated[str, Field(max_length=100)])  # as the route declares the header
_VIEW = TypeAdapter(WorkloadView)


class LeanSubmit:
    def __init__(self, app: ASGIApp, api: FastAPI, ctx: ApiContext) -> None:
        self.app = app
        self.api = api
        self.ctx = ctx
        # The route this step answers for (FastAPI keeps included routers nested: read it from its own).
        self.route = next(
            r for r in router.routes if isinstance(r, APIRoute) and r.path == PATH and "POST" in (r.methods or set())
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != PATH:
            await self.app(scope, receive, send)
            return
        scope["route"] = self.route  # the request's metrics and log line name the route, as routed
        scope["app"] = self.api
        request = Request(scope, receive)
        try:
            response = await self._submit(request)
        except Exception as exc:
            response = await self._answer_error(request, exc)
        await response(scope, receive, send)

    async def _submit(self, request: Request) -> Response:
        scope = request.scope
        document = scope.get(DECODED_BODY)
        if has_escaped_nul(await request.body()):
            raise RequestValidationError([{"loc": ("body",), "msg": MESSAGE, "type": "value_error"}])
        headers = request.headers
        authorization = headers.get("authorization")
        client = scope.get("client")
        who = await remembered_principal(
            self.ctx, client[0] if client else "", bearer_token(authorization), authorization
        )
        errors: list[Any] = []
        key = headers.get("idempotency-key")
        try:
            key = _KEY.validate_python(key) if key is not None else None
        except ValidationError as exc:
            errors.extend({**e, "loc": ("header", "idempotency-key", *e["loc"])} for e in exc.errors(include_url=False))
        submit: SubmitWorkload | None = None
        if DECODED_BODY not in scope:  # no body: FastAPI's "Field required"
            errors.append({"type": "missing", "loc": ("body",), "msg": "Field required", "input": None})
        else:
            try:
                # As FastAPI validates a body (from_attributes: its messages for a body not an object).
                submit = SubmitWorkload.model_validate(document, from_attributes=True)
            except ValidationError as exc:
                errors.extend({**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False))
        if errors or submit is None:
            raise RequestValidationError(errors)
        view, created = await submit_workload(self.ctx, who, submit, key)
        return Response(_VIEW.dump_json(view), status_code=201 if created else 200, media_type="application/json")

    async def _answer_error(self, request: Request, exc: Exception) -> Response:
        """The app's handler for `exc`, looked up as Starlette's exception middleware does; an error
        no handler takes goes up to the server-error middleware (a 500), as from any route."""
        handlers = self.api.exception_handlers
        handler = None
        if isinstance(exc, HTTPException):
            handler = handlers.get(exc.status_code)
        if handler is None:
            handler = next((handlers[c] for c in type(exc).__mro__ if c in handlers), None)
        if handler is None:
            raise exc
        answer = handler(request, exc)
        response: Response = await answer if inspect.isawaitable(answer) else answer
        return response
