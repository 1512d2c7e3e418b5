"""Report routes: fleet utilization over a time range."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query

from controlplane.api.responses import AUTHENTICATED, declare
from controlplane.api.security import Caller, Ctx
from controlplane.service import reports as svc

router = APIRouter(prefix="/v1", tags=["reports"], responses=AUTHENTICATED)


@router.get("/reports/utilization", response_model=svc.UtilizationReport, responses=declare(422))
def utilization(
    who: Caller,
    ctx: Ctx,
    start: Annotated[datetime, Query(alias="from", description="start of the range (inclusive); naive = UTC")],
    end: Annotated[datetime, Query(alias="to", description="end of the range (exclusive); at most 92 days later")],
    group_by: Annotated[svc.GroupBy, Query(description="what one row of the report is")] = svc.GroupBy.TEAM,
    top: Annotated[
        int, Query(ge=0, le=svc.MAX_TOP, description="how many of the idlest runs to list")
    ] = svc.DEFAULT_TOP,
) -> svc.UtilizationReport:
    """Allocated, used, idle, unmeasured and reclaimed GPU-hours per group; a team token sees
    only its own team's runs."""
    return svc.utilization(ctx.uow_factory(), who, start, end, group_by, ctx.clock(), top)
