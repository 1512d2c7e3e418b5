"""Who is looking at a dashboard page: the API token, carried by a cookie a login form sets.

A browser cannot send an `Authorization` header when it navigates, so the login form posts the
token once and gets it back as an HttpOnly, SameSite=Strict cookie (Secure over https): scripts
cannot read it and other sites cannot make the browser send it. Every page authenticates that
cookie (or a Bearer header, for scripts) exactly as the API does, on every request, so a revoked
token is sent back to the login page at once. Posts also check that Origin (or Referer) is this
very host: SameSite alone does not cover older browsers or a sibling subdomain.
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlsplit

from fastapi import Depends, Request

from controlplane.api.context import ApiContext
from controlplane.api.security import context
from controlplane.service.auth import authenticate
from controlplane.service.views import Principal

COOKIE = "gpufleet_ui"
COOKIE_PATH = "/ui"
MAX_TOKEN_CHARS = 200


class LoginRequired(Exception):
    """No token, or one that is unknown or revoked: the page answers with the login page."""


class CrossSiteRequest(Exception):
    """A post whose Origin (or Referer) is not this host."""


def presented_token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return request.cookies.get(COOKIE) or None


def viewer(request: Request, ctx: Annotated[ApiContext, Depends(context)]) -> Principal:
    """The caller of a page. Sync on purpose: the token lookup reads SQL (it runs in the thread pool)."""
    raw = presented_token(request)
    found = authenticate(ctx.uow_factory(), raw) if raw and len(raw) <= MAX_TOKEN_CHARS else None
    if found is None:
        raise LoginRequired
    return found


Viewer = Annotated[Principal, Depends(viewer)]


def _origin_of(url: str) -> tuple[str, str] | None:
    parts = urlsplit(url)
    if not parts.scheme or not parts.netloc:
        return None
    return parts.scheme.lower(), parts.netloc.lower()


def check_same_origin(request: Request) -> None:
    """Raise `CrossSiteRequest` unless the post comes from a page of this host (Origin, else Referer).
    A post with neither is refused: every browser that runs the dashboard's forms sends Origin."""
    host = request.headers.get("host", "").lower()
    claimed = request.headers.get("origin") or request.headers.get("referer") or ""
    origin = _origin_of(claimed) if claimed and claimed != "null" else None
    if origin is None or not host or origin[1] != host or origin[0] != request.url.scheme:
        raise CrossSiteRequest


def session_cookie(request: Request, token: str) -> dict[str, object]:
    """The keyword arguments of `Response.set_cookie` for the session."""
    return {
        "key": COOKIE,
        "value": token,
        "path": COOKIE_PATH,
        "httponly": True,
        "samesite": "strict",
        "secure": request.url.scheme == "https",
    }
