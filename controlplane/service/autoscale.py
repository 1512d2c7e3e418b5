"""Cloud pool autoscaling: buy nodes for gangs that wait for room, give back nodes nobody uses.

`decide` is pure. A queued gang whose pending reason is of kind `no-fit` (or `never-fits`: no
cluster holds it even empty) is tried on a hypothetical fleet: the real free capacity (live runs
subtracted), nodes already on their way (a pool's `scale_target` above its size) and k extra empty
nodes in one cloud pool, k = 1 .. what its `max_size` allows. Of the pools where the gang then fits,
the cheapest per GPU-hour wins, then the one needing the fewest nodes; the gang's pods take that
room, so the next gang does not count on it too. A gang no single pool can hold even at its max size
grows several pools of one cluster, a node at a time, cheapest pool first. A pool already scaling to
the size a gang needs gets no second request (idempotent across passes, and across dispatcher
restarts: the target is stored); a request the cloud has not matched after `request_ttl` seconds is
forgotten. A pool with no live run on any of its nodes for `cooldown` seconds is scaled down to its
`min_size`, never below. A gang that does not fit even with every pool at its max size buys nothing.

`autoscale_once` is the worker step: read (one transaction), decide, call the clouds (no transaction
open), then record each request (audit log, `scale_target`, event `<prefix>.events.cluster.<c>.scaled`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from controlplane.core.capacity import FleetCapacity
from controlplane.core.decision import PendingKind
from controlplane.core.placement import Placement
from controlplane.core.placement.partial import at_counts, full_counts
from controlplane.core.snapshot import Snapshot
from controlplane.domain.model import Cluster, Node, NodePool, Workload
from controlplane.service.cloud_ports import CloudProvider
from controlplane.service.cloud_state import CloudClusterRecord, CloudPoolRecord
from controlplane.service.events import envelope
from controlplane.service.fleet_sync import cluster_subject, locator_of
from controlplane.service.ports import UnitOfWorkFactory

log = logging.getLogger(__name__)

DEFAULT_COOLDOWN = 600.0
# A scale request the cloud has not matched after this long is forgotten (superseded by someone else's
# resize, or stuck): its nodes stop counting as coming, and the pool may be asked again.
DEFAULT_REQUEST_TTL = 900.0
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


def _extra_nodes(pool: NodePool, start: int, count: int) -> list[Node]:
    return [Node(f"{pool.id}+{i}", pool.cluster_id, pool.id, f"{pool.name}+{i}") for i in range(start, start + count)]


def _forget_stale_request(rec: CloudPoolRecord, now: datetime, ttl: float) -> CloudPoolRecord:
    requested = rec.scale_requested_at
    if rec.scale_target is None or requested is None or now - requested <= timedelta(seconds=ttl):
        return rec
    return replace(rec, scale_target=None, scale_requested_at=None)


def nodes_at_max_size(nodes: Sequence[Node], pools: Iterable[CloudPoolRecord]) -> tuple[Node, ...]:
    """`nodes` plus, for every cloud pool with a `max_size`, empty hypothetical nodes up to that size: the
    fleet a gang could get once the autoscaler has grown every pool as far as it may (pure)."""
    count: dict[str, int] = {}
    for node in nodes:
        count[node.pool_id] = count.get(node.pool_id, 0) + 1
    grown = list(nodes)
    for rec in pools:
        if rec.max_size is None:
            continue
        have = count.get(rec.id, 0)
        grown.extend(
            Node(f"{rec.id}+max{i}", rec.cluster_id, rec.id, f"{rec.name}+max{i}") for i in range(have, rec.max_size)
        )
    return tuple(grown)


def decide(
    snapshot: Snapshot,
    reasons: Mapping[str, str],
    pools: Sequence[CloudPoolRecord],
    now: datetime,
    cooldown: float,
    request_ttl: float = DEFAULT_REQUEST_TTL,
) -> Plan:
    pools_by_id = snapshot.pools_by_id()
    clusters = {c.id: c for c in snapshot.clusters}
    records = {p.id: _forget_stale_request(p, now, request_ttl) for p in pools if p.id in pools_by_id}
    # The scheduler's capacity model: free capacity with the live runs' taken.
    fleet = FleetCapacity(snapshot.clusters, snapshot.nodes)
    for run in snapshot.live_runs:
        fleet.take(run.assignments)
    # Nodes already requested (scale_target above the size) count as coming.
    planned: dict[str, int] = {}
    coming: dict[str, list[Node]] = {}
    for rec in records.values():
        pool = pools_by_id[rec.id]
        size = max(rec.node_count, rec.scale_target or 0)
        planned[rec.id] = size
        coming[rec.id] = _extra_nodes(pool, 0, size - rec.node_count)
    fleet = fleet.with_nodes(coming)

    decisions: list[ScaleDecision] = []
    wanted: set[str] = set()  # pools a waiting gang counts on
    for workload in snapshot.pending:
        if reasons.get(workload.id) not in (PendingKind.NO_FIT, PendingKind.NEVER_FITS):
            continue
        growth: Growth | None = None
        for target in _buying_targets(workload):
            fits_now = fleet.fits(target).placements
            if fits_now:
                break
            growth = _grow_one_pool(target, clusters, records, pools_by_id, planned, fleet)
            if growth is None:  # no single pool can hold it: grow several pools of one cluster, cheapest first
                growth = _grow_several_pools(target, clusters, records, pools_by_id, planned, fleet)
            if growth is not None:
                break
        if fits_now:
            fleet.take(fits_now[0].assignments)  # fits once nodes on their way arrive: no new request
            wanted.update(fleet.pool_of_node[a.node_id].id for a in fits_now[0].assignments)
            continue
        if growth is None:
            continue  # does not fit even with every pool at its max size: nothing to buy
        cluster, extra, placement = growth
        new_nodes = [(pool_id, nodes) for pool_id, nodes in extra.items() if nodes]
        fleet = fleet.with_nodes(dict(new_nodes))
        fleet.take(placement.assignments)
        added = ", ".join(f"{len(nodes)} in {pools_by_id[pool_id].name}" for pool_id, nodes in new_nodes)
        for pool_id, nodes in new_nodes:
            rec = records[pool_id]
            planned[pool_id] += len(nodes)
            wanted.add(pool_id)
            decisions.append(
                ScaleDecision(
                    pool_id=pool_id,
                    cluster=cluster.name,
                    pool=rec.name,
                    current=rec.node_count,
                    target=planned[pool_id],
                    direction="up",
                    reason=f"workload {workload.id} waits for room (no-fit); more nodes ({added}) hold it",
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


Growth = tuple[Cluster, dict[str, list[Node]], Placement]  # cluster, new nodes by pool id, the gang's placement


def _buying_targets(workload: Workload) -> tuple[Workload, ...]:
    """What to buy room for, in order: a gang whose pod sets have minimums at its full counts
    first, then as it may start (down to its minimums) when the pools' max sizes cannot hold it
    whole. Bought only its minimum, it would start partially, stop waiting and never grow: a
    run's counts are fixed once admitted (`placement.partial`)."""
    if not workload.reducible:
        return (workload,)
    return (at_counts(workload, full_counts(workload)), workload)


