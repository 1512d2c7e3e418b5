"""Cloud pool autoscaling: buy nodes for gangs that wait for room, give back nodes nobody uses.

`decide` is pure. A queued gang whose pending reason is `no-fit` is tried on a hypothetical fleet: the
real free capacity (live runs subtracted), nodes already on their way (a pool's `scale_target` above
its size) and k extra empty nodes in one cloud pool, k = 1 .. what its `max_size` allows. Of the pools
where the gang then fits, the cheapest per GPU-hour wins, then the one needing the fewest nodes; the
gang's pods take that room, so the next gang does not count on it too. A pool already scaling to the
size a gang needs gets no second request (idempotent across passes, and across dispatcher restarts:
the target is stored). A pool with no live run on any of its nodes for `cooldown` seconds is scaled
down to its `min_size`, never below.

`autoscale_once` is the worker step: read (one transaction), decide, call the clouds (no transaction
open), then record each request (audit log, `scale_target`, event `<prefix>.events.cluster.<c>.scaled`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from controlplane.core.placement import FreeCapacity, Placement, empty_capacity, place_in_cluster
from controlplane.core.snapshot import Snapshot
from controlplane.domain.model import Cluster, Node, NodePool, Workload
from controlplane.service.cloud_ports import CloudProvider
from controlplane.service.cloud_state import CloudClusterRecord, CloudPoolRecord
from controlplane.service.events import envelope
from controlplane.service.fleet_sync import cluster_subject, locator_of
from controlplane.service.ports import UnitOfWorkFactory

log = logging.getLogger(__name__)

DEFAULT_COOLDOWN = 600.0
ACTOR = "autoscaler"


@dataclass(frozen=True)
class ScaleDecision:
    pool_id: str
    cluster: str
    pool: str
    current: int
    target: int
    direction: str  # up | down
    reason: str
    workload_id: str | None = None


@dataclass(frozen=True)
class Plan:
    decisions: tuple[ScaleDecision, ...]
    idle_since: Mapping[str, datetime | None]  # pool id -> new value, only where it changes


def _free_capacity(snapshot: Snapshot, pools_by_id: Mapping[str, NodePool]) -> FreeCapacity:
    free: FreeCapacity = {nid: dict(cap) for nid, cap in empty_capacity(list(snapshot.nodes), pools_by_id).items()}
    for run in snapshot.live_runs:
        for assignment in run.assignments:
            node = free.get(assignment.node_id)
            if node is None:
                continue
            for key, amount in assignment.demand.items():
                node[key] = node.get(key, 0) - amount
    return free


def _take(free: FreeCapacity, placement: Placement) -> None:
    for assignment in placement.assignments:
        node = free[assignment.node_id]
        for key, amount in assignment.demand.items():
            node[key] = node.get(key, 0) - amount


def _extra_nodes(pool: NodePool, start: int, count: int) -> list[Node]:
    return [Node(f"{pool.id}+{i}", pool.cluster_id, pool.id, f"{pool.name}+{i}") for i in range(start, start + count)]


def decide(
    snapshot: Snapshot,
    reasons: Mapping[str, str],
    pools: Sequence[CloudPoolRecord],
    now: datetime,
    cooldown: float,
) -> Plan:
    pools_by_id = snapshot.pools_by_id()
    clusters = {c.id: c for c in snapshot.clusters}
    records = {p.id: p for p in pools if p.id in pools_by_id}
    free = _free_capacity(snapshot, pools_by_id)
    nodes_by_pool: dict[str, list[Node]] = {}
    for node in snapshot.nodes:
        if node.schedulable:
            nodes_by_pool.setdefault(node.pool_id, []).append(node)
    # Nodes already requested (scale_target above the size) count as coming.
    planned: dict[str, int] = {}
    for rec in records.values():
        pool = pools_by_id[rec.id]
        size = max(rec.node_count, rec.scale_target or 0)
        planned[rec.id] = size
        coming = _extra_nodes(pool, 0, size - rec.node_count)
        nodes_by_pool.setdefault(rec.id, []).extend(coming)
        for node in coming:
            free[node.id] = pool.node_capacity()
    pool_of = {node.id: pool_id for pool_id, nodes in nodes_by_pool.items() for node in nodes}

    decisions: list[ScaleDecision] = []
    wanted: set[str] = set()  # pools a waiting gang counts on
    for workload in snapshot.pending:
        if not reasons.get(workload.id, "").startswith("no-fit"):
            continue
        fits_now = _place_anywhere(workload, clusters.values(), nodes_by_pool, free)
        if fits_now is not None:
            _take(free, fits_now)  # fits once nodes on their way arrive: no new request
            wanted.update(pool_of[a.node_id] for a in fits_now.assignments if a.node_id in pool_of)
            continue
        best: tuple[float, int, str, str, Placement, list[Node]] | None = None
        for rec in records.values():
            if rec.max_size is None or planned[rec.id] >= rec.max_size:
                continue
            pool = pools_by_id[rec.id]
            cluster = clusters[pool.cluster_id]
            for k in range(1, rec.max_size - planned[rec.id] + 1):
                extra = _extra_nodes(pool, planned[rec.id] - rec.node_count, k)
                trial_nodes = dict(nodes_by_pool)
                trial_nodes[rec.id] = [*nodes_by_pool.get(rec.id, []), *extra]
                trial_free = dict(free)
                for node in extra:
                    trial_free[node.id] = pool.node_capacity()
                found = place_in_cluster(workload, cluster, trial_nodes, trial_free)
                if isinstance(found, Placement):
                    key = (pool.price_per_gpu_hour, k, cluster.name, pool.name, found, extra)
                    if best is None or key[:4] < best[:4]:
                        best = key
                    break
        if best is None:
            continue
        _, k, cluster_name, pool_name, placement, extra = best
        pool_id = extra[0].pool_id
        rec = records[pool_id]
        nodes_by_pool[pool_id] = [*nodes_by_pool.get(pool_id, []), *extra]
        for node in extra:
            free[node.id] = pools_by_id[pool_id].node_capacity()
            pool_of[node.id] = pool_id
        _take(free, placement)
        planned[pool_id] += k
        wanted.add(pool_id)
        decisions.append(
            ScaleDecision(
                pool_id=pool_id,
                cluster=cluster_name,
                pool=pool_name,
                current=rec.node_count,
                target=planned[pool_id],
                direction="up",
                reason=f"workload {workload.id} waits for room (no-fit); {k} more node(s) in {pool_name} hold it",
                workload_id=workload.id,
            )
        )
    # One request per pool: the last decision for a pool carries the highest target.
    merged: dict[str, ScaleDecision] = {}
    for d in decisions:
        merged[d.pool_id] = d

    idle: dict[str, datetime | None] = {}
    for rec in records.values():
        scaling_up = (rec.scale_target or 0) > rec.node_count
        if rec.busy or rec.id in wanted or scaling_up or rec.node_count <= rec.min_size:
            if rec.idle_since is not None:
                idle[rec.id] = None
            continue
        if rec.idle_since is None:
            idle[rec.id] = now
            continue
        if now - rec.idle_since < timedelta(seconds=cooldown) or rec.scale_target == rec.min_size:
            continue
        idle_for = (now - rec.idle_since).total_seconds()
        merged[rec.id] = ScaleDecision(
            pool_id=rec.id,
            cluster=rec.cluster,
            pool=rec.name,
            current=rec.node_count,
            target=rec.min_size,
            direction="down",
            reason=f"no live run on {rec.name} for {idle_for:.0f}s (cool-down {cooldown:g}s)",
        )
    return Plan(tuple(merged[k] for k in sorted(merged)), idle)


def _place_anywhere(
    workload: Workload, clusters: Iterable[Cluster], nodes_by_pool: Mapping[str, list[Node]], free: FreeCapacity
) -> Placement | None:
    for cluster in clusters:
        found = place_in_cluster(workload, cluster, nodes_by_pool, free)
        if isinstance(found, Placement):
            return found
    return None


@dataclass(frozen=True)
class ScaleOutcome:
    decision: ScaleDecision
    ok: bool
    desired: int = 0
    operation: str = ""
    error: str = ""


async def autoscale_once(
    uow_factory: UnitOfWorkFactory,
    provider_for: Callable[[str], CloudProvider],
    prefix: str,
    clock: Callable[[], datetime],
    cooldown: float = DEFAULT_COOLDOWN,
) -> list[ScaleOutcome]:
    with uow_factory() as uow:
        snapshot = uow.snapshots.load()
        reasons = uow.cloud.pending_reasons()
        pools = uow.cloud.cloud_pools()
        records: dict[str, CloudClusterRecord] = {r.name: r for r in uow.cloud.real_clusters()}
    now = clock()
    plan = decide(snapshot, reasons, pools, now, cooldown)
    if plan.idle_since:
        with uow_factory() as uow:
            for pool_id, since in plan.idle_since.items():
                uow.cloud.set_idle_since(pool_id, since)
            uow.commit()
    outcomes: list[ScaleOutcome] = []
    for decision in plan.decisions:
        record = records[decision.cluster]
        try:
            provider = provider_for(record.provider)
            result = await asyncio.to_thread(provider.scale_pool, locator_of(record), decision.pool, decision.target)
        except Exception as exc:  # refused or failed: logged and audited; tried again next pass
            error = f"{type(exc).__name__}: {exc}"
            log.warning("scaling %s/%s to %d failed: %s", decision.cluster, decision.pool, decision.target, error)
            with uow_factory() as uow:
                detail = {"pool": decision.pool, "target": decision.target, "error": error, "reason": decision.reason}
                uow.audit.record(ACTOR, "cluster.scale-failed", "cluster", record.id, detail, clock())
                uow.commit()
            outcomes.append(ScaleOutcome(decision, False, error=error))
            continue
        at = clock()
        with uow_factory() as uow:
            uow.cloud.set_scale_target(decision.pool_id, result.desired, at)
            data = {
                "cluster": decision.cluster,
                "pool": decision.pool,
                "direction": decision.direction,
                "from": decision.current,
                "requested": decision.target,
                "desired": result.desired,
                "clamped": result.clamped,
                "changed": result.changed,
                "operation": result.operation,
                "reason": decision.reason,
                "workload_id": decision.workload_id,
            }
            uow.audit.record(ACTOR, "cluster.scale", "cluster", record.id, data, at)
            event_id, payload = envelope("cluster.scaled", data, at)
            uow.outbox.add(cluster_subject(prefix, decision.cluster, "scaled"), event_id, payload, at)
            uow.commit()
        outcomes.append(ScaleOutcome(decision, True, result.desired, result.operation))
    return outcomes


__all__ = ["Plan", "ScaleDecision", "ScaleOutcome", "autoscale_once", "decide"]
