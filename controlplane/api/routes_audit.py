"""The audit route: the fleet against the GPU-fleet checklist (`gpufleet audit`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from controlplane.api.responses import AUTHENTICATED, declare
from controlplane.api.security import Caller, Ctx
from controlplane.core.audit import Rule, Severity
from controlplane.service import audit as svc

router = APIRouter(prefix="/v1", tags=["audit"], responses=AUTHENTICATED)


@router.get("/audit", response_model=svc.AuditReport, responses=declare(422))
def audit(
    who: Caller,
    ctx: Ctx,
    min_severity: Annotated[
        Severity | None, Query(description="only findings at least this severe (info < warning < high < critical)")
    ] = None,
    rule: Annotated[
        list[Rule] | None,
        Query(max_length=len(Rule), description="only these rule ids (repeat the parameter for several)"),
    ] = None,
) -> svc.AuditReport:
    """One finding per broken rule of the checklist, most severe first, with the objects concerned,
    the evidence and the fix. A team token sees its own team's findings and the fleet findings that
    name only pools, clusters and priority classes; an admin sees all."""
    return svc.audit(
        ctx.uow_factory,
        who,
        ctx.idle_rules,
        ctx.audit_thresholds,
        ctx.clock(),
        min_severity.value if min_severity is not None else None,
        [r.value for r in rule or ()],
    )
