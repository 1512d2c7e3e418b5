"""The web dashboard under `/ui`: server-rendered pages over the same service layer and tokens as
the REST API (see `pages.py`), its login cookie (`session.py`) and its templates (`render.py`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from controlplane.api.ui import pages
from controlplane.api.ui.render import STATIC_DIR, STATIC_PATH, page, ui_headers
from controlplane.api.ui.session import COOKIE, COOKIE_PATH, CrossSiteRequest, LoginRequired
from controlplane.service.auth_limits import TooManyFailures
from controlplane.service.errors import Conflict, Invalid, NotFound, StoreUnavailable

Handler = Callable[[Request, Exception], Awaitable[Response] | Response]
_TITLES = {
    404: "Not found",
    409: "Not done",
    422: "Not understood",
    429: "Too many failed attempts",
    503: "Try again shortly",
}


def _is_ui(request: Request) -> bool:
    return request.url.path == "/ui" or request.url.path.startswith("/ui/")


def _login_required(request: Request, _: Exception) -> Response:
    if request.url.path.endswith(".json"):  # the feed's script: it goes to the login page itself
        return JSONResponse({"detail": "log in again"}, status_code=401)
    response = RedirectResponse("/ui/login", status_code=303, headers=ui_headers())
    if COOKIE in request.cookies:  # unknown or revoked: forget it
        response.delete_cookie(COOKIE, path=COOKIE_PATH, httponly=True, samesite="strict")
    return response


def _cross_site(request: Request, _: Exception) -> Response:
    return page(request, "error.html", None, None, status=403, heading="Refused", message="cross-site request refused")


def _html_for_ui(app: FastAPI, exc_type: type[Exception], status: int) -> None:
    """Pages answer errors with a page; the API keeps its JSON answers (its handler is kept)."""
    api_handler: Handler | None = app.exception_handlers.get(exc_type)

    async def handler(request: Request, exc: Exception) -> Response:
        if _is_ui(request) and not request.url.path.endswith(".json"):
            if isinstance(exc, RequestValidationError):
                message = "; ".join(
                    f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'query')}: {e.get('msg', '')}"
                    for e in exc.errors()
                )
            elif isinstance(exc, StoreUnavailable):
                message = "the database is unavailable; retry shortly"
            else:
                message = str(exc)
            shown = page(request, "error.html", None, None, status=status, heading=_TITLES[status], message=message)
            if isinstance(exc, TooManyFailures):
                shown.headers["Retry-After"] = str(exc.retry_after)
            return shown
        if api_handler is None:
            raise exc
        answer = api_handler(request, exc)
        return await answer if isinstance(answer, Awaitable) else answer

    app.add_exception_handler(exc_type, handler)


def install(app: FastAPI) -> None:
    """Mount the dashboard on the API app (after the API's own exception handlers are in place)."""
    app.mount(STATIC_PATH, StaticFiles(directory=STATIC_DIR), name="ui-static")
    app.include_router(pages.router)
    app.add_exception_handler(LoginRequired, _login_required)
    app.add_exception_handler(CrossSiteRequest, _cross_site)
    _html_for_ui(app, NotFound, 404)
    _html_for_ui(app, Invalid, 422)
    _html_for_ui(app, Conflict, 409)
    _html_for_ui(app, RequestValidationError, 422)
    _html_for_ui(app, StoreUnavailable, 503)
    _html_for_ui(app, TooManyFailures, 429)
