"""Report routes: fleet utilization over a time range."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query

from controlplane.api.security import Caller, Ctx
from controlplane.service import reports as svc

router = APIRouter(prefix="/v1", tags=["reports"])


@router.get("/reports/utilization", response_model=svc.UtilizationReport)
def utilization(
    who: Caller,
    ctx: Ctx,
    start: Annotated[datetime, Query(alias="from", description="start of the range (inclusive); naive = UTC")],
    end: Annotated[datetime, Query(alias="to", description="end of the range (exclusive); at most 92 days later")],
    group_by: Annotated[str, Query(description="team | queue | cluster | gpu_model")] = "team",
    top: Annotated[int, Query(description="how many of the idlest runs to list (0..100)")] = svc.DEFAULT_TOP,
) -> svc.UtilizationReport:
    """Allocated, used, idle, unmeasured and reclaimed GPU-hours per group; a team token sees
    only its own team's runs."""
    return svc.utilization(ctx.uow_factory(), who, start, end, group_by, ctx.clock(), top)
