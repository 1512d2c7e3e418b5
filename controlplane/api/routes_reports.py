"""Report routes: fleet utilization, waiting, fairness, evictions, cost and utilization over time."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Query

from controlplane.api.responses import AUTHENTICATED, declare
from controlplane.api.security import Caller, Ctx
from controlplane.service import report_cost as money
from controlplane.service import report_over_time as over_time
from controlplane.service import report_waits as waits
from controlplane.service import reports as svc
from controlplane.service.constraints import rules
from controlplane.service.report_accounting import MAX_RANGE

router = APIRouter(prefix="/v1", tags=["reports"], responses=AUTHENTICATED)

# What JSON Schema cannot say about two parameters: stated under `x-rules` (see `constraints`).
_WINDOW = {"window": f"`to` is after `from` and at most {MAX_RANGE.days} days later"}
WINDOW_RULES = rules(**_WINDOW)
BUCKET_RULES = rules(
    **_WINDOW,
    buckets=f"with `bucket`, the range holds at most {over_time.MAX_BUCKETS} buckets (`to` - `from` <= "
    f"{over_time.MAX_BUCKETS} x `bucket`)",
)


@router.get(
    "/reports/utilization", response_model=svc.UtilizationReport, responses=declare(422), openapi_extra=WINDOW_RULES
)
def utilization(
    who: Caller,
    ctx: Ctx,
    start: Annotated[datetime, Query(alias="from", description="start of the range (inclusive); naive = UTC")],
    end: Annotated[
        datetime,
        Query(
            alias="to", description=f"end of the range (exclusive): after `from`, at most {MAX_RANGE.days} days later"
        ),
    ],
    group_by: Annotated[svc.GroupBy, Query(description="what one row of the report is")] = svc.GroupBy.TEAM,
    top: Annotated[
        int, Query(ge=0, le=svc.MAX_TOP, description="how many of the idlest runs to list")
    ] = svc.DEFAULT_TOP,
) -> svc.UtilizationReport:
    """Allocated, used, idle, unmeasured and reclaimed GPU-hours per group; a team token sees
    only its own team's runs."""
    return svc.utilization(ctx.uow_factory(), who, start, end, group_by, ctx.clock(), top)


From = Annotated[datetime, Query(alias="from", description="start of the range (inclusive); naive = UTC")]
To = Annotated[
    datetime,
    Query(alias="to", description=f"end of the range (exclusive): after `from`, at most {MAX_RANGE.days} days later"),
]
Bucket = Annotated[
    int | None,
    Query(
        ge=over_time.MIN_BUCKET,
        le=92 * 86400,
        description="bucket length in seconds (at most 1,000 buckets); default: a round size giving 24 or more",
    ),
]


@router.get("/reports/waiting", response_model=waits.WaitingReport, responses=declare(422), openapi_extra=WINDOW_RULES)
def waiting(who: Caller, ctx: Ctx, start: From, end: To) -> waits.WaitingReport:
    """p50/p95/max wait from submission to first admission per team, queue and gang size, for
    workloads submitted in the range; those never admitted count with their wait so far."""
    return waits.waiting(ctx.uow_factory(), who, start, end, ctx.clock())


@router.get(
    "/reports/fairness", response_model=over_time.FairnessReport, responses=declare(422), openapi_extra=BUCKET_RULES
)
def fairness(
    who: Caller,
    ctx: Ctx,
    start: From,
    end: To,
    bucket: Bucket = None,
    by: Annotated[Literal["queue", "team"], Query(description="one row per queue or per team")] = "queue",
) -> over_time.FairnessReport:
    """Per bucket, each queue's (or team's) share of the fleet's allocated GPU-hours next to its
    entitlement (guarantee plus weight share of the rest, as the scheduler's fair share)."""
    return over_time.fairness(ctx.uow_factory(), who, start, end, ctx.clock(), by, bucket)


@router.get(
    "/reports/evictions", response_model=money.EvictionReport, responses=declare(422), openapi_extra=WINDOW_RULES
)
def evictions(who: Caller, ctx: Ctx, start: From, end: To) -> money.EvictionReport:
    """Preemptions and reclaims that ended runs in the range, by kind, victim team and beneficiary
    team, with the GPU-hours of work lost and of idle capacity returned."""
    return money.evictions(ctx.uow_factory(), who, start, end, ctx.clock())


@router.get("/reports/cost", response_model=money.CostReport, responses=declare(422), openapi_extra=WINDOW_RULES)
def cost(
    who: Caller,
    ctx: Ctx,
    start: From,
    end: To,
    group_by: Annotated[svc.GroupBy, Query(description="what one row of the report is")] = svc.GroupBy.TEAM,
) -> money.CostReport:
    """GPU-hours x pool price, allocated vs measured vs used, and the money at stake (allocated - used)."""
    return money.cost(ctx.uow_factory(), who, start, end, ctx.clock(), group_by)


@router.get(
    "/reports/timeline", response_model=over_time.TimelineReport, responses=declare(422), openapi_extra=BUCKET_RULES
)
def timeline(
    who: Caller,
    ctx: Ctx,
    start: From,
    end: To,
    bucket: Bucket = None,
    group_by: Annotated[svc.GroupBy, Query(description="what one row of the report is")] = svc.GroupBy.TEAM,
) -> over_time.TimelineReport:
    """The utilization report's figures per time bucket (allocated, used, idle ... GPU-hours)."""
    return over_time.timeline(ctx.uow_factory(), who, start, end, ctx.clock(), group_by, bucket)
