"""The dashboard's pages under `/ui`: login, fleet, queues, workloads, idle GPUs, utilization, audit,
events.

Every page reads through the service layer (no SQL here) with bounded queries, as the caller may
see it: a team token sees its own team's queues, workloads, findings, events and utilization, and
another team's workload answers 404 exactly as `GET /v1/workloads/{id}` does.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated
from urllib.parse import parse_qs

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from controlplane.api.security import Ctx, client_address
from controlplane.api.ui import plots
from controlplane.api.ui.render import page, ui_headers
from controlplane.api.ui.session import (
    COOKIE,
    COOKIE_PATH,
    MAX_TOKEN_CHARS,
    Viewer,
    check_same_origin,
    session_cookie,
)
from controlplane.domain.limits import MAX_OFFSET
from controlplane.domain.model import WorkloadState
from controlplane.service import admin, dashboard, dashboard_feed, workloads
from controlplane.service import audit as audit_service
from controlplane.service.metrics import FleetGauges
from controlplane.service.ports import WorkloadFilter
from controlplane.service.ui_sessions import close_session, open_session

router = APIRouter(prefix="/ui", include_in_schema=False)

PAGE_SIZE = 50
MAX_LOGIN_BODY = 4096
# The utilization page's ranges: name -> (bucket, buckets). At most 24 report calls per page.
RANGES = {"6h": (timedelta(minutes=15), 24), "24h": (timedelta(hours=1), 24), "7d": (timedelta(hours=7), 24)}


def _gauges(ctx: Ctx) -> FleetGauges:
    if ctx.gauges is None:
        raise RuntimeError("the dashboard needs the fleet gauges (ApiContext.gauges)")
    return ctx.gauges.read(ctx.clock())


@router.get("", response_class=HTMLResponse)
@router.get("/", response_class=HTMLResponse)
def home() -> Response:
    return RedirectResponse("/ui/fleet", status_code=303, headers=ui_headers())


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request) -> Response:
    return page(request, "login.html", None, None)


@router.post("/login", response_class=HTMLResponse)
async def login(request: Request, ctx: Ctx) -> Response:
    check_same_origin(request)
    body = await request.body()
    if len(body) > MAX_LOGIN_BODY:
        return page(request, "login.html", None, None, status=413, error="the form is too large")
    token = (parse_qs(body.decode("utf-8", "replace")).get("token") or [""])[0].strip()
    if not token:
        return page(request, "login.html", None, None, status=401, error="unknown or revoked token")
    source = client_address(request)
    ctx.auth_failures.check(source)
    opened = None
    if len(token) <= MAX_TOKEN_CHARS:
        opened = await run_in_threadpool(open_session, ctx.uow_factory(), token, ctx.clock(), ctx.session_ttl)
    if opened is None:
        ctx.auth_failures.failed(source)
        return page(request, "login.html", None, None, status=401, error="unknown or revoked token")
    response = RedirectResponse("/ui/fleet", status_code=303, headers=ui_headers())
    max_age = int(ctx.session_ttl.total_seconds())
    response.set_cookie(**session_cookie(request, opened[0], max_age))  # type: ignore[arg-type]
    return response


@router.post("/logout", response_class=HTMLResponse)
def logout(request: Request, ctx: Ctx) -> Response:
    check_same_origin(request)
    session = request.cookies.get(COOKIE)
    if session:  # ended on the server: the cookie is worthless even if a copy of it survives
        close_session(ctx.uow_factory(), session)
    response = RedirectResponse("/ui/login", status_code=303, headers=ui_headers())
    response.delete_cookie(COOKIE, path=COOKIE_PATH, httponly=True, samesite="strict")
    return response


@router.get("/fleet", response_class=HTMLResponse)
def fleet_page(request: Request, who: Viewer, ctx: Ctx) -> Response:
    team = dashboard.team_name(ctx.uow_factory(), who)
    view = dashboard.fleet(admin.list_clusters(ctx.uow_factory()), _gauges(ctx))
    return page(request, "fleet.html", who, team, fleet=view)


@router.get("/queues", response_class=HTMLResponse)
def queues_page(request: Request, who: Viewer, ctx: Ctx) -> Response:
    team = dashboard.team_name(ctx.uow_factory(), who)
    teams = admin.list_tree_nodes(ctx.uow_factory(), "team")
    queue_nodes = admin.list_tree_nodes(ctx.uow_factory(), "queue", None if who.is_admin else who.team_id)
    lines = dashboard.queues(teams, queue_nodes, _gauges(ctx), only=team)
    return page(request, "queues.html", who, team, lines=lines, charts=plots.quota_charts(lines))


@router.get("/workloads", response_class=HTMLResponse)
def workloads_page(
    request: Request,
    who: Viewer,
    ctx: Ctx,
    state: Annotated[WorkloadState | None, Query()] = None,
    queue: Annotated[str | None, Query(max_length=63)] = None,
    name: Annotated[str | None, Query(max_length=63)] = None,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> Response:
    team = dashboard.team_name(ctx.uow_factory(), who)
    flt = WorkloadFilter(None, queue or None, (str(state),) if state else (), name or None, PAGE_SIZE + 1, offset)
    found = workloads.list_workloads(ctx.uow_factory(), who, flt)
    return page(
        request,
        "workloads.html",
        who,
        team,
        items=[listed.workload for listed in found[:PAGE_SIZE]],
        more=len(found) > PAGE_SIZE,
        states=[str(s) for s in WorkloadState],
        state=str(state) if state else "",
        queue=queue or "",
        name=name or "",
        offset=offset,
        page_size=PAGE_SIZE,
    )


@router.get("/workloads/{workload_id}", response_class=HTMLResponse)
def workload_page(request: Request, workload_id: str, who: Viewer, ctx: Ctx) -> Response:
    if len(workload_id) > 64:
        return page(request, "error.html", None, None, status=404, message=f"no workload {workload_id[:64]}...")
    team = dashboard.team_name(ctx.uow_factory(), who)
    view = workloads.get(ctx.uow_factory(), who, workload_id)
    return page(request, "workload.html", who, team, w=view)


@router.get("/idle", response_class=HTMLResponse)
def idle_page(request: Request, who: Viewer, ctx: Ctx) -> Response:
    team = dashboard.team_name(ctx.uow_factory(), who)
    lines = dashboard_feed.idle_findings(ctx.uow_factory(), team)
    history = dashboard_feed.events(ctx.uow_factory(), ctx.subject_prefix, team, 0, 50, idle_only=True)
    return page(request, "idle.html", who, team, lines=lines, history=history)


@router.get("/utilization", response_class=HTMLResponse)
def utilization_page(
    request: Request,
    who: Viewer,
    ctx: Ctx,
    range_: Annotated[str, Query(alias="range", max_length=8, pattern="^(6h|24h|7d)$")] = "24h",
) -> Response:
    team = dashboard.team_name(ctx.uow_factory(), who)
    bucket, buckets = RANGES[range_]
    now = ctx.clock()
    series = dashboard_feed.utilization_series(ctx.uow_factory, who, now, buckets, bucket, now)
    return page(
        request,
        "utilization.html",
        who,
        team,
        series=series,
        ranges=list(RANGES),
        range=range_,
        charts=plots.utilization_charts(series),
    )


@router.get("/audit", response_class=HTMLResponse)
def audit_page(request: Request, who: Viewer, ctx: Ctx) -> Response:
    """The checklist's findings as the caller may see them (`GET /v1/audit`), most severe first."""
    team = dashboard.team_name(ctx.uow_factory(), who)
    now = ctx.clock()
    report = audit_service.audit(ctx.uow_factory, who, ctx.idle_rules, ctx.audit_thresholds, now, None, [])
    return page(request, "audit.html", who, team, report=report)


@router.get("/events", response_class=HTMLResponse)
def events_page(request: Request, who: Viewer, ctx: Ctx) -> Response:
    team = dashboard.team_name(ctx.uow_factory(), who)
    feed = dashboard_feed.events(ctx.uow_factory(), ctx.subject_prefix, team, 0, 100)
    return page(request, "events.html", who, team, feed=feed, last=max((e.seq for e in feed), default=0))


@router.get("/events.json")
def events_json(
    who: Viewer,
    ctx: Ctx,
    after: Annotated[int, Query(ge=0, le=2**62)] = 0,
    limit: Annotated[int, Query(ge=1, le=dashboard_feed.MAX_EVENTS)] = 100,
) -> JSONResponse:
    """What the events page's script polls: events after the last one it has, newest first."""
    team = dashboard.team_name(ctx.uow_factory(), who)
    feed = dashboard_feed.events(ctx.uow_factory(), ctx.subject_prefix, team, after, limit)
    return JSONResponse(
        [
            {
                "seq": e.seq,
                "at": e.at.isoformat(),
                "type": e.type,
                "team": e.team,
                "workload": e.workload,
                "workload_id": e.workload_id,
                "summary": e.summary,
            }
            for e in feed
        ]
    )
