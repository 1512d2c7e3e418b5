"""Bearer-token authentication and the admin role check.

A presented credential that fails counts against its client address (`ctx.auth_failures`); past
the limit, the address gets a 429 with Retry-After before its credential is even looked up.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from controlplane.api.context import ApiContext
from controlplane.service.auth import authenticate, authorize_scrape, missing_token_reason
from controlplane.service.auth_limits import TooManyFailures
from controlplane.service.errors import UNKNOWN_TOKEN
from controlplane.service.views import Principal

bearer = HTTPBearer(auto_error=False, description="a gpufleet API token (gpf_...)")


async def context(request: Request) -> ApiContext:
    # async: a plain lookup, so FastAPI runs it on the event loop instead of in a worker thread
    ctx: ApiContext = request.app.state.ctx
    return ctx


def client_address(request: Request) -> str:
    """The client's address: the peer, or what a trusted proxy said it forwarded for (edge.py)."""
    return request.client.host if request.client is not None else ""


def principal(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ctx: Annotated[ApiContext, Depends(context)],
) -> Principal:
    if not credentials:
        raise _unauthenticated(missing_token_reason(request.headers.get("authorization")))
    source = client_address(request)
    ctx.auth_failures.check(source)
    found = authenticate(ctx.uow_factory(), credentials.credentials)
    if found is None:
        ctx.auth_failures.failed(source)
        raise _unauthenticated(UNKNOWN_TOKEN)
    return found


async def submitter(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ctx: Annotated[ApiContext, Depends(context)],
) -> Principal:
    """`principal` from the memo of recent authentications: only for a route that checks the token
    again in its own transaction (the submit route: `SubmitItem(recheck_token=True)`)."""
    raw = credentials.credentials if credentials else None
    return await remembered_principal(ctx, client_address(request), raw, request.headers.get("authorization"))


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, as `bearer` (HTTPBearer without
    auto_error) reads it: None for no header, another scheme or no token."""
    scheme, _, token = (authorization or "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


async def remembered_principal(ctx: ApiContext, source: str, raw: str | None, authorization: str | None) -> Principal:
    """The caller of a submit (`submitter`, and the lean submit route): on the event loop when the
    token is remembered; its lookup otherwise goes to a worker thread. 401 (HTTPException) or 429
    (TooManyFailures) as `principal`."""
    if not raw:
        raise _unauthenticated(missing_token_reason(authorization))
    ctx.auth_failures.check(source)
    found = ctx.principals.remembered(raw)
    if found is None:
        found = await run_in_threadpool(ctx.principals.authenticate, ctx.uow_factory, raw)
    if found is None:
        ctx.auth_failures.failed(source)
        raise _unauthenticated(UNKNOWN_TOKEN)
    return found


def scraper(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ctx: Annotated[ApiContext, Depends(context)],
) -> None:
    """The reader of /metrics: a token of role metrics or admin (`authorize_scrape`). `credentials`
    declares the scheme in the OpenAPI; the header itself is what `authorize_scrape` reads."""
    authorization = request.headers.get("authorization")
    verdict = authorize_scrape(ctx.uow_factory, ctx.auth_failures, client_address(request), authorization)
    if verdict.status == status.HTTP_429_TOO_MANY_REQUESTS:
        raise TooManyFailures(verdict.retry_after or 1)
    if verdict.status == status.HTTP_401_UNAUTHORIZED:
        raise _unauthenticated(verdict.detail)
    if verdict.status != status.HTTP_200_OK:
        raise HTTPException(verdict.status, verdict.detail)


def _unauthenticated(reason: str) -> HTTPException:
    return HTTPException(status.HTTP_401_UNAUTHORIZED, reason, headers={"WWW-Authenticate": "Bearer"})


def admin(who: Annotated[Principal, Depends(principal)]) -> Principal:
    if not who.is_admin:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "this operation needs an admin token")
    return who


Caller = Annotated[Principal, Depends(principal)]
Submitter = Annotated[Principal, Depends(submitter)]
Admin = Annotated[Principal, Depends(admin)]
Ctx = Annotated[ApiContext, Depends(context)]
