"""What one scheduling cycle sees, and what it decides. Plain values, no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from controlplane.domain.model import (
    Cluster,
    Node,
    NodePool,
    PodAssignment,
    QueueNode,
    Workload,
)


@dataclass(frozen=True)
class LiveRun:
    """A run that holds capacity (admitted, dispatching or running)."""

    workload_id: str
    queue_id: str
    cluster_id: str
    priority: int
    assignments: tuple[PodAssignment, ...]


@dataclass(frozen=True)
class Snapshot:
    clusters: tuple[Cluster, ...]
    nodes: tuple[Node, ...]
    queue_tree: Mapping[str, QueueNode]
    pending: tuple[Workload, ...]
    live_runs: tuple[LiveRun, ...] = ()

    def pools_by_id(self) -> dict[str, NodePool]:
        return {pool.id: pool for cluster in self.clusters for pool in cluster.pools}


@dataclass(frozen=True)
class Policy:
    """Knobs of the scheduling policy. The skeleton policy is priority, then FIFO."""

    name: str = "priority-fifo"
    # Try to keep a gang inside one node pool before spreading it over a cluster's pools.
    prefer_same_pool: bool = True


@dataclass(frozen=True)
class Admission:
    workload_id: str
    cluster_id: str
    assignments: tuple[PodAssignment, ...]


@dataclass(frozen=True)
class PendingReason:
    workload_id: str
    reason: str
    queue_position: int


@dataclass(frozen=True)
class Decision:
    admissions: tuple[Admission, ...] = ()
    pending: tuple[PendingReason, ...] = ()
    stats: Mapping[str, int] = field(default_factory=dict)


def usage_of(assignments: tuple[PodAssignment, ...], pools_by_node: Mapping[str, NodePool]) -> dict[str, Fraction]:
    """GPU-equivalents (and per GPU model) that a set of pod assignments holds."""
    usage: dict[str, Fraction] = {}
    for assignment in assignments:
        pool = pools_by_node[assignment.node_id]
        amount = gpu_eq_of_demand(assignment.demand, pool)
        if amount:
            usage["gpu-eq"] = usage.get("gpu-eq", Fraction(0)) + amount
            usage[pool.gpu_model] = usage.get(pool.gpu_model, Fraction(0)) + amount
    return usage


def gpu_eq_of_demand(demand: Mapping[str, int], pool: NodePool) -> Fraction:
    total = Fraction(demand.get("gpu", 0))
    if demand.get("share"):
        total += Fraction(demand["share"], pool.sharing.replicas)
    for key, count in demand.items():
        if key.startswith("mig:"):
            total += Fraction(int(key[4:].split("g", 1)[0]) * count, 7)
    return total
