"""What one scheduling cycle sees, and what it decides. Plain values, no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from controlplane.core.decision import Admission, Decision, Eviction, PendingReason
from controlplane.core.history import UsageInterval
from controlplane.domain.model import (
    Cluster,
    Node,
    NodePool,
    PodAssignment,
    QueueNode,
    Workload,
)

# Decision types live in `decision.py`; re-exported for callers that know them from here.
__all__ = [
    "Admission",
    "Decision",
    "Eviction",
    "LiveRun",
    "PendingReason",
    "Policy",
    "Snapshot",
]


@dataclass(frozen=True)
class LiveRun:
    """A run that holds capacity (admitted, dispatching or running)."""

    workload_id: str
    queue_id: str
    cluster_id: str
    priority: int
    assignments: tuple[PodAssignment, ...]
    run_id: str = ""
    preemptible: bool = True
    started_at: datetime | None = None  # None until its pods run
    admitted_at: datetime | None = None
    min_runtime_seconds: int = 0
    idle: bool = False  # filled by idle-GPU detection: idle runs are evicted before busy ones
    # The idle policy reached its reclaim stage: any waiting gang that fits once it is gone may
    # take its GPUs, whatever queue or priority (the policy's exemptions already applied).
    idle_reclaimable: bool = False
    max_runtime_seconds: float | None = None  # declared bound: when its capacity is due back
    # Runs on capacity a reservation lent: the waiting gang (id) it was held for takes it back.
    lent_to: str | None = None

    def ends_by(self) -> datetime | None:
        started = self.started_at or self.admitted_at
        if self.max_runtime_seconds is None or started is None:
            return None
        return started + timedelta(seconds=self.max_runtime_seconds)


@dataclass(frozen=True)
class PendingDelta:
    """How a snapshot's pending gangs differ from those of the snapshot its source made before
    (`base`, compared by identity): a scheduler that kept the earlier ones applies these instead
    of comparing every gang."""

    base: tuple[Workload, ...]
    changed: tuple[Workload, ...]  # gangs new to the pending set, or re-read different
    removed: frozenset[str]  # ids of gangs no longer pending


@dataclass(frozen=True)
class Snapshot:
    clusters: tuple[Cluster, ...]
    nodes: tuple[Node, ...]
    queue_tree: Mapping[str, QueueNode]
    pending: tuple[Workload, ...]
    live_runs: tuple[LiveRun, ...] = ()
    # Recent consumption per run, for fair-share history (empty when the policy does not use it).
    usage_history: tuple[UsageInterval, ...] = ()
    # When the last rebalancing eviction happened, so the policy can rate-limit them across cycles.
    last_rebalance_at: datetime | None = None
    # What changed in `pending` since the source's previous snapshot, when the source knows it.
    pending_delta: PendingDelta | None = field(default=None, compare=False, repr=False)

    def pools_by_id(self) -> dict[str, NodePool]:
        return {pool.id: pool for cluster in self.clusters for pool in cluster.pools}


@dataclass(frozen=True)
class Policy:
    """Knobs of the scheduling policy. The skeleton policy is priority, then FIFO."""

    name: str = "gpufleet"
    # Try to keep a gang inside one node pool before spreading it over a cluster's pools.
    prefer_same_pool: bool = True
    # Order queues by weighted dominant share above guarantee (off: strict priority, then FIFO).
    fair_share: bool = True
    # Within a queue, higher priority may evict lower priority.
    preemption: bool = True
    # A queue below its guarantee may evict work other queues run on borrowed capacity.
    reclaim: bool = True
    # Most gangs evicted in one cycle.
    disruption_budget: int = 16
    # Of a queue's gangs that its limits let through at the start of a cycle, the first this many
    # (priority, then FIFO) are decided in that cycle; a blocked gang among its queue's first this
    # many is told what blocks it; the rest wait their turn behind them (`parking.py`).
    heads_per_queue: int = 16
    # A gang at the head of its queue that finds no room holds the nodes it waits for, so smaller
    # work cannot starve it; at most this many such reservations per cycle.
    max_reservations: int = 4
    # A reservation for a gang that would borrow may hold capacity other queues' unused guarantees
    # need (off: that idle guarantee is lent to borrowers instead, reclaimable later).
    reserve_idle_guarantee: bool = False
    # While a reservation waits, the capacity it holds is lent to preemptible gangs whose minimum
    # runtime ends by the time it is due; its owner takes it back (eviction kind `take-back`).
    lend_reserved: bool = True
    # How placements are scored (lower wins): free GPU slots left on the touched nodes, nodes left
    # partly used, and price per hour of the GPUs taken.
    fit_weight: float = 1.0
    fragmentation_weight: float = 2.0
    price_weight: float = 0.5
    # Per extra zone/rack a gang spans, and for a placement against the workload's spot preference.
    topology_weight: float = 4.0
    spot_weight: float = 100.0
    # Fair-share history: a queue's part of recent fleet consumption (decayed with this half-life)
    # is added, times this weight, to its current share when queues are ordered. 0 turns it off.
    usage_history_weight: float = 0.0
    usage_half_life_seconds: float = 4 * 3600.0
    # Opt-in: evict equal- or lower-priority work of queues above their fair share so a queue with
    # a lower share gets capacity, even above its own guarantee. Rate-limited: at most this many
    # evictions per cycle, and none within `rebalance_interval_seconds` of the last one.
    rebalance: bool = False
    rebalance_max_per_cycle: int = 1
    rebalance_interval_seconds: float = 600.0
