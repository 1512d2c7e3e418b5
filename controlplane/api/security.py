"""Bearer-token authentication and the admin role check."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from controlplane.api.context import ApiContext
from controlplane.service.auth import authenticate
from controlplane.service.views import Principal

bearer = HTTPBearer(auto_error=False, description="a gpufleet API token (gpf_...)")


async def context(request: Request) -> ApiContext:
    # async: a plain lookup, so FastAPI runs it on the event loop instead of in a worker thread
    ctx: ApiContext = request.app.state.ctx
    return ctx


def principal(
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ctx: Annotated[ApiContext, Depends(context)],
) -> Principal:
    found = authenticate(ctx.uow_factory(), credentials.credentials) if credentials else None
    if found is None:
        raise _unauthenticated()
    return found


async def submitter(
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ctx: Annotated[ApiContext, Depends(context)],
) -> Principal:
    """`principal` from the memo of recent authentications: only for a route that checks the token
    again in its own transaction (the submit route: `workloads.submit(recheck_token=True)`). On the
    event loop when the token is remembered; its lookup otherwise goes to a worker thread."""
    found = None
    if credentials:
        raw = credentials.credentials
        found = ctx.principals.remembered(raw)
        if found is None:
            found = await run_in_threadpool(ctx.principals.authenticate, ctx.uow_factory, raw)
    if found is None:
        raise _unauthenticated()
    return found


def _unauthenticated() -> HTTPException:
    return HTTPException(
        status.HTTP_401_UNAUTHORIZED, "missing, unknown or revoked API token", headers={"WWW-Authenticate": "Bearer"}
    )


def admin(who: Annotated[Principal, Depends(principal)]) -> Principal:
    if not who.is_admin:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "this operation needs an admin token")
    return who


Caller = Annotated[Principal, Depends(principal)]
Submitter = Annotated[Principal, Depends(submitter)]
Admin = Annotated[Principal, Depends(admin)]
Ctx = Annotated[ApiContext, Depends(context)]
