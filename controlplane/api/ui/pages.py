"""The dashboard's pages under `/ui`: login, fleet, queues, workloads, idle GPUs, utilization, audit,
events.

Every page reads through the service layer (no SQL here) with bounded queries, as the caller may
see it: a team token sees its own team's queues, workloads, findings, events and utilization, and
another team's workload answers 404 exactly as `GET /v1/workloads/{id}` does.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Annotated
from urllib.parse import parse_qs, urlencode

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from controlplane.api.security import Ctx, client_address
from controlplane.api.ui import plots
from controlplane.api.ui.render import page, ui_headers
from controlplane.api.ui.session import (
    COOKIE,
    COOKIE_PATH,
    CSRF_FIELD,
    MAX_TOKEN_CHARS,
    Viewer,
    check_form_token,
    check_same_origin,
    session_cookie,
)
from controlplane.domain.limits import MAX_OFFSET
from controlplane.domain.model import WorkloadState
from controlplane.service import admin, dashboard, dashboard_feed, workloads
from controlplane.service import audit as audit_service
from controlplane.service.errors import NotFound
from controlplane.service.metrics import FleetGauges
from controlplane.service.ports import WorkloadFilter
from controlplane.service.ui_sessions import close_session, open_session
from controlplane.service.workloads import CANCELLABLE

router = APIRouter(prefix="/ui", include_in_schema=False)

PAGE_SIZE = 50
MAX_LOGIN_BODY = 4096
# The utilization page's ranges: name -> (bucket, buckets). One timeline read of at most 24 buckets.
RANGES = {
    "1h": (timedelta(minutes=5), 12),
    "6h": (timedelta(minutes=15), 24),
    "24h": (timedelta(hours=1), 24),
    "7d": (timedelta(hours=7), 24),
    "30d": (timedelta(hours=30), 24),
}


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


@router.get("/fleet/{cluster}/{pool}", response_class=HTMLResponse)
def pool_page(request: Request, cluster: str, pool: str, who: Viewer, ctx: Ctx) -> Response:
    """A node pool's nodes: GPUs, what live runs hold on each, and which workloads."""
    if len(cluster) > 63 or len(pool) > 63:
        raise NotFound("no such node pool")
    team = dashboard.team_name(ctx.uow_factory(), who)
    view = dashboard.pool_nodes(ctx.uow_factory(), who, cluster, pool)
    line = next(
        (
            p
            for c in dashboard.fleet(admin.list_clusters(ctx.uow_factory()), _gauges(ctx)).clusters
            if c.name == view.cluster
            for p in c.pools
            if p.name == pool
        ),
        None,
    )
    return page(request, "pool.html", who, team, view=view, line=line)


@router.get("/queues", response_class=HTMLResponse)
def queues_page(request: Request, who: Viewer, ctx: Ctx) -> Response:
    team = dashboard.team_name(ctx.uow_factory(), who)
    teams = admin.list_tree_nodes(ctx.uow_factory(), "team")
    queue_nodes = admin.list_tree_nodes(ctx.uow_factory(), "queue", None if who.is_admin else who.team_id)
    cohorts = admin.list_tree_nodes(ctx.uow_factory(), "cohort") if who.is_admin else []
    lines = dashboard.queues(teams, queue_nodes, _gauges(ctx), only=team, cohorts=cohorts)
    return page(request, "queues.html", who, team, lines=lines, charts=plots.quota_charts(lines))


# The workload list's orders and groupings, as the page offers them (labels in the template).
SORTS = ("newest", "oldest", "priority", "name", "state", "queue", "team")
GROUPS = ("state", "queue", "team")
MAX_CANCEL_BODY = 2048


