"""Invariant checks over a decision; the scheduler runs them every cycle under a debug flag."""

from __future__ import annotations

from fractions import Fraction

from controlplane.core.snapshot import Decision, Snapshot, usage_of
from controlplane.domain.model import GPU_EQ


class InvariantViolation(AssertionError):
    pass


def check_decision(snapshot: Snapshot, decision: Decision) -> None:
    pools = snapshot.pools_by_id()
    pool_of_node = {node.id: pools[node.pool_id] for node in snapshot.nodes}
    used: dict[str, dict[str, int]] = {}
    for run in snapshot.live_runs:
        for a in run.assignments:
            bucket = used.setdefault(a.node_id, {})
            for key, amount in a.demand.items():
                bucket[key] = bucket.get(key, 0) + amount
    pending = {w.id: w for w in snapshot.pending}
    queue_usage: dict[str, Fraction] = {}
    for run in snapshot.live_runs:
        queue_usage[run.queue_id] = queue_usage.get(run.queue_id, Fraction(0)) + usage_of(
            run.assignments, pool_of_node
        ).get(GPU_EQ, Fraction(0))
    seen: set[str] = set()
    grown: set[str] = set()
    for admission in decision.admissions:
        workload = pending.get(admission.workload_id)
        if workload is None or admission.workload_id in seen:
            raise InvariantViolation(f"admitted {admission.workload_id} twice or while not pending")
        seen.add(admission.workload_id)
        if len(admission.assignments) < workload.min_available:
            raise InvariantViolation(f"gang {workload.id} admitted with fewer than min_available pods")
        clusters = {pool_of_node[a.node_id].cluster_id for a in admission.assignments}
        if clusters != {admission.cluster_id}:
            raise InvariantViolation(f"gang {workload.id} spans clusters {sorted(clusters)}")
        for a in admission.assignments:
            bucket = used.setdefault(a.node_id, {})
            for key, amount in a.demand.items():
                bucket[key] = bucket.get(key, 0) + amount
        grown.add(workload.queue_id)
        queue_usage[workload.queue_id] = queue_usage.get(workload.queue_id, Fraction(0)) + usage_of(
            admission.assignments, pool_of_node
        ).get(GPU_EQ, Fraction(0))
    for node_id, bucket in used.items():
        capacity = pool_of_node[node_id].node_capacity()
        for key, amount in bucket.items():
            if amount > capacity.get(key, 0):
                raise InvariantViolation(f"node {node_id} over-committed on {key}: {amount} > {capacity.get(key, 0)}")
    for queue_id in grown:
        usage = queue_usage[queue_id]
        node = snapshot.queue_tree.get(queue_id)
        bound = node.limit.amounts.get(GPU_EQ) if node else None
        if bound is not None and usage > Fraction(bound).limit_denominator(10**6):
            raise InvariantViolation(f"queue {queue_id} above its gpu-eq limit")