def _try_with(
    workload: Workload, cluster: Cluster, extra: Mapping[str, list[Node]], fleet: FleetCapacity
) -> Placement | None:
    """The gang's placement in `cluster` once the `extra` nodes exist (`fleet` is not modified):
    the scheduler's own fit question, asked of the grown fleet."""
    found = fleet.with_nodes(extra).fits(workload, (cluster,)).placements
    return found[0] if found else None


def _room(rec: CloudPoolRecord, planned: Mapping[str, int]) -> int:
    return 0 if rec.max_size is None else max(0, rec.max_size - planned[rec.id])


def _grow_one_pool(
    workload: Workload,
    clusters: Mapping[str, Cluster],
    records: Mapping[str, CloudPoolRecord],
    pools_by_id: Mapping[str, NodePool],
    planned: Mapping[str, int],
    fleet: FleetCapacity,
) -> Growth | None:
    """The fewest nodes in one pool that make the gang fit; of the pools that can, the cheapest per
    GPU-hour, then the one needing the fewest nodes, then by cluster and pool name."""
    best: tuple[tuple[float, int, str, str], Growth] | None = None
    for rec in records.values():
        pool = pools_by_id[rec.id]
        cluster = clusters[pool.cluster_id]
        coming = planned[rec.id] - rec.node_count
        for k in range(1, _room(rec, planned) + 1):
            extra = {rec.id: _extra_nodes(pool, coming, k)}
            found = _try_with(workload, cluster, extra, fleet)
            if found is not None:
                key = (pool.price_per_gpu_hour, k, cluster.name, pool.name)
                if best is None or key < best[0]:
                    best = (key, (cluster, extra, found))
                break
    return None if best is None else best[1]


def _grow_several_pools(
    workload: Workload,
    clusters: Mapping[str, Cluster],
    records: Mapping[str, CloudPoolRecord],
    pools_by_id: Mapping[str, NodePool],
    planned: Mapping[str, int],
    fleet: FleetCapacity,
) -> Growth | None:
    """For a gang no single pool can hold even at its max size: per cluster, add nodes one at a time to
    its growable pools, cheapest per GPU-hour first, until the gang fits; of the clusters where it does,
    the one whose added nodes cost least per hour."""
    best: tuple[tuple[float, int, str], Growth] | None = None
    for cluster in sorted(clusters.values(), key=lambda c: c.name):
        growable = sorted(
            (rec for rec in records.values() if rec.cluster_id == cluster.id and _room(rec, planned) > 0),
            key=lambda rec: (pools_by_id[rec.id].price_per_gpu_hour, rec.name),
        )
        if len(growable) < 2:
            continue  # one pool alone was tried already
        extra: dict[str, list[Node]] = {}
        found: Placement | None = None
        for rec in growable:
            pool = pools_by_id[rec.id]
            coming = planned[rec.id] - rec.node_count
            for _ in range(_room(rec, planned)):
                extra[rec.id] = _extra_nodes(pool, coming, len(extra.get(rec.id, [])) + 1)
                found = _try_with(workload, cluster, extra, fleet)
                if found is not None:
                    break
            if found is not None:
                break
        if found is None:
            continue
        cost = sum(len(n) * pools_by_id[p].price_per_gpu_hour * pools_by_id[p].gpus_per_node for p, n in extra.items())
        key = (cost, sum(len(n) for n in extra.values()), cluster.name)
        if best is None or key < best[0]:
            best = (key, (cluster, extra, found))
    return None if best is None else best[1]


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
    request_ttl: float = DEFAULT_REQUEST_TTL,
) -> list[ScaleOutcome]:
    with uow_factory() as uow:
        snapshot = uow.snapshots.load()
        reasons = uow.cloud.pending_kinds()
        pools = uow.cloud.cloud_pools()
        records: dict[str, CloudClusterRecord] = {r.name: r for r in uow.cloud.real_clusters()}
    now = clock()
    plan = decide(snapshot, reasons, pools, now, cooldown, request_ttl)
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


__all__ = ["Plan", "ScaleDecision", "ScaleOutcome", "autoscale_once", "decide", "nodes_at_max_size"]
