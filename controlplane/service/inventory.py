"""Node inventory reported by clusters on `<prefix>.cluster.<cluster>.inventory`.

A report lists the cluster's nodes as the cluster sees them. For every node the fleet already knows
by name, `schedulable` becomes `node.schedulable and node.ready`: a cordoned or NotReady node takes no
new work, while runs already on it are left alone. Nodes the fleet does not know are reported back,
never created (pools and their nodes come from fleet sync).

Reports can arrive out of order. The `observed_at` of the last applied report of a cluster is kept in
that cluster's `kube_settings` under `INVENTORY_MARK` (no schema change; the composition root drops
the key before building the cluster's Kubernetes settings). A report not newer than it is ignored,
and so is one stamped more than `MAX_CLOCK_SKEW` after the control plane's clock (it would hold back
every later report).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pydantic import AwareDatetime, Field

from controlplane.core.decision import EndCause
from controlplane.domain.model import WorkloadState
from controlplane.domain.resource_names import ResourceOverrides, unadvertised
from controlplane.domain.sharing import SharingMode
from controlplane.service.audit_records import NodePods
from controlplane.service.cloud_ports import DiscoveredPool
from controlplane.service.cloud_state import PoolChanges
from controlplane.service.cluster_specs import CLOUD_PROVIDERS
from controlplane.service.constraints import Strict
from controlplane.service.events import emit, envelope

# Re-exported: adapters and fleet sync know it from here.
from controlplane.service.inventory_node import InventoryNode as InventoryNode  # noqa: PLC0414
from controlplane.service.node_pools import CLOUD_ISSUE, NodePlan, plan_node_pools
from controlplane.service.ports import UnitOfWork
from controlplane.service.views import PoolView

INVENTORY_MARK = "inventory_observed_at"
CLOUD_POOLS_MARK = "cloud_pools"  # names of the pools the last fleet sync found in the cloud
LIVE_RUN_STATES = ("admitted", "dispatching", "running")
LIVE_WORKLOAD_STATES = (WorkloadState.ADMITTED, WorkloadState.DISPATCHING, WorkloadState.RUNNING)
MAX_CLOCK_SKEW = timedelta(minutes=5)


def inventory_subject(prefix: str, cluster: str) -> str:
    return f"{prefix}.cluster.{cluster}.inventory"


class InventoryReport(Strict):
    """What a cluster (its agent, the control plane's own watcher, or a simulation) says about its nodes."""

    observed_at: AwareDatetime = Field(strict=False)  # an ISO 8601 string in JSON, parsed here
    nodes: list[InventoryNode] = Field(max_length=10_000)


def inventory_msg_id(cluster: str, observed_at: datetime) -> str:
    return f"inventory:{cluster}:{int(observed_at.timestamp() * 1000)}"


def apply_inventory(uow: UnitOfWork, cluster: str, report: InventoryReport, now: datetime, prefix: str) -> str:
    """Apply one report inside the caller's transaction; returns what happened, for logs and tests."""
    view = uow.admin.get_cluster(cluster)
    if view is None:
        return "unknown cluster"
    if report.observed_at > now + MAX_CLOCK_SKEW:
        return "report from the future ignored"  # it would hold back every later report
    last = view.kubernetes.get(INVENTORY_MARK)
    if isinstance(last, str) and datetime.fromisoformat(last) >= report.observed_at:
        return f"stale report (last applied {last})"
    mark = {INVENTORY_MARK: report.observed_at.isoformat()}
    if view.provider == "sim":
        # A simulated cluster's nodes are its registration's; the report only says which take work.
        wanted = {node.name: node.schedulable and node.ready for node in report.nodes}
        changed, unknown = uow.admin.apply_node_schedulable(view.id, wanted, mark)
        result = f"{changed} nodes changed"
        if unknown:
            result += f"; unknown nodes: {_shown(unknown)}"
        return result
    known = [n.name for p in view.pools for n in p.nodes]
    if not report.nodes and known:
        # A cluster does not lose every node between two lists; an empty list is a broken reader.
        return "empty report ignored (the cluster had nodes)"
    # Between two fleet syncs, what the last one learnt from the cloud is joined again; pools only the
    # nodes know (a Karpenter node pool, one the cloud has not described yet) stay node-only.
    cloud_known = view.kubernetes.get(CLOUD_POOLS_MARK)
    known_to_cloud = set(cloud_known) if isinstance(cloud_known, list) else set()
    cloud = tuple(_stored_cloud_pool(p) for p in view.pools if p.name in known_to_cloud)
    plan = plan_node_pools(
        report.nodes,
        cloud if view.provider in CLOUD_PROVIDERS else (),
        view.pool_prices,
        one_share_per_container=bool(view.kubernetes.get("fail_requests_greater_than_one", False)),
    )
    cloud_issues = [i for i in view.pool_issues if i.startswith(CLOUD_ISSUE)]
    # Names the cluster's settings override that these nodes do not advertise: shown with the
    # cluster (its pods there would stay Pending), as PATCH refuses them for pools already known.
    overrides = ResourceOverrides.of(view.kubernetes)
    unoffered = [
        problem
        for pool in plan.pools
        for problem in unadvertised(
            pool.spec.name, SharingMode.parse(pool.spec.sharing).kind, pool.resource_names, overrides
        )
    ]
    issues = list(dict.fromkeys([*plan.issues, *unoffered, *cloud_issues]))
    outcome = apply_node_plan(uow, view.id, view.name, known, report.nodes, plan, issues, now, prefix, mark)
    # What the audit reads about non-GPU pods on GPU nodes: this report's, replacing the last one's (a
    # node whose pods were not listed this time is forgotten rather than shown with stale pods).
    uow.audit_facts.put_node_pods(
        view.id,
        {
            n.name: NodePods(n.non_gpu_pods.count, tuple(n.non_gpu_pods.sample))
            for n in report.nodes
            if n.non_gpu_pods is not None and n.has_gpus
        },
        now,
    )
    if outcome.changes.changed:
        c = outcome.changes
        data = {
            "cluster": view.name,
            "provider": view.provider,
            "source": "nodes",
            "pools": {p.spec.name: p.spec.node_count for p in plan.pools},
            "added": list(c.added),
            "removed": list(c.removed),
            "resized": [{"pool": p, "from": a, "to": b} for p, a, b in c.resized],
            "issues": issues,
        }
        event_id, payload = envelope("cluster.synced", data, now)
        uow.outbox.add(f"{prefix}.events.cluster.{view.name}.synced", event_id, payload, now)
    return outcome.describe()


@dataclass(frozen=True)
class NodePlanOutcome:
    changes: PoolChanges
    schedulable_changed: int
    requeued: tuple[str, ...]

    def describe(self) -> str:
        c = self.changes
        parts = [f"{self.schedulable_changed} nodes changed"]
        if c.added or c.removed or c.resized:
            parts.append(f"pools added {list(c.added)} removed {list(c.removed)} resized {len(c.resized)}")
        if self.requeued:
            parts.append(f"runs requeued (node lost): {', '.join(self.requeued)}")
        return "; ".join(parts)


def apply_node_plan(
    uow: UnitOfWork,
    cluster_id: str,
    cluster: str,
    known: Sequence[str],
    nodes: Sequence[InventoryNode],
    plan: NodePlan,
    issues: Sequence[str],
    now: datetime,
    prefix: str,
    kube_settings: Mapping[str, Any],
    cloud_synced: bool = False,
) -> NodePlanOutcome:
    """Make the cluster's pools and nodes what its node list says, in the caller's transaction.

    Pools and node membership follow `plan`; a node takes new work when it is not cordoned, Ready, and
    agrees with its pool. A live run that holds a node the list no longer has is ended the way the gang
    start timeout ends one: the run becomes `preempted` (ended by gpufleet) with a `node-lost:` message,
    its objects are torn down by the dispatcher, and its workload goes back to its queue
    (`workload.requeued` event, `reason` starting with `node-lost:`).
    """
    present = {n.name for n in nodes}
    vanished = sorted(set(known) - present)
    lost_runs = uow.cloud.live_runs_on_nodes(cluster_id, vanished)
    # The workloads of the runs this may end are locked before any node or pool: a scheduler
    # admitting onto these nodes holds its workloads first too (the one lock order).
    uow.workloads.lock(of_runs=[lost.run_id for lost in lost_runs])
    changes = uow.cloud.sync_pools(cluster_id, plan.pools, issues, now, cloud_synced=cloud_synced)
    # A node that is in no pool of the plan (its GPUs vanished, its pool could not be built) but that a
    # run still holds keeps its row; it takes no new work.
    planned = {name for pool in plan.pools for name in pool.node_names}
    wanted = {n.name: n.schedulable and n.ready and n.name in planned and n.name not in plan.held_back for n in nodes}
    changed, _ = uow.admin.apply_node_schedulable(cluster_id, wanted, kube_settings)
    requeued: list[str] = []
    for lost in lost_runs:
        reason = f"{EndCause.NODE_LOST}: node {lost.node} left cluster {cluster}"
        if not uow.runs.set_state(lost.run_id, LIVE_RUN_STATES, "preempted", reason, now, cause=EndCause.NODE_LOST):
            continue
        uow.workloads.set_state(lost.workload_id, LIVE_WORKLOAD_STATES, WorkloadState.QUEUED, reason, now)
        emit(
            uow,
            prefix,
            lost.queue,
            "requeued",
            lost.workload_id,
            now,
            run_id=lost.run_id,
            cluster=cluster,
            reason=reason,
        )
        requeued.append(lost.run_id)
    return NodePlanOutcome(changes, changed, tuple(requeued))


def _stored_cloud_pool(pool: PoolView) -> DiscoveredPool:
    """What the last fleet sync stored about a cloud pool, for joining with the nodes in between syncs."""
    return DiscoveredPool(
        name=pool.name,
        gpu_model=pool.gpu_model,
        gpus_per_node=pool.gpus_per_node,
        instance_type=pool.instance_type,
        sharing=pool.sharing,
        cpu_millis=pool.cpu_millis,
        memory_mib=pool.memory_mib,
        taints=(),
        labels={},
        node_count=pool.node_count,
        min_size=pool.min_size,
        max_size=pool.max_size,
        spot=pool.spot,
        pool_id=pool.cloud_pool_id,
    )


def _shown(names: Sequence[str]) -> str:
    shown = ", ".join(sorted(names)[:20])
    return shown + (f" and {len(names) - 20} more" if len(names) > 20 else "")
