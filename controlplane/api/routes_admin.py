"""Admin routes: clusters, the queue tree, priority classes and API tokens."""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from enum import Enum

from fastapi import APIRouter, HTTPException, Request, Response, status

from controlplane.api.decoded import DecodedBodyRoute
from controlplane.api.responses import AUTHENTICATED, declare
from controlplane.api.security import Admin, Caller, Ctx
from controlplane.service import admin as svc
from controlplane.service import auth, nats_identity
from controlplane.service.cluster_specs import ClusterSpec, ClusterUpdate
from controlplane.service.commands import (
    CohortSpec,
    PriorityClassSpec,
    QueueSpec,
    QuotaUpdate,
    TeamSpec,
    TokenSpec,
)
from controlplane.service.fleet_status import FleetStatus, fleet_status
from controlplane.service.kubeconfigs import KubeconfigStore
from controlplane.service.views import ClusterCredential, ClusterView, PriorityClassView, TokenView, TreeNodeView

router = APIRouter(prefix="/v1", route_class=DecodedBodyRoute, responses=AUTHENTICATED)


def _kubeconfigs(request: Request) -> KubeconfigStore | None:
    """Where user kubeconfigs go (set by the composition root on `app.state`); None: not accepted."""
    store: KubeconfigStore | None = getattr(request.app.state, "kubeconfigs", None)
    return store


@dataclass(frozen=True)
class RegisteredCluster(ClusterView):
    nats_credential: str = ""
    """The cluster agent's NATS credential (connect with it as the token). Shown once, stored as a hash."""


@dataclass(frozen=True)
class IssuedClusterCredential:
    credential: str
    """The secret. It is shown once and stored only as a hash."""
    id: str
    cluster: str
    created_at: datetime


@router.post(
    "/clusters",
    status_code=201,
    response_model=RegisteredCluster,
    tags=["fleet"],
    responses=declare(400, 403, 409, 413, 415, 422),
)
def create_cluster(spec: ClusterSpec, who: Admin, ctx: Ctx, request: Request, response: Response) -> RegisteredCluster:
    raw, secret_hash = nats_identity.new_cluster_secret()
    view = svc.create_cluster(
        ctx.uow_factory(), spec, who.token_id, ctx.clock(), _kubeconfigs(request), nats_credential_hash=secret_hash
    )
    response.headers["Cache-Control"] = "no-store"
    return RegisteredCluster(**{f.name: getattr(view, f.name) for f in fields(view)}, nats_credential=raw)


@router.post(
    "/clusters/{ref}/credentials/rotate",
    status_code=201,
    response_model=IssuedClusterCredential,
    tags=["fleet"],
    responses=declare(403, 404, 422),
)
def rotate_cluster_credential(ref: str, who: Admin, ctx: Ctx, response: Response) -> IssuedClusterCredential:
    """Revoke the cluster's NATS credentials and issue a new one (its agent must be given it)."""
    view, raw = nats_identity.rotate_cluster_credential(ctx.uow_factory(), ref, who.token_id, ctx.clock())
    response.headers["Cache-Control"] = "no-store"
    return IssuedClusterCredential(raw, view.id, view.cluster, view.created_at)


@router.get(
    "/clusters/{ref}/credentials",
    response_model=list[ClusterCredential],
    tags=["fleet"],
    responses=declare(403, 404, 422),
)
def list_cluster_credentials(ref: str, who: Admin, ctx: Ctx) -> list[ClusterCredential]:
    return nats_identity.list_cluster_credentials(ctx.uow_factory(), ref)


@router.delete("/clusters/{ref}/credentials", status_code=204, tags=["fleet"], responses=declare(403, 404, 422))
def revoke_cluster_credentials(ref: str, who: Admin, ctx: Ctx) -> Response:
    """Revoke every NATS credential of the cluster: new connections are refused at once, open ones
    are disconnected by the control plane's ingest within about `nats_revocation_poll` seconds (0.25)."""
    nats_identity.revoke_cluster_credentials(ctx.uow_factory(), ref, who.token_id, ctx.clock())
    return Response(status_code=204)


