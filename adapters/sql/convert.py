"""Rows <-> domain values."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Row

from adapters.sql.tables import ClusterRow, NodePoolRow, NodeRow, PodSetRow, PriorityClassRow, WorkloadRow
from controlplane.domain.model import (
    Cluster,
    Node,
    NodePool,
    PodSet,
    Taint,
    Toleration,
    Workload,
    WorkloadKind,
)
from controlplane.domain.sharing import SharingMode

_KINDS = {kind.value: kind for kind in WorkloadKind}  # a dict look-up, not an enum call, per row


def pool_from_row(row: NodePoolRow | Row[Any]) -> NodePool:
    """From an ORM row or a Core row that selects the same columns under the same names."""
    return NodePool(
        id=row.id,
        cluster_id=row.cluster_id,
        name=row.name,
        gpu_model=row.gpu_model,
        gpus_per_node=row.gpus_per_node,
        cpu_millis=row.cpu_millis,
        memory_mib=row.memory_mib,
        sharing=SharingMode.parse(row.sharing),
        taints=tuple(Taint(**t) for t in row.taints),
        labels=dict(row.labels),
        price_per_gpu_hour=row.price_per_gpu_hour,
        spot=row.spot,
        node_count=row.node_count,
        resource_names={str(k): str(v) for k, v in (row.resource_names or {}).items()},
        max_shares_per_pod=row.max_shares_per_pod or 0,
    )


def pool_to_row(pool: NodePool) -> NodePoolRow:
    return NodePoolRow(
        id=pool.id,
        cluster_id=pool.cluster_id,
        name=pool.name,
        gpu_model=pool.gpu_model,
        gpus_per_node=pool.gpus_per_node,
        cpu_millis=pool.cpu_millis,
        memory_mib=pool.memory_mib,
        sharing=str(pool.sharing),
        taints=[{"key": t.key, "value": t.value, "effect": t.effect} for t in pool.taints],
        labels=dict(pool.labels),
        price_per_gpu_hour=pool.price_per_gpu_hour,
        spot=pool.spot,
        node_count=pool.node_count,
        resource_names=dict(pool.resource_names),
        max_shares_per_pod=pool.max_shares_per_pod,
    )


def node_to_row(node: Node) -> NodeRow:
    return NodeRow(
        id=node.id, cluster_id=node.cluster_id, pool_id=node.pool_id, name=node.name, schedulable=node.schedulable
    )


def node_from_row(row: NodeRow) -> Node:
    return Node(row.id, row.cluster_id, row.pool_id, row.name, row.schedulable)


def cluster_from_row(row: ClusterRow) -> Cluster:
    return Cluster(row.id, row.name, row.provider, row.region, tuple(pool_from_row(p) for p in row.pools))


def pod_set_from_row(row: PodSetRow | Row[Any]) -> PodSet:
    return PodSet(
        name=row.name,
        replicas=row.replicas,
        gpus=row.gpus,
        mig_profile=row.mig_profile,
        gpu_fraction=row.gpu_fraction,
        cpu_millis=row.cpu_millis,
        memory_mib=row.memory_mib,
        gpu_models=tuple(row.gpu_models),
        min_replicas=row.min_replicas,
    )


def pod_set_dict(row: PodSetRow) -> dict[str, Any]:
    return {
        "name": row.name,
        "replicas": row.replicas,
        "gpus": row.gpus,
        "mig_profile": row.mig_profile,
        "gpu_fraction": row.gpu_fraction,
        "cpu_millis": row.cpu_millis,
        "memory_mib": row.memory_mib,
        "gpu_models": list(row.gpu_models),
        "min_replicas": row.min_replicas,
    }


def workload_from_row(row: WorkloadRow, priority_class: PriorityClassRow) -> Workload:
    return workload_from_columns(row, tuple(pod_set_from_row(p) for p in row.pod_sets), priority_class)


def workload_from_columns(
    row: WorkloadRow | Row[Any],
    pod_sets: tuple[PodSet, ...],
    priority_class: PriorityClassRow | Row[Any],
    tolerations: tuple[Toleration, ...] | None = None,
) -> Workload:
    """A workload from its columns (an ORM row, or a Core row selecting them under the same
    names), its pod sets read apart; `tolerations` when the caller has already parsed them."""
    return Workload(
        id=row.id,
        team_id=row.team_id,
        queue_id=row.queue_id,
        name=row.name,
        priority_class=row.priority_class,
        priority=row.priority,
        kind=_KINDS.get(row.kind) or WorkloadKind(row.kind),
        pod_sets=pod_sets,
        min_available=row.min_available,
        requires_isolation=row.requires_isolation,
        tolerations=tuple(Toleration(**t) for t in row.tolerations) if tolerations is None else tolerations,
        duration_seconds=row.duration_seconds,
        created_seq=row.created_seq,
        preemptible=priority_class.preemptible,
        min_runtime_seconds=priority_class.min_runtime_seconds,
        max_runtime_seconds=row.max_runtime_seconds,
        spot=row.spot,
        same_pool=row.same_pool,
    )
