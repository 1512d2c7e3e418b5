"""Fleet sync: what the clouds say about registered clusters becomes gpufleet's pools and nodes.

Cloud calls never run inside a transaction: `discover` (and the optional node listing through the
cluster's Kubernetes API) happen first, then one short transaction replaces the cluster's pools by
diff (`CloudRepository.sync_pools`). Pools that cannot be mapped (no GPUs, unknown instance type, ...)
are recorded as issues on the cluster, visible in `GET /v1/clusters`. A cluster registered through
the API is `pending` until its first sync; after that it is synced again every `interval` seconds so
pool sizes follow the cloud autoscaler (and gpufleet's own scale requests).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from controlplane.service.cloud_ports import (
    CloudProvider,
    ClusterLocator,
    DiscoveredCluster,
    UnmappablePool,
    to_pool_spec,
)
from controlplane.service.cloud_state import CloudClusterRecord, PoolChanges, SyncedPool
from controlplane.service.events import envelope
from controlplane.service.inventory import CLOUD_POOLS_MARK, InventoryNode, apply_node_plan
from controlplane.service.node_pools import CLOUD_ISSUE, plan_node_pools
from controlplane.service.ports import UnitOfWorkFactory

log = logging.getLogger(__name__)

# The cluster's nodes, read from its Kubernetes API; None while no API client for it exists yet.
NodeLister = Callable[[CloudClusterRecord], Awaitable[Sequence[InventoryNode] | None]]
ProviderFor = Callable[[str], CloudProvider]


def cluster_subject(prefix: str, cluster: str, event: str) -> str:
    return f"{prefix}.events.cluster.{cluster}.{event}"


def locator_of(record: CloudClusterRecord) -> ClusterLocator:
    return ClusterLocator(
        provider=record.provider,
        account=record.account,
        region=record.region,
        cluster=record.cloud_cluster,
        resource_group=record.resource_group,
        cluster_id=record.cloud_cluster_id,
    )


def plan_pools(
    record: CloudClusterRecord,
    discovered: DiscoveredCluster,
    node_names: Mapping[str, Sequence[str]] | None,
) -> tuple[list[SyncedPool], list[str]]:
    """The pools a discovery result becomes, and why the others were left out (pure)."""
    pools: list[SyncedPool] = []
    issues: list[str] = []
    for found in discovered.pools:
        try:
            spec = to_pool_spec(found)
        except UnmappablePool as exc:
            if found.gpus_per_node > 0 or found.gpu_model or found.issues:
                issues.append(f"{CLOUD_ISSUE}{exc}")  # a GPU pool we cannot use is worth telling; CPU pools are not
            continue
        price = record.pool_prices.get(spec.name)
        if price is not None:
            spec = spec.model_copy(update={"price_per_gpu_hour": price})
        listed = node_names.get(spec.name) if node_names is not None else None
        if listed:
            names = tuple(sorted(listed))  # the real node names, which dispatched pods are pinned to
        else:  # not listed (yet): stable synthetic names, one per node the cloud reports
            names = tuple(f"{record.name}-{spec.name}-{i}" for i in range(spec.node_count))
        pools.append(
            SyncedPool(
                spec=spec,
                min_size=found.min_size,
                max_size=found.max_size,
                instance_type=found.instance_type,
                cloud_pool_id=found.pool_id,
                node_names=names,
            )
        )
    return pools, issues


@dataclass(frozen=True)
class SyncResult:
    cluster: str
    ok: bool
    changes: PoolChanges = field(default_factory=PoolChanges)
    error: str = ""


async def sync_cluster(
    uow_factory: UnitOfWorkFactory,
    provider: CloudProvider,
    record: CloudClusterRecord,
    prefix: str,
    clock: Callable[[], datetime],
    node_lister: NodeLister | None = None,
) -> SyncResult:
    try:
        discovered = await asyncio.to_thread(provider.discover, locator_of(record))
    except Exception as exc:  # any cloud failure: recorded on the cluster, retried next pass
        error = f"{type(exc).__name__}: {exc}"
        log.warning("fleet sync of %s failed: %s", record.name, error, extra={"cluster": record.name})
        with uow_factory() as uow:
            uow.cloud.sync_failed(record.id, error)
            uow.commit()
        return SyncResult(record.name, False, error=error)
    nodes: Sequence[InventoryNode] | None = None
    if node_lister is not None:
        try:
            nodes = await node_lister(record)
        except Exception as exc:
            nodes, error = None, f"{type(exc).__name__}: {exc}"
        else:
            error = "no Kubernetes API client for the cluster yet"
        if nodes is None:
            # The cloud alone would make up node names that pods cannot be pinned to: keep what we have.
            log.warning(
                "nodes of %s not readable (%s); sync retried", record.name, error, extra={"cluster": record.name}
            )
            with uow_factory() as uow:
                uow.cloud.sync_failed(record.id, f"nodes not readable: {error}")
                uow.commit()
            return SyncResult(record.name, False, error=error)
    now = clock()
    if nodes is not None:
        return _sync_from_nodes(uow_factory, record, discovered, nodes, prefix, now)
    pools, issues = plan_pools(record, discovered, None)
    with uow_factory() as uow:
        changes = uow.cloud.sync_pools(record.id, pools, issues, now)
        if changes.changed or record.sync_state != "ready":
            data = {
                "cluster": record.name,
                "provider": record.provider,
                "pools": {p.spec.name: p.spec.node_count for p in pools},
                "added": list(changes.added),
                "removed": list(changes.removed),
                "resized": [{"pool": p, "from": a, "to": b} for p, a, b in changes.resized],
                "issues": issues,
            }
            event_id, payload = envelope("cluster.synced", data, now)
            uow.outbox.add(cluster_subject(prefix, record.name, "synced"), event_id, payload, now)
        uow.commit()
    return SyncResult(record.name, True, changes)


def _synced_event(
    record: CloudClusterRecord, pools: Sequence[SyncedPool], changes: PoolChanges, issues: Sequence[str], now: datetime
) -> tuple[str, str]:
    data = {
        "cluster": record.name,
        "provider": record.provider,
        "pools": {p.spec.name: p.spec.node_count for p in pools},
        "added": list(changes.added),
        "removed": list(changes.removed),
        "resized": [{"pool": p, "from": a, "to": b} for p, a, b in changes.resized],
        "issues": list(issues),
    }
    return envelope("cluster.synced", data, now)


def _sync_from_nodes(
    uow_factory: UnitOfWorkFactory,
    record: CloudClusterRecord,
    discovered: DiscoveredCluster,
    nodes: Sequence[InventoryNode],
    prefix: str,
    now: datetime,
) -> SyncResult:
    """Pools from the cluster's nodes, joined with the cloud's description by pool name or id."""
    plan = plan_node_pools(
        nodes,
        discovered.pools,
        record.pool_prices,
        one_share_per_container=bool(record.kube_settings.get("fail_requests_greater_than_one", False)),
    )
    with uow_factory() as uow:
        view = uow.admin.get_cluster(record.id)
        known = [n.name for p in view.pools for n in p.nodes] if view is not None else []
        outcome = apply_node_plan(
            uow,
            record.id,
            record.name,
            known,
            nodes,
            plan,
            plan.issues,
            now,
            prefix,
            {CLOUD_POOLS_MARK: sorted(p.name for p in discovered.pools)},
            cloud_synced=True,
        )
        if outcome.changes.changed or record.sync_state != "ready":
            event_id, payload = _synced_event(record, plan.pools, outcome.changes, plan.issues, now)
            uow.outbox.add(cluster_subject(prefix, record.name, "synced"), event_id, payload, now)
        uow.commit()
    return SyncResult(record.name, True, outcome.changes)


def due(record: CloudClusterRecord, now: datetime, interval: float) -> bool:
    if not record.is_cloud:
        return False
    if record.sync_state != "ready" or record.synced_at is None:
        return True
    return record.synced_at + timedelta(seconds=interval) <= now


async def sync_due(
    uow_factory: UnitOfWorkFactory,
    provider_for: ProviderFor,
    prefix: str,
    clock: Callable[[], datetime],
    interval: float,
    node_lister: NodeLister | None = None,
) -> list[SyncResult]:
    """Sync every cloud cluster that is pending, failed, or last synced `interval` seconds ago."""
    with uow_factory() as uow:
        records = uow.cloud.real_clusters()
    now = clock()
    results: list[SyncResult] = []
    for record in records:
        if not due(record, now, interval):
            continue
        try:
            provider = provider_for(record.provider)
        except Exception as exc:  # an SDK missing or misconfigured: say so on the cluster
            with uow_factory() as uow:
                uow.cloud.sync_failed(record.id, f"no {record.provider} provider: {exc}")
                uow.commit()
            results.append(SyncResult(record.name, False, error=str(exc)))
            continue
        results.append(await sync_cluster(uow_factory, provider, record, prefix, clock, node_lister))
    return results
