"""Who is looking at a dashboard page: a server-side session, named by a cookie the login sets.

A browser cannot send an `Authorization` header when it navigates, so the login form posts the
token once; the server opens a session (`service/ui_sessions.py`: a random secret, only its hash
in SQL, expiring after `ui_session_ttl`) and hands back the secret, never the token, as an
HttpOnly, SameSite=Strict cookie: scripts cannot read it, other sites cannot make the browser send
it, and it is `Secure` whenever the request came over TLS (directly, or says a trusted proxy:
`api/edge.py`). Every page checks the session on every request, joined to its token, so logging
out, revoking the token or deleting its team sends the browser back to the login page at once.
Scripts may send a Bearer header instead. Posts also check that Origin (or Referer) is this very
host: SameSite alone does not cover older browsers or a sibling subdomain; posts that act (cancel)
also carry a form token derived from the session (`csrf_token`), checked server-side. A wrong
token, cookie or login counts against the client's address (`ctx.auth_failures`).
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Annotated
from urllib.parse import urlsplit

from fastapi import Depends, Request

from controlplane.api.context import ApiContext
from controlplane.api.security import client_address, context
from controlplane.service.auth import authenticate
from controlplane.service.ui_sessions import session_principal
from controlplane.service.views import Principal

COOKIE = "gpufleet_ui"
COOKIE_PATH = "/ui"
MAX_TOKEN_CHARS = 200


class LoginRequired(Exception):
    """No token, or one that is unknown or revoked: the page answers with the login page."""


class CrossSiteRequest(Exception):
    """A post whose Origin (or Referer) is not this host."""


def bearer_token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def viewer(request: Request, ctx: Annotated[ApiContext, Depends(context)]) -> Principal:
    """The caller of a page: a Bearer token, else the session cookie. Sync on purpose: the lookup
    reads SQL (it runs in the thread pool)."""
    token, session = bearer_token(request), request.cookies.get(COOKIE)
    if not token and not session:
        raise LoginRequired
    source = client_address(request)
    ctx.auth_failures.check(source)
    if token:
        found = authenticate(ctx.uow_factory(), token) if len(token) <= MAX_TOKEN_CHARS else None
    else:
        found = session_principal(ctx.uow_factory(), session or "", ctx.clock())
    if found is None:
        ctx.auth_failures.failed(source)
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


# What a session's form token is derived from: a fixed label, so it can never equal the secret itself.
_CSRF_LABEL = b"gpufleet-ui-form-token-v1"
CSRF_FIELD = "csrf"


def csrf_token(request: Request) -> str:
    """The token the dashboard's forms carry: an HMAC of a fixed label keyed by the session's secret
    (the HttpOnly cookie), so only a page rendered for this session knows it, and it changes with
    every login. Empty without a session (a Bearer caller's requests carry no ambient credential)."""
    session = request.cookies.get(COOKIE)
    if not session:
        return ""
    return hmac.new(session.encode(), _CSRF_LABEL, hashlib.sha256).hexdigest()


def check_form_token(request: Request, submitted: str) -> None:
    """Raise `CrossSiteRequest` unless a post that acts for a session carries that session's form
    token (checked in constant time) and comes from this host. A caller with a Bearer header sends
    no ambient credential a forger could use, so only the origin is checked for it."""
    check_same_origin(request)
    if bearer_token(request):
        return
    expected = csrf_token(request)
    if not expected or not hmac.compare_digest(expected.encode(), submitted.encode()):
        raise CrossSiteRequest


def session_cookie(request: Request, secret: str, max_age: int) -> dict[str, object]:
    """The keyword arguments of `Response.set_cookie` for the session `secret`. The scheme is
    https only over TLS or when a trusted proxy says so (edge.py rewrites it, nobody else)."""
    return {
        "key": COOKIE,
        "value": secret,
        "max_age": max_age,
        "path": COOKIE_PATH,
        "httponly": True,
        "samesite": "strict",
        "secure": request.url.scheme == "https",
    }