@router.get("/status", response_model=FleetStatus, tags=["fleet"])
def get_status(who: Caller, ctx: Ctx) -> FleetStatus:
    """The fleet at a glance: GPUs per model, allocated of schedulable; each team and queue with its
    pending gangs by reason and gpu-eq used against guarantee and limit (a team token: its own);
    for admins, the scheduler's lease and the outbox."""
    if ctx.gauges is None:
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            "this API process reads no fleet gauges; retry against a full control plane",
            headers={"Retry-After": "5"},
        )
    return fleet_status(ctx.uow_factory, ctx.gauges, who, ctx.clock())


@router.get("/clusters", response_model=list[ClusterView], tags=["fleet"])
def list_clusters(who: Caller, ctx: Ctx) -> list[ClusterView]:
    return svc.list_clusters(ctx.uow_factory())


@router.get("/clusters/{ref}", response_model=ClusterView, tags=["fleet"], responses=declare(404))
def get_cluster(ref: str, who: Caller, ctx: Ctx) -> ClusterView:
    return svc.get_cluster(ctx.uow_factory(), ref)


@router.patch(
    "/clusters/{ref}", response_model=ClusterView, tags=["fleet"], responses=declare(400, 403, 404, 409, 413, 415, 422)
)
def update_cluster(ref: str, update: ClusterUpdate, who: Admin, ctx: Ctx) -> ClusterView:
    return svc.update_cluster(ctx.uow_factory(), ref, update, who.token_id, ctx.clock())


@router.delete("/clusters/{ref}", status_code=204, tags=["fleet"], responses=declare(403, 404, 409))
def delete_cluster(ref: str, who: Admin, ctx: Ctx, request: Request) -> Response:
    svc.delete_cluster(ctx.uow_factory(), ref, who.token_id, ctx.clock(), _kubeconfigs(request))
    return Response(status_code=204)


def _tree_routes(level: str, plural: str, spec_type: type[CohortSpec | TeamSpec | QueueSpec]) -> None:
    tag: list[str | Enum] = ["queue tree"]

    def create(spec: CohortSpec, who: Admin, ctx: Ctx) -> TreeNodeView:
        return svc.create_tree_node(ctx.uow_factory(), level, spec, who.token_id, ctx.clock())

    create.__annotations__["spec"] = spec_type  # the body model differs per level

    def update(ref: str, update: QuotaUpdate, who: Admin, ctx: Ctx) -> TreeNodeView:
        return svc.update_tree_node(ctx.uow_factory(), level, ref, update, who.token_id, ctx.clock())

    def delete(ref: str, who: Admin, ctx: Ctx) -> Response:
        svc.delete_tree_node(ctx.uow_factory(), level, ref, who.token_id, ctx.clock())
        return Response(status_code=204)

    router.add_api_route(
        f"/{plural}",
        create,
        methods=["POST"],
        status_code=201,
        response_model=TreeNodeView,
        tags=tag,
        name=f"create_{level}",
        responses=declare(400, 403, 404, 409, 413, 415, 422),
    )
    router.add_api_route(
        f"/{plural}/{{ref}}",
        update,
        methods=["PATCH"],
        response_model=TreeNodeView,
        tags=tag,
        name=f"update_{level}",
        responses=declare(400, 403, 404, 409, 413, 415, 422),
    )
    router.add_api_route(
        f"/{plural}/{{ref}}",
        delete,
        methods=["DELETE"],
        status_code=204,
        tags=tag,
        name=f"delete_{level}",
        responses=declare(403, 404, 409),
    )


_tree_routes("cohort", "cohorts", CohortSpec)
_tree_routes("team", "teams", TeamSpec)
_tree_routes("queue", "queues", QueueSpec)