@router.get("/workloads", response_class=HTMLResponse)
def workloads_page(
    request: Request,
    who: Viewer,
    ctx: Ctx,
    state: Annotated[list[WorkloadState] | None, Query(max_length=len(WorkloadState))] = None,
    queue: Annotated[str | None, Query(max_length=63)] = None,
    name: Annotated[str | None, Query(max_length=63)] = None,
    sort: Annotated[str, Query(max_length=12, pattern="^(" + "|".join(SORTS) + ")$")] = "newest",
    group: Annotated[str, Query(max_length=12, pattern="^(|" + "|".join(GROUPS) + ")$")] = "",
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> Response:
    """The workloads the caller may see: filtered by states, queue and name, sorted, optionally
    grouped (rows ordered by the group, each group headed by its count), paged on the server. The
    counts are grouped counts in SQL, so they cost the same at 100 or 100,000 workloads."""
    team = dashboard.team_name(ctx.uow_factory(), who)
    states = tuple(dict.fromkeys(str(s) for s in state or ()))
    base = WorkloadFilter(None, queue or None, states, name or None, PAGE_SIZE + 1, offset, sort=group or sort)
    found = workloads.list_workloads(ctx.uow_factory(), who, base)
    # Per state without the state filter: the filter's choices show what each would find.
    by_state = workloads.count_workloads(ctx.uow_factory(), who, replace(base, states=()), "state")
    total = sum(n for s, n in by_state.items() if not states or s in states)
    groups = workloads.count_workloads(ctx.uow_factory(), who, base, group) if group else {}
    query = {"state": list(states), "queue": queue or "", "name": name or "", "sort": sort, "group": group}
    return page(
        request,
        "workloads.html",
        who,
        team,
        items=[listed.workload for listed in found[:PAGE_SIZE]],
        more=len(found) > PAGE_SIZE,
        all_states=[str(s) for s in WorkloadState],
        by_state=by_state,
        total=total,
        groups=groups,
        states=states,
        queue=queue or "",
        name=name or "",
        sort=sort,
        sorts=SORTS,
        group=group,
        group_choices=GROUPS,
        offset=offset,
        page_size=PAGE_SIZE,
        cancellable=[str(s) for s in CANCELLABLE],
        here=f"/ui/workloads?{urlencode(query, doseq=True)}&offset={offset}",
        link=lambda **changes: "/ui/workloads?" + urlencode({**query, **changes}, doseq=True),
    )


@router.get("/workloads/{workload_id}", response_class=HTMLResponse)
def workload_page(request: Request, workload_id: str, who: Viewer, ctx: Ctx) -> Response:
    if len(workload_id) > 64:
        return page(request, "error.html", None, None, status=404, message=f"no workload {workload_id[:64]}...")
    team = dashboard.team_name(ctx.uow_factory(), who)
    view = workloads.get(ctx.uow_factory(), who, workload_id)
    # The GPU model each run got: its placement names pools, the fleet names their models.
    models = {(c.name, p.name): p.gpu_model for c in admin.list_clusters(ctx.uow_factory()) for p in c.pools}
    return page(
        request,
        "workload.html",
        who,
        team,
        w=view,
        models=models,
        cancellable=[str(s) for s in CANCELLABLE],
        here=f"/ui/workloads/{view.id}",
    )


@router.post("/workloads/{workload_id}/cancel", response_class=HTMLResponse)
async def cancel_workload(request: Request, workload_id: str, who: Viewer, ctx: Ctx) -> Response:
    """Cancel from the dashboard: the very service call and ownership check of
    `POST /v1/workloads/{id}/cancel` (another team's workload is 404, a finished one 409), behind
    the session's form token and a same-origin check. Back to the page the form was on."""
    body = await request.body()
    if len(body) > MAX_CANCEL_BODY:
        return page(request, "error.html", None, None, status=413, heading="Refused", message="the form is too large")
    form = parse_qs(body.decode("utf-8", "replace"))
    check_form_token(request, (form.get(CSRF_FIELD) or [""])[0])
    if len(workload_id) > 64:
        raise NotFound(f"no workload {workload_id[:64]}...")
    actor = "an admin" if who.is_admin else "its team"
    await run_in_threadpool(
        workloads.cancel,
        ctx.uow_factory(),
        who,
        workload_id,
        f"cancelled from the dashboard by {actor}",
        ctx.subject_prefix,
        ctx.clock(),
    )
    back = (form.get("back") or [""])[0]
    # Only a dashboard path: never an absolute URL or `//host` (an open redirect).
    if not back.startswith("/ui/") or back.startswith("//") or "\\" in back:
        back = f"/ui/workloads/{workload_id}"
    return RedirectResponse(back, status_code=303, headers=ui_headers())


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
    range_: Annotated[str, Query(alias="range", max_length=8, pattern="^(|1h|6h|24h|7d|30d)$")] = "",
) -> Response:
    """Allocated and used GPU-hours per team over the chosen range. Without a choice: the last day,
    narrowed to 6 h or 1 h when every run of the day falls in it (a young fleet is not a flat line
    at the right edge of a day)."""
    team = dashboard.team_name(ctx.uow_factory(), who)
    now = ctx.clock()
    if not range_:
        spans = {name: RANGES[name][0] * RANGES[name][1] for name in ("1h", "6h", "24h")}
        range_ = dashboard_feed.default_range(ctx.uow_factory(), who, now, spans)
    bucket, buckets = RANGES[range_]
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


EVENT_FAMILIES = ("workload", "idle", "cluster", "report")


@router.get("/events", response_class=HTMLResponse)
def events_page(
    request: Request,
    who: Viewer,
    ctx: Ctx,
    family: Annotated[str, Query(max_length=12, pattern="^(|" + "|".join(EVENT_FAMILIES) + ")$")] = "",
    workload: Annotated[str, Query(max_length=63)] = "",
) -> Response:
    """The newest events, repeats folded into one line with a count, filtered by family and by
    workload name; the page's script adds newer ones with the same filters."""
    team = dashboard.team_name(ctx.uow_factory(), who)
    feed = dashboard_feed.events(
        ctx.uow_factory(), ctx.subject_prefix, team, 0, 100, family=family or None, workload=workload or None
    )
    return page(
        request,
        "events.html",
        who,
        team,
        feed=dashboard_feed.fold_repeats(feed),
        last=max((e.seq for e in feed), default=0),
        families=EVENT_FAMILIES if who.is_admin else ("workload", "idle"),
        family=family,
        workload=workload,
    )


@router.get("/events.json")
def events_json(
    who: Viewer,
    ctx: Ctx,
    after: Annotated[int, Query(ge=0, le=2**62)] = 0,
    limit: Annotated[int, Query(ge=1, le=dashboard_feed.MAX_EVENTS)] = 100,
    family: Annotated[str, Query(max_length=12, pattern="^(|" + "|".join(EVENT_FAMILIES) + ")$")] = "",
    workload: Annotated[str, Query(max_length=63)] = "",
) -> JSONResponse:
    """What the events page's script polls: events after the last one it has, newest first."""
    team = dashboard.team_name(ctx.uow_factory(), who)
    feed = dashboard_feed.events(
        ctx.uow_factory(), ctx.subject_prefix, team, after, limit, family=family or None, workload=workload or None
    )
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
