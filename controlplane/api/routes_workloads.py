"""Team routes: submit, list, show and cancel workloads."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query, Response
from pydantic import Field, TypeAdapter

from controlplane.api.context import ApiContext
from controlplane.api.decoded import DecodedBodyRoute
from controlplane.api.paging import CURSOR_PATTERN, encode_page, parse_cursor
from controlplane.api.responses import AUTHENTICATED, declare
from controlplane.api.security import Caller, Ctx, Submitter
from controlplane.domain.limits import MAX_OFFSET, MAX_PAGE, MAX_PAGE_BYTES
from controlplane.domain.model import WorkloadState
from controlplane.service import workloads as svc
from controlplane.service.commands import SubmitWorkload
from controlplane.service.constraints import Strict
from controlplane.service.metrics import Writer
from controlplane.service.ports import WorkloadFilter
from controlplane.service.retries import retrying
from controlplane.service.submit_batch import SubmitItem
from controlplane.service.views import Principal, WorkloadPage, WorkloadSummary, WorkloadView

router = APIRouter(prefix="/v1", route_class=DecodedBodyRoute, tags=["workloads"], responses=AUTHENTICATED)


class CancelRequest(Strict):
    reason: str = Field(default="cancelled by user", max_length=200)


@router.post(
    "/workloads",
    status_code=201,
    response_model=WorkloadView,
    responses={
        200: {"model": WorkloadView, "description": "an idempotent retry: the workload created the first time"},
        **declare(400, 404, 409, 413, 415, 422),
    },
)
async def submit(
    request: SubmitWorkload,
    who: Submitter,
    ctx: Ctx,
    response: Response,
    idempotency_key: Annotated[str | None, Header(max_length=100)] = None,
) -> WorkloadView:
    # The API's submits are answered by `submit_route.LeanSubmit` with these same rules; this route
    # declares the operation in the OpenAPI and answers whatever that step does not take.
    view, created = await submit_workload(ctx, who, request, idempotency_key)
    if not created:
        response.status_code = 200
    return view


async def submit_workload(
    ctx: ApiContext, who: Principal, request: SubmitWorkload, idempotency_key: str | None
) -> tuple[WorkloadView, bool]:
    """A REST submit: the workload, and whether it was created (False: an idempotent retry).
    On the event loop: the database work is the batch's, in its worker thread (group_commit.py)."""
    if idempotency_key:
        request = request.model_copy(update={"idempotency_key": idempotency_key})
    # The principal may come from the memo of recent authentications: its token is checked again in
    # the transaction that writes.
    return await ctx.submits.submit(SubmitItem(who, request, recheck_token=True))


_SUMMARY = TypeAdapter(WorkloadSummary)


@router.get(
    "/workloads",
    response_model=WorkloadPage,
    responses=declare(422),
    description="Workloads, newest first, as summaries (pod sets and counts; `GET /v1/workloads/{id}` shows "
    "the runs). A page holds at most `limit` items and at most 1 MiB: when it ends early or more items "
    "follow, `next` is the `cursor` that continues it under the same filters.",
)
def list_workloads(
    who: Caller,
    ctx: Ctx,
    queue: Annotated[str | None, Query(max_length=63)] = None,
    team: Annotated[
        str | None,
        Query(max_length=63, description="only this team's (a team's token lists another team's as none)"),
    ] = None,
    state: Annotated[list[WorkloadState] | None, Query(max_length=len(WorkloadState))] = None,
    name: Annotated[str | None, Query(max_length=63)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
    cursor: Annotated[
        str | None,
        Query(max_length=60, pattern=CURSOR_PATTERN, description="a page's `next`: go on after its last item"),
    ] = None,
) -> Response:
    after = parse_cursor(cursor) if cursor else None
    # One more than the page: whether a next page exists, without counting.
    flt = WorkloadFilter(None, queue, tuple(str(s) for s in state or ()), name, limit + 1, offset, after)
    rows = svc.list_workloads(ctx.uow_factory(), who, flt, team)
    body, _ = encode_page(rows, limit, MAX_PAGE_BYTES, lambda row: _SUMMARY.dump_json(row.workload))
    return Response(body, media_type="application/json")


@router.get("/workloads/{workload_id}", response_model=WorkloadView, responses=declare(404))
def get_workload(workload_id: str, who: Caller, ctx: Ctx) -> WorkloadView:
    return svc.get(ctx.uow_factory(), who, workload_id)


@router.post(
    "/workloads/{workload_id}/cancel", response_model=WorkloadView, responses=declare(400, 404, 409, 413, 415, 422)
)
def cancel_workload(workload_id: str, who: Caller, ctx: Ctx, body: CancelRequest | None = None) -> WorkloadView:
    reason = body.reason if body else "cancelled by user"
    return retrying(
        Writer.API,
        lambda: svc.cancel(ctx.uow_factory(), who, workload_id, reason, ctx.subject_prefix, ctx.clock()),
        ctx.metrics,
    )
