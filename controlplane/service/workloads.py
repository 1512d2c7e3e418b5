"""Submitting, reading and cancelling workloads, with ownership checked on every access."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from controlplane.domain.model import (
    Toleration,
    Workload,
    WorkloadKind,
    WorkloadState,
)
from controlplane.service import events
from controlplane.service.commands import SubmitWorkload, gang_minimum
from controlplane.service.errors import UNKNOWN_TOKEN, Conflict, DuplicateKey, Invalid, NotFound, Unauthenticated
from controlplane.service.fleet_fit import FleetFit, refusal_now
from controlplane.service.ids import new_id
from controlplane.service.ports import QUEUED_REASON, WORKLOAD_GROUPS, WORKLOAD_SORTS, UnitOfWork, WorkloadFilter
from controlplane.service.views import Listed, Principal, PriorityClassView, QueueRef, WorkloadView

CANCELLABLE = (WorkloadState.QUEUED, WorkloadState.ADMITTED, WorkloadState.DISPATCHING, WorkloadState.RUNNING)


def emit(
    uow: UnitOfWork, prefix: str, queue: str, event: str, workload_id: str, now: datetime, **extra: object
) -> None:
    """`events.emit`, kept here for the modules that import it from the workload use cases."""
    events.emit(uow, prefix, queue, event, workload_id, now, **extra)


def submit(
    uow: UnitOfWork,
    principal: Principal,
    request: SubmitWorkload,
    prefix: str,
    now: datetime,
    fit: FleetFit | None = None,
    recheck_token: bool = False,
) -> tuple[WorkloadView, bool]:
    """Returns the workload and whether it was created (False: an idempotent retry). `fit` is the
    process's memo of the fleet check; without one the fleet is read afresh. With `recheck_token`
    the principal came from a memo of recent authentications (`auth.PrincipalCache`): its token is
    checked again in this transaction, before anything else is answered (`Unauthenticated`)."""
    token_id = principal.token_id if recheck_token else None
    workload_id, created, view = _create(uow, principal, request, prefix, now, fit, read_back=True, token_id=token_id)
    assert view is not None, workload_id
    return view, created


def create(
    uow: UnitOfWork,
    principal: Principal,
    request: SubmitWorkload,
    prefix: str,
    now: datetime,
    fit: FleetFit | None = None,
) -> tuple[str, bool]:
    """`submit` without reading the workload back (NATS submits answer no one): its id, and whether it
    was created."""
    workload_id, created, _ = _create(uow, principal, request, prefix, now, fit, read_back=False)
    return workload_id, created


class SubmitLookups:
    """The queues and priority classes submits name, each read once per unit of work: a batch of
    NATS submits names the same few again and again. (A fresh one per REST submit.)"""

    def __init__(self, uow: UnitOfWork) -> None:
        self._uow = uow
        self._queues: dict[tuple[str, str | None], QueueRef | None] = {}
        self._classes: dict[str | None, PriorityClassView | None] = {}

    def queue(self, ref: str, token_id: str | None = None) -> QueueRef | None:
        if (ref, token_id) not in self._queues:
            self._queues[ref, token_id] = self._uow.admin.queue_ref(ref, token_id)
        return self._queues[ref, token_id]

    def priority_class(self, name: str | None) -> PriorityClassView | None:
        if name not in self._classes:
            admin = self._uow.admin
            self._classes[name] = admin.get_priority_class(name) if name else admin.default_priority_class()
        return self._classes[name]


@dataclass(frozen=True)
class Prepared:
    """A submit checked against the platform: the workload to add, or why it cannot be taken."""

    queue: QueueRef
    fingerprint: str
    workload: Workload | None
    refusal: NotFound | Conflict | None


def prepare(
    uow: UnitOfWork,
    lookups: SubmitLookups,
    principal: Principal,
    request: SubmitWorkload,
    now: datetime,
    fit: FleetFit | None,
    token_id: str | None = None,
) -> Prepared:
    """Raises `NotFound` for a queue the caller may not use (before any idempotency key is looked up:
    keys are per team). Any other refusal is returned, for the caller to look for a retry first.
    With `token_id`, raises `Unauthenticated` first when that API token is no longer active."""
    queue = lookups.queue(request.queue, token_id)
    if token_id is not None and not (queue.token_active if queue is not None else _token_active(uow, token_id)):
        raise Unauthenticated(UNKNOWN_TOKEN)
    if queue is None or (not principal.is_admin and queue.team_id != principal.team_id):
        raise NotFound(f"unknown queue {request.queue!r}")
    fingerprint = _fingerprint(request)
    try:
        return Prepared(queue, fingerprint, _acceptable(uow, lookups, queue, request, now, fit), None)
    except (NotFound, Conflict) as exc:
        return Prepared(queue, fingerprint, None, exc)


def _token_active(uow: UnitOfWork, token_id: str) -> bool:
    token = uow.tokens.get(token_id)
    return token is not None and token.revoked_at is None


def _create(
    uow: UnitOfWork,
    principal: Principal,
    request: SubmitWorkload,
    prefix: str,
    now: datetime,
    fit: FleetFit | None,
    read_back: bool,
    token_id: str | None = None,
) -> tuple[str, bool, WorkloadView | None]:
    # Few statements on the way (a submit's cost is mostly round trips): the queue with its team in
    # one query, the priority class, the insert, which skips a used idempotency key itself (so the
    # key is looked up only when it was used, or the request is refused), the pod sets and the
    # event. The new workload's view and event data are built from what was written, not read back.
    with uow:
        prepared = prepare(uow, SubmitLookups(uow), principal, request, now, fit, token_id)
        queue, fingerprint = prepared.queue, prepared.fingerprint
        if prepared.workload is None:
            # A retry of a submission that was taken is answered with its workload, even when the
            # same request would be refused now (a priority class deleted, the fleet shrunk).
            if request.idempotency_key:
                existing = uow.workloads.by_idempotency_key(queue.team_id, request.idempotency_key)
                if existing is not None:
                    return _replay(uow, request.idempotency_key, existing, fingerprint, read_back)
            assert prepared.refusal is not None
            raise prepared.refusal
        workload = prepared.workload
        try:
            uow.workloads.add(
                workload,
                container=request.container,
                labels=request.labels,
                serving=request.serving_declaration(),
                idempotency_key=request.idempotency_key,
                fingerprint=fingerprint,
                now=now,
            )
        except DuplicateKey:
            assert request.idempotency_key is not None
            winner = uow.workloads.by_idempotency_key(queue.team_id, request.idempotency_key)
            assert winner is not None
            return _replay(uow, request.idempotency_key, winner, fingerprint, read_back)
        view = new_workload_view(workload, queue, request, now)
        events.emit_view(uow, prefix, "queued", view, now)
        uow.commit()
    return workload.id, True, view if read_back else None


def _acceptable(
    uow: UnitOfWork,
    lookups: SubmitLookups,
    queue: QueueRef,
    request: SubmitWorkload,
    now: datetime,
    fit: FleetFit | None,
) -> Workload:
    """The new workload, or why it cannot be taken: `NotFound` for a priority class that does not
    exist, `Conflict` when the platform as it stands cannot take it (no default class; no pool could
    ever hold it). Neither is the request's fault alone, so neither is a 422: the OpenAPI states
    every rule of a request by itself."""
    pc = lookups.priority_class(request.priority_class)
    if pc is None:
        if request.priority_class:
            raise NotFound(f"unknown priority class {request.priority_class!r}")
        raise Conflict("no priority class given and the platform has no default priority class")
    workload = _to_domain(new_id("wl"), queue.team_id, queue.id, pc.name, pc.value, request, now)
    reason = fit.refusal(uow, workload) if fit is not None else refusal_now(uow, workload)
    if reason is not None:
        raise Conflict(reason)
    return workload


def _replay(
    uow: UnitOfWork, key: str, existing: tuple[str, str], fingerprint: str, read_back: bool
) -> tuple[str, bool, WorkloadView | None]:
    replayed = replayed_id(key, existing, fingerprint)
    return replayed, False, uow.workloads.view(replayed) if read_back else None


def new_workload_view(workload: Workload, queue: QueueRef, request: SubmitWorkload, now: datetime) -> WorkloadView:
    """The view of a workload just added (`WorkloadRepository.add`), equal to what reading it back
    would give: values as the columns return them (floats as floats, times in UTC)."""
    at = now.astimezone(UTC)
    return WorkloadView(
        id=workload.id,
        name=workload.name,
        team=queue.team,
        queue=queue.name,
        priority_class=workload.priority_class,
        priority=workload.priority,
        kind=str(workload.kind),
        state=WorkloadState.QUEUED.value,
        reason=QUEUED_REASON,
        queue_position=None,
        min_available=workload.min_available,
        requires_isolation=workload.requires_isolation,
        pod_sets=[
            {
                "name": p.name,
                "replicas": p.replicas,
                "gpus": p.gpus,
                "mig_profile": p.mig_profile,
                "gpu_fraction": _float(p.gpu_fraction),
                "cpu_millis": p.cpu_millis,
                "memory_mib": p.memory_mib,
                "gpu_models": list(p.gpu_models),
                "min_replicas": p.min_replicas,
            }
            for p in workload.pod_sets
        ],
        duration_seconds=_float(workload.duration_seconds),
        max_runtime_seconds=_float(workload.max_runtime_seconds),
        spot=workload.spot,
        same_pool=workload.same_pool,
        idempotency_key=request.idempotency_key,
        labels=dict(request.labels),
        created_at=at,
        updated_at=at,
        finished_at=None,
        cluster=None,
        nodes=[],
        runs=[],
        reason_detail=None,
        serving=request.serving_declaration(),
    )


def _float(value: float | None) -> float | None:
    return None if value is None else float(value)


def _fingerprint(request: SubmitWorkload) -> str:
    body = request.model_dump(mode="json", exclude={"idempotency_key"})
    if body.get("serving") is None:
        # A request without `serving` hashes as it did before the field existed: a retry that spans
        # the upgrade still matches its first submission.
        body.pop("serving", None)
    canonical = json.dumps(body, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def replayed_id(key: str, existing: tuple[str, str], fingerprint: str) -> str:
    """The workload a retried submission created, if the retry repeats the same request."""
    workload_id, stored = existing
    if stored != fingerprint:
        raise Conflict(f"idempotency key {key!r} was already used for a different request (workload {workload_id})")
    return workload_id


def _to_domain(
    workload_id: str,
    team_id: str,
    queue_id: str,
    pc_name: str,
    priority: int,
    request: SubmitWorkload,
    now: datetime,
) -> Workload:
    pod_sets = tuple(p.to_pod_set() for p in request.pod_sets)
    isolation = request.requires_isolation
    if isolation is None:
        isolation = request.kind is WorkloadKind.INFERENCE
    return Workload(
        id=workload_id,
        team_id=team_id,
        queue_id=queue_id,
        name=request.name,
        priority_class=pc_name,
        priority=priority,
        kind=request.kind,
        pod_sets=pod_sets,
        min_available=gang_minimum(request.pod_sets, request.min_available),
        requires_isolation=isolation,
        tolerations=tuple(Toleration(t.key, t.operator, t.value, t.effect) for t in request.tolerations),
        duration_seconds=request.duration_seconds,
        max_runtime_seconds=request.max_runtime_seconds,
        spot=request.spot,
        same_pool=request.same_pool,
        created_seq=int(now.timestamp() * 1_000_000),
    )


def _owned(uow: UnitOfWork, principal: Principal, workload_id: str) -> WorkloadView:
    head = uow.workloads.head(workload_id)
    if head is None or (not principal.is_admin and head.team_id != principal.team_id):
        raise NotFound(f"no workload {workload_id}")
    view = uow.workloads.view(workload_id)
    assert view is not None
    return view


def get(uow: UnitOfWork, principal: Principal, workload_id: str) -> WorkloadView:
    with uow:
        return _owned(uow, principal, workload_id)


def list_workloads(uow: UnitOfWork, principal: Principal, flt: WorkloadFilter, team: str | None = None) -> list[Listed]:
    """Summaries, newest first (pod sets and counts: `GET /v1/workloads/{id}` has the runs); with
    `team` (a name or id), only that team's. As with `queue`, a team that does not exist has
    none; a team's token lists none of another team's (so it cannot tell whether that team
    exists)."""
    if flt.sort not in WORKLOAD_SORTS:
        raise Invalid(f"sort by one of {', '.join(WORKLOAD_SORTS)}")
    if not principal.is_admin:
        flt = replace(flt, team_id=principal.team_id)
    with uow:
        if team is not None:
            node = uow.admin.get_tree_node("team", team)
            if node is None or (not principal.is_admin and node.id != principal.team_id):
                return []
            flt = replace(flt, team_id=node.id)
        return uow.workloads.list(flt)


def count_workloads(uow: UnitOfWork, principal: Principal, flt: WorkloadFilter, by: str) -> dict[str, int]:
    """How many workloads the caller may see match `flt`, per state, queue, team or priority class."""
    if by not in WORKLOAD_GROUPS:
        raise Invalid(f"group by one of {', '.join(WORKLOAD_GROUPS)}")
    if not principal.is_admin:
        flt = replace(flt, team_id=principal.team_id)
    with uow:
        return uow.workloads.counts(flt, by)


def cancel(
    uow: UnitOfWork, principal: Principal, workload_id: str, reason: str, prefix: str, now: datetime
) -> WorkloadView:
    with uow:
        view = _owned(uow, principal, workload_id)
        if view.state == WorkloadState.CANCELLED:
            return view
        if WorkloadState(view.state).terminal:
            raise Conflict(f"workload {workload_id} already {view.state}")
        # Locked before its live run is read: a scheduler or a rescue that ends that run and
        # admits another in between would otherwise leave the new run live under a cancelled workload.
        uow.workloads.lock([workload_id])
        head = uow.workloads.head(workload_id)
        assert head is not None
        if not uow.workloads.set_state(workload_id, CANCELLABLE, WorkloadState.CANCELLED, reason, now):
            raise Conflict(f"workload {workload_id} changed while cancelling; retry")
        if head.live_run_id is not None:
            uow.runs.set_state(head.live_run_id, ("admitted", "dispatching", "running"), "cancelled", reason, now)
        emit(uow, prefix, view.queue, "cancelled", workload_id, now, reason=reason)
        uow.commit()
        result = uow.workloads.view(workload_id)
    assert result is not None
    return result
