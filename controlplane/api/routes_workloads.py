"""Team routes: submit, list, show and cancel workloads."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query, Response
from pydantic import Field

from controlplane.api.responses import AUTHENTICATED, declare
from controlplane.api.security import Caller, Ctx, Submitter
from controlplane.domain.limits import MAX_OFFSET, MAX_PAGE
from controlplane.domain.model import WorkloadState
from controlplane.service import workloads as svc
from controlplane.service.commands import SubmitWorkload
from controlplane.service.constraints import Strict
from controlplane.service.ports import WorkloadFilter
from controlplane.service.views import WorkloadView

router = APIRouter(prefix="/v1", tags=["workloads"], responses=AUTHENTICATED)


class CancelRequest(Strict):
    reason: str = Field(default="cancelled by user", max_length=200)


@router.post(
    "/workloads",
    status_code=201,
    response_model=WorkloadView,
    responses={
        200: {"model": WorkloadView, "description": "an idempotent retry: the workload created the first time"},
        **declare(400, 404, 409, 413, 422),
    },
)
def submit(
    request: SubmitWorkload,
    who: Submitter,
    ctx: Ctx,
    response: Response,
    idempotency_key: Annotated[str | None, Header(max_length=100)] = None,
) -> WorkloadView:
    if idempotency_key:
        request = request.model_copy(update={"idempotency_key": idempotency_key})
    view, created = svc.submit(
        ctx.uow_factory(), who, request, ctx.subject_prefix, ctx.clock(), ctx.fleet_fit, recheck_token=True
    )
    if not created:
        response.status_code = 200
    return view


@router.get("/workloads", response_model=list[WorkloadView], responses=declare(422))
def list_workloads(
    who: Caller,
    ctx: Ctx,
    queue: Annotated[str | None, Query(max_length=63)] = None,
    state: Annotated[list[WorkloadState] | None, Query(max_length=len(WorkloadState))] = None,
    name: Annotated[str | None, Query(max_length=63)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> list[WorkloadView]:
    flt = WorkloadFilter(None, queue, tuple(str(s) for s in state or ()), name, limit, offset)
    return svc.list_workloads(ctx.uow_factory(), who, flt)


@router.get("/workloads/{workload_id}", response_model=WorkloadView, responses=declare(404))
def get_workload(workload_id: str, who: Caller, ctx: Ctx) -> WorkloadView:
    return svc.get(ctx.uow_factory(), who, workload_id)


@router.post("/workloads/{workload_id}/cancel", response_model=WorkloadView, responses=declare(400, 404, 409, 413, 422))
def cancel_workload(workload_id: str, who: Caller, ctx: Ctx, body: CancelRequest | None = None) -> WorkloadView:
    reason = body.reason if body else "cancelled by user"
    return svc.cancel(ctx.uow_factory(), who, workload_id, reason, ctx.subject_prefix, ctx.clock())
