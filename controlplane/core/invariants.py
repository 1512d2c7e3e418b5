"""Invariant checks over a decision; the scheduler runs them every cycle under a debug flag."""

from __future__ import annotations

import math
from collections.abc import Mapping

from controlplane.core.gpu_eq import GpuEqUnit
from controlplane.core.snapshot import Decision, Snapshot
from controlplane.domain.model import GPU_EQ, NodePool, QueueNode, Workload


class InvariantViolation(AssertionError):
    pass


def _chain(queue_id: str, tree: Mapping[str, QueueNode]) -> list[str]:
    chain: list[str] = []
    current: str | None = queue_id
    while current is not None and current in tree:
        chain.append(current)
        current = tree[current].parent_id
    return chain


def check_decision(snapshot: Snapshot, decision: Decision) -> None:
    """Raise InvariantViolation unless the decision keeps every invariant of the core:
    admit only pending gangs, once, whole (>= min_available distinct pods) and in one cluster, on
    schedulable nodes, without over-committing any node (slices and shares included) and without
    pushing any node of the queue tree that grew above its gpu-eq limit."""
    pools = snapshot.pools_by_id()
    pool_of_node: dict[str, NodePool] = {node.id: pools[node.pool_id] for node in snapshot.nodes}
    schedulable = {node.id for node in snapshot.nodes if node.schedulable}
    used: dict[str, dict[str, int]] = {}
    tree_usage: dict[str, int] = {}
    limits = {
        node_id: bound
        for node_id, node in snapshot.queue_tree.items()
        if (bound := node.limit.amounts.get(GPU_EQ)) is not None and math.isfinite(bound) and bound >= 0
    }
    unit = GpuEqUnit.for_fleet(pools.values(), limits.values())

    def hold(node_id: str, demand: Mapping[str, int]) -> None:
        bucket = used.setdefault(node_id, {})
        for key, amount in demand.items():
            bucket[key] = bucket.get(key, 0) + amount

    def charge(queue_id: str, amount: int) -> list[str]:
        chain = _chain(queue_id, snapshot.queue_tree)
        for node_id in chain:
            tree_usage[node_id] = tree_usage.get(node_id, 0) + amount
        return chain

    pending = {w.id: w for w in snapshot.pending}
    evicted = _check_evictions(snapshot, decision, pending)
    for run in snapshot.live_runs:
        if (run.run_id or run.workload_id) in evicted:
            continue
        for a in run.assignments:
            hold(a.node_id, a.demand)
        charge(run.queue_id, unit.usage(run.assignments, pool_of_node).get(GPU_EQ, 0))

    seen: set[str] = set()
    grown: set[str] = set()
    for admission in decision.admissions:
        workload = pending.get(admission.workload_id)
        if workload is None or admission.workload_id in seen:
            raise InvariantViolation(f"admitted {admission.workload_id} twice or while not pending")
        seen.add(admission.workload_id)
        pods = {(a.pod_set, a.index) for a in admission.assignments}
        if len(pods) != len(admission.assignments):
            raise InvariantViolation(f"gang {workload.id} places the same pod twice")
        if len(pods) < workload.min_available:
            raise InvariantViolation(f"gang {workload.id} admitted with fewer than min_available pods")
        _check_pod_sets(workload, pods)
        if admission.lent_to is not None and (not workload.preemptible or admission.lent_to not in pending):
            raise InvariantViolation(f"gang {workload.id} borrows reserved capacity it could not give back")
        clusters = {pool_of_node[a.node_id].cluster_id for a in admission.assignments}
        if clusters != {admission.cluster_id}:
            raise InvariantViolation(f"gang {workload.id} spans clusters {sorted(clusters)}")
        for a in admission.assignments:
            if a.node_id not in schedulable:
                raise InvariantViolation(f"gang {workload.id} placed on unschedulable node {a.node_id}")
            hold(a.node_id, a.demand)
        grown.update(charge(workload.queue_id, unit.usage(admission.assignments, pool_of_node).get(GPU_EQ, 0)))

    for node_id, bucket in used.items():
        capacity = pool_of_node[node_id].node_capacity()
        for key, amount in bucket.items():
            if amount > capacity.get(key, 0):
                raise InvariantViolation(f"node {node_id} over-committed on {key}: {amount} > {capacity.get(key, 0)}")
    for node_id in grown:
        bound = limits.get(node_id)
        if bound is not None and tree_usage[node_id] > unit.of_amount(bound):
            raise InvariantViolation(f"{snapshot.queue_tree[node_id].name} above its gpu-eq limit")


def _check_pod_sets(workload: Workload, pods: set[tuple[str, int]]) -> None:
    """Every pod is one the gang asked for (a known pod set, an index below its replicas), and a
    gang with per-pod-set minimums has at least each set's minimum."""
    replicas = {ps.name: ps.replicas for ps in workload.pod_sets}
    for name, index in pods:
        if name not in replicas or not 0 <= index < replicas[name]:
            raise InvariantViolation(f"gang {workload.id} places pod {name}-{index}, which it does not have")
    if workload.reducible:
        for pod_set in workload.pod_sets:
            placed = sum(1 for name, _ in pods if name == pod_set.name)
            if placed < pod_set.least:
                below = f"{placed} pods of {pod_set.name}, below its minimum {pod_set.least}"
                raise InvariantViolation(f"gang {workload.id} admitted with {below}")


def _check_evictions(snapshot: Snapshot, decision: Decision, pending: Mapping[str, Workload]) -> set[str]:
    """Evictions stop live, preemptible runs, once each; priority preempts only inside a queue and
    only lower priority; reclaim takes only from other queues; a take-back only runs lent to the
    gang that takes them. Returns the evicted run keys."""
    runs = {run.run_id or run.workload_id: run for run in snapshot.live_runs}
    evicted: set[str] = set()
    for eviction in decision.evictions:
        key = eviction.run_id or eviction.workload_id
        run = runs.get(key)
        if run is None or key in evicted:
            raise InvariantViolation(f"eviction of {key}: not a live run, or evicted twice")
        evicted.add(key)
        if not run.preemptible:
            raise InvariantViolation(f"non-preemptible run {key} evicted")
        beneficiary = pending.get(eviction.beneficiary)
        if beneficiary is None:
            raise InvariantViolation(f"eviction of {key} names no pending beneficiary")
        if eviction.kind == "preempt" and (
            run.queue_id != beneficiary.queue_id or run.priority >= beneficiary.priority
        ):
            raise InvariantViolation(f"{key} preempted across queues or by equal or lower priority")
        if eviction.kind == "reclaim" and run.queue_id == beneficiary.queue_id:
            raise InvariantViolation(f"{key} reclaimed by its own queue")
        if eviction.kind == "rebalance" and (
            run.queue_id == beneficiary.queue_id or run.priority > beneficiary.priority
        ):
            raise InvariantViolation(f"{key} rebalanced away by its own queue or by lower priority")
        if eviction.kind == "idle" and not run.idle_reclaimable:
            raise InvariantViolation(f"{key} reclaimed as idle without the idle policy marking it")
        if eviction.kind == "take-back" and run.lent_to != beneficiary.id:
            raise InvariantViolation(f"{key} taken back by a gang it was not lent capacity by")
        if eviction.kind not in ("idle", "preempt", "reclaim", "rebalance", "take-back"):
            raise InvariantViolation(f"eviction of {key} has unknown kind {eviction.kind!r}")
    return evicted