@router.get("/cohorts", response_model=list[TreeNodeView], tags=["queue tree"], responses=declare(403))
def list_cohorts(who: Admin, ctx: Ctx) -> list[TreeNodeView]:
    return svc.list_tree_nodes(ctx.uow_factory(), "cohort")


@router.get("/teams", response_model=list[TreeNodeView], tags=["queue tree"], responses=declare(403))
def list_teams(who: Admin, ctx: Ctx) -> list[TreeNodeView]:
    return svc.list_tree_nodes(ctx.uow_factory(), "team")


@router.get("/teams/{ref}", response_model=TreeNodeView, tags=["queue tree"], responses=declare(403, 404))
def get_team(ref: str, who: Admin, ctx: Ctx) -> TreeNodeView:
    return svc.get_tree_node(ctx.uow_factory(), "team", ref)


@router.get("/queues", response_model=list[TreeNodeView], tags=["queue tree"])
def list_queues(who: Caller, ctx: Ctx) -> list[TreeNodeView]:
    """Admins see every queue; a team sees only its own."""
    return svc.list_tree_nodes(ctx.uow_factory(), "queue", None if who.is_admin else who.team_id)


@router.get("/queues/{ref}", response_model=TreeNodeView, tags=["queue tree"], responses=declare(404))
def get_queue(ref: str, who: Caller, ctx: Ctx) -> TreeNodeView:
    queue = svc.get_tree_node(ctx.uow_factory(), "queue", ref)
    if not who.is_admin and queue.parent_id != who.team_id:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no queue {ref}")
    return queue


@router.post(
    "/priority-classes",
    status_code=201,
    response_model=PriorityClassView,
    tags=["priority classes"],
    responses=declare(400, 403, 413, 415, 422),
)
def put_priority_class(spec: PriorityClassSpec, who: Admin, ctx: Ctx) -> PriorityClassView:
    """Create or replace a priority class."""
    return svc.put_priority_class(ctx.uow_factory(), spec, who.token_id, ctx.clock())


@router.get("/priority-classes", response_model=list[PriorityClassView], tags=["priority classes"])
def list_priority_classes(who: Caller, ctx: Ctx) -> list[PriorityClassView]:
    return svc.list_priority_classes(ctx.uow_factory())


@router.delete("/priority-classes/{name}", status_code=204, tags=["priority classes"], responses=declare(403, 404, 409))
def delete_priority_class(name: str, who: Admin, ctx: Ctx) -> Response:
    svc.delete_priority_class(ctx.uow_factory(), name, who.token_id, ctx.clock())
    return Response(status_code=204)


@dataclass(frozen=True)
class IssuedToken:
    token: str
    """The secret. It is shown once and stored only as a hash."""
    id: str
    name: str
    role: str
    team_id: str | None


@router.post(
    "/tokens",
    status_code=201,
    response_model=IssuedToken,
    tags=["tokens"],
    responses=declare(400, 403, 404, 413, 415, 422),
)
def issue_token(spec: TokenSpec, who: Admin, ctx: Ctx) -> IssuedToken:
    view, raw = auth.issue_token(ctx.uow_factory(), spec, who.token_id, ctx.clock())
    return IssuedToken(raw, view.id, view.name, view.role, view.team_id)


@router.get("/tokens", response_model=list[TokenView], tags=["tokens"], responses=declare(403, 404, 422))
def list_tokens(who: Admin, ctx: Ctx, team: str | None = None) -> list[TokenView]:
    return auth.list_tokens(ctx.uow_factory(), team)


@router.delete("/tokens/{token_id}", status_code=204, tags=["tokens"], responses=declare(403, 404))
def revoke_token(token_id: str, who: Admin, ctx: Ctx) -> Response:
    auth.revoke_token(ctx.uow_factory(), token_id, who.token_id, ctx.clock())
    return Response(status_code=204)
