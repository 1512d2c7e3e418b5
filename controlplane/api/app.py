"""The FastAPI application: `/v1` REST API, health and readiness."""

from __future__ import annotations

import logging

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from controlplane.api import responses, routes_admin, routes_audit, routes_reports, routes_workloads, ui
from controlplane.api.context import ApiContext
from controlplane.api.decoded import DECODED_BODY
from controlplane.api.edge import Edge
from controlplane.api.request_ids import RequestIds
from controlplane.api.security import scraper
from controlplane.api.submit_route import LeanSubmit
from controlplane.api.text import refuse_nul
from controlplane.domain.limits import MAX_MESSAGE_BYTES
from controlplane.service.auth_limits import TooManyFailures
from controlplane.service.errors import Conflict, Invalid, NotFound, StoreUnavailable, Unauthenticated
from controlplane.service.safejson import MAX_DEPTH, UnsafeJson, decode

MAX_BODY_BYTES = MAX_MESSAGE_BYTES
# Seconds a client should wait before retrying while the database is unavailable.
RETRY_AFTER_SECONDS = 5
log = logging.getLogger(__name__)


def _is_json(content_type: bytes | None) -> bool:
    """FastAPI parses a body as JSON when it says so, and also when it names no type at all."""
    if not content_type:
        return True
    media = content_type.split(b";", 1)[0].strip().lower()
    return media.endswith(b"/json") or media.endswith(b"+json")


_NOT_JSON = (
    "the body is sent as `{media}`; the API takes JSON: send `Content-Type: application/json` "
    "(with curl: -H 'Content-Type: application/json')"
)


def _error(status: int, detail: str, field: str | None = None) -> JSONResponse:
    body: dict[str, object] = {"detail": detail}
    if field is not None:
        body["errors"] = [{"field": field, "message": detail}]
    return JSONResponse(body, status_code=status)


class BodyGuard:
    """Every request body is at most 1 MiB, however it is sent, and JSON bodies are safe JSON.

    The byte count is kept while the body streams in, so `Transfer-Encoding: chunked` (no
    Content-Length) cannot get past the cap (OWASP API4). A JSON body then goes through the shared
    hardened decoder once, so NaN, infinities, `1e309`, deep nesting, duplicate keys and invalid
    UTF-8 get a 422 with a sentence before any route sees them; the body is handed on unchanged, and
    the decoded document with it (in the scope), so a route never parses it again (decoded.py).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
            await _error(413, "request body larger than 1 MiB")(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                await _error(413, "request body larger than 1 MiB")(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        content_type = headers.get(b"content-type")
        if body and not _is_json(content_type):
            if str(scope.get("path", "")).startswith("/v1/"):
                # The API takes JSON only; `curl -d` sends a form type unless told otherwise, and
                # validating the body as a form would answer with a field error that explains nothing.
                media = (content_type or b"").split(b";", 1)[0].strip().decode("latin-1")[:100]
                await _error(415, _NOT_JSON.format(media=media))(scope, receive, send)
                return
        elif body:
            try:
                # Kept for the route (decoded.py): FastAPI validates this document instead of parsing again.
                scope[DECODED_BODY] = decode(body, MAX_BODY_BYTES)
            except UnsafeJson as exc:
                await _error(422, f"body: {exc}", "body")(scope, receive, send)
                return
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


# What holds for every request, besides each operation's schema. Together they state every rule the
# server enforces, so a request they allow is never refused with a 422 (tests/openapi).
DESCRIPTION = (
    "Every request body is JSON (sent as `application/json`, or with no Content-Type) of at most 1 MiB, "
    f"nested at most {MAX_DEPTH} levels deep, with no duplicate "
    "keys and only finite numbers; no text anywhere holds NUL (U+0000), which PostgreSQL cannot store. An "
    "integer may be written `3.0`. Rules JSON Schema cannot express (across fields, sums, unique names) are "
    "stated under `x-rules`, one sentence per rule id. A request that breaks a rule is answered 422 with a "
    "sentence; one that names an object that does not exist 404; one the current state refuses 409."
)

# Responses of the API are per caller and some carry secrets (issued tokens): never cached.
SECURITY_HEADERS = {
    "Cache-Control": "no-store",
    "Pragma": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Resource-Policy": "same-origin",
}
# JSON answers run no script and embed nothing; the interactive docs page is left to its defaults.
API_CSP = "default-src 'none'; frame-ancestors 'none'"
DOCS_PATHS = ("/docs", "/redoc")


class SecurityHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        docs = str(scope.get("path", "")).startswith(DOCS_PATHS)

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers.setdefault(name, value)
                if not docs:
                    headers.setdefault("Content-Security-Policy", API_CSP)
            await send(message)

        await self.app(scope, receive, with_headers)


def _where(loc: tuple[object, ...]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "header", "path")]
    return ".".join(parts) or "request"


def create_app(ctx: ApiContext, lean_submit: bool = True) -> FastAPI:
    """The API. `lean_submit`: submits are answered by `submit_route.LeanSubmit` (False: by the
    FastAPI route alone; the tests compare the two)."""
    app = FastAPI(
        title="gpufleet",
        version="1",
        summary="Control plane for shared GPU fleets: quotas, gangs, placement across clusters.",
        description=DESCRIPTION,
        dependencies=[Depends(refuse_nul)],
    )
    app.state.ctx = ctx
    if lean_submit:  # innermost: after the request id, the headers, the edge and the body guard
        app.add_middleware(LeanSubmit, api=app, ctx=ctx)
    app.add_middleware(BodyGuard)
    # Host names and trusted proxies (edge.py), before a body is read or a route sees the request.
    app.add_middleware(Edge, trusted_hosts=ctx.trusted_hosts, trusted_proxies=ctx.trusted_proxies)
    app.add_middleware(SecurityHeaders)  # outside BodyGuard and Edge: also on their answers
    app.add_middleware(
        RequestIds, metrics=ctx.metrics
    )  # added last, so outermost: every answer and log line has the id

    @app.exception_handler(StoreUnavailable)
    async def _store_unavailable(_: Request, exc: StoreUnavailable) -> JSONResponse:
        log.warning("answering 503: %s", exc)
        return JSONResponse(
            {"detail": "the database is unavailable; nothing was changed, retry shortly"},
            status_code=503,
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        )

    @app.exception_handler(Unauthenticated)
    async def _unauthenticated(_: Request, exc: Unauthenticated) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=401, headers={"WWW-Authenticate": "Bearer"})

    @app.exception_handler(TooManyFailures)
    async def _too_many_failures(_: Request, exc: TooManyFailures) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=429, headers={"Retry-After": str(exc.retry_after)})

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

    exposition = ctx.exposition
    if exposition is not None:
        # Sync: it may read SQL (the fleet gauges), so it runs in the thread pool, not on the loop.
        # Only a metrics or admin token reads it: it names every team's queues, workloads and runs.
        @app.get("/metrics", tags=["health"], include_in_schema=False, dependencies=[Depends(scraper)])
        def metrics() -> Response:
            body, content_type = exposition()
            return Response(body, media_type=content_type)

    app.include_router(routes_admin.router)
    app.include_router(routes_workloads.router)
    app.include_router(routes_reports.router)
    app.include_router(routes_audit.router)
    ui.install(app)  # the web dashboard under /ui
    responses.install(app)
    return app
