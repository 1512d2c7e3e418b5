"""The FastAPI application: `/v1` REST API, health and readiness."""

from __future__ import annotations

import logging

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from controlplane.api import responses, routes_admin, routes_reports, routes_workloads
from controlplane.api.context import ApiContext
from controlplane.api.text import refuse_nul
from controlplane.service.errors import Conflict, Invalid, NotFound

MAX_BODY_BYTES = 1 << 20
log = logging.getLogger(__name__)


class BodyLimit:
    """Refuse bodies over 1 MiB before reading them (OWASP API4)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            length = dict(scope["headers"]).get(b"content-length")
            if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
                response = JSONResponse({"detail": "request body larger than 1 MiB"}, status_code=413)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _where(loc: tuple[object, ...]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "header", "path")]
    return ".".join(parts) or "request"


def create_app(ctx: ApiContext) -> FastAPI:
    app = FastAPI(
        title="gpufleet",
        version="1",
        summary="Control plane for shared GPU fleets: quotas, gangs, placement across clusters.",
        dependencies=[Depends(refuse_nul)],
    )
    app.state.ctx = ctx
    app.add_middleware(BodyLimit)

    @app.exception_handler(NotFound)
    async def _not_found(_: Request, exc: NotFound) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=404)

    @app.exception_handler(Invalid)
    async def _invalid(_: Request, exc: Invalid) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=422)

    @app.exception_handler(Conflict)
    async def _conflict(_: Request, exc: Conflict) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=409)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {"field": _where(tuple(e.get("loc", ()))), "message": str(e.get("msg", "")).removeprefix("Value error, ")}
            for e in exc.errors()
        ]
        summary = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        return JSONResponse({"detail": summary, "errors": errors}, status_code=422)

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get(
        "/readyz", tags=["health"], response_model=responses.Readiness, responses={503: {"model": responses.Readiness}}
    )
    def readyz() -> JSONResponse:
        failures = {}
        for name, check in ctx.readiness.items():
            try:
                error = check()
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
            if error:
                failures[name] = error
        if failures:
            return JSONResponse({"status": "not ready", "checks": failures}, status_code=503)
        return JSONResponse({"status": "ready", "checks": dict.fromkeys(ctx.readiness, "ok")})

    app.include_router(routes_admin.router)
    app.include_router(routes_workloads.router)
    app.include_router(routes_reports.router)
    responses.install(app)
    return app
